"""``scan``'s judgement of a run while it trains, from the reductions the monitor already made.

:class:`~collapse_doctor.integrations.rollouts.RolloutMonitor` reduces each part it writes once, by ``scan``'s own
path; :class:`LiveDiagnosis` merges those reductions and judges them with
:func:`collapse_doctor.pipeline.scan.diagnose_reduction`, the function every entry point judges a run with, so the
callback's diagnosis is the one ``scan OUTPUT/rollouts`` gives. Nothing is read back from disk: a check costs the
detectors' pass over the per-step series. Each finding is reported once, when it first appears, and again only when
its severity rises (as ``watch`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collapse_doctor.core.findings import Finding, FindingKey, Severity, check_fail_on, failing, news, withdrawn
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.pipeline.scan import ScanPlan, diagnose_reduction, resolve_config

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.integrations.rollouts import RolloutMonitor


@dataclass
class LiveCheck:
    """One check: the diagnosis of the run so far, the findings new since the last check, the failing ones."""

    diagnosis: Diagnosis
    new: list[Finding]
    failing: list[Finding]
    withdrawn: list[Finding] = field(default_factory=list)
    """Findings printed after an earlier check that this one no longer has (as ``watch`` withdraws them)."""


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
    last: Diagnosis | None = None
    _resolved: tuple[Config, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if self.fail_on is not None:
            self.fail_on = check_fail_on(self.fail_on, option="fail_on")

    def _config(self) -> tuple[Config, tuple[str, ...]]:
        if self._resolved is None:
            options = ScanOptions(config=self.config)
            self._resolved = resolve_config([self.monitor.rollouts_dir], options)
        return self._resolved

    def check(self) -> LiveCheck:
        """Run the detectors on every step reduced so far."""
        config, codes = self._config()
        plan = ScanPlan(
            paths=(str(self.monitor.rollouts_dir),),
            runs=(),
            options=ScanOptions(),
            config=config,
            codes=codes,
            named=False,
        )
        # The parts carry the trainer's weights in their metadata, so nothing is inferred (scan infers nothing either).
        diagnosis = diagnose_reduction(plan, self.monitor.reduction(), None).diagnosis
        self.checks += 1
        gone = withdrawn(self.reported, self.last.findings if self.last else (), diagnosis.findings)
        self.last = diagnosis
        new = news(self.reported, diagnosis.findings)
        stopping = failing(diagnosis.findings, self.fail_on) if self.fail_on else []
        return LiveCheck(diagnosis=diagnosis, new=new, failing=stopping, withdrawn=gone)
