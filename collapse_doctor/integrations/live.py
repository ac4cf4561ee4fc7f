"""``scan``'s detectors on a run while it trains, from the series the monitor already reduced.

:class:`~collapse_doctor.integrations.rollouts.RolloutMonitor` reduces each part's steps once (the same
statistics ``scan`` computes from the part files); :class:`LiveDiagnosis` runs the selected detectors
(:func:`collapse_doctor.pipeline.scan.detect`) on the series of every step so far. Nothing is read back from
disk, so a check costs the detectors' pass over the per-step series, not a re-read of the rollouts.
Each finding is reported once, when it first appears, and again only when its severity rises (as
``watch`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collapse_doctor.core.findings import Finding, Severity, check_fail_on, failing
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis, RunSummary

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.integrations.rollouts import RolloutMonitor

WEIGHTS_SOURCE = "trainer reward_weights"
FindingKey = tuple[str, tuple[str, ...], str]


@dataclass
class LiveCheck:
    """One check: the diagnosis of the run so far, the findings new since the last check, the failing ones."""

    diagnosis: Diagnosis
    new: list[Finding]
    failing: list[Finding]


@dataclass
class LiveDiagnosis:
    """Diagnoses a monitored run again after each part, reporting what is new.

    ``fail_on`` ("info", "warning", "critical" or None) decides which findings are failing; ``config`` is a
    :class:`~collapse_doctor.core.config.Config`, a config file, or None (the ``[tool.collapse-doctor]`` or
    ``collapse-doctor.toml`` found from the output directory, as ``scan`` finds it).
    """

    monitor: RolloutMonitor
    fail_on: str | None = None
    config: Config | str | Path | None = None
    checks: int = 0
    reported: dict[FindingKey, Severity] = field(default_factory=dict)
    _resolved: tuple[Config, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if self.fail_on is not None:
            self.fail_on = check_fail_on(self.fail_on, option="fail_on")

    def _config(self) -> tuple[Config, tuple[str, ...]]:
        if self._resolved is None:
            from collapse_doctor.pipeline.scan import resolve_config

            options = ScanOptions(config=self.config)
            self._resolved = resolve_config([self.monitor.rollouts_dir], options)
        return self._resolved

    def summary(self) -> RunSummary:
        """The run so far as ``scan`` of its rollouts would summarise it."""
        monitor, totals = self.monitor, self.monitor.totals
        series = monitor.series()
        algo = "grpo" if monitor.algo == "grpo" else "gdpo"
        return RunSummary(
            sources=(str(monitor.rollouts_dir),),
            steps=series.num_steps,
            rollouts=totals.rollouts,
            groups=totals.groups,
            group_size_min=totals.group_size_min,
            group_size_max=totals.group_size_max,
            first_step=int(series.steps[0]) if series.num_steps else None,
            last_step=int(series.steps[-1]) if series.num_steps else None,
            channels=monitor.channels,
            weights={c: monitor.weights.get(c, 1.0) for c in monitor.channels},
            weights_source=WEIGHTS_SOURCE,
            algorithm=algo,
            algorithm_source=f"the trainer's aggregation ({monitor.algo})",
            logged_advantage=True,
            device="cpu",
            dynamic_weight_channels=monitor.channels if totals.dynamic_weights else (),
        )

    def check(self) -> LiveCheck:
        """Run the detectors on every step reduced so far."""
        from collapse_doctor.pipeline.scan import detect

        config, codes = self._config()
        diagnosis = detect(self.summary(), self.monitor.series(), None, config, codes)
        self.checks += 1
        new = []
        for finding in diagnosis.findings:
            key = (finding.code, finding.channels, finding.title)
            seen = self.reported.get(key)
            if seen is not None and finding.severity <= seen:
                continue
            self.reported[key] = finding.severity
            new.append(finding)
        stopping = failing(diagnosis.findings, self.fail_on) if self.fail_on else []
        return LiveCheck(diagnosis=diagnosis, new=new, failing=stopping)
