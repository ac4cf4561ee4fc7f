"""collapse-doctor inside a verl run: one more tracking backend, ``trainer.logger='[console,collapse_doctor]'``.

verl's :class:`verl.utils.tracking.Tracking` has a closed list of backends (``supported_backend``, a fixed chain of
``if "wandb" in default_backend: ...``) and no registry. Two hooks of verl's own bring this module into every verl
process before a trainer builds its ``Tracking``:

- the ``verl.plugins`` entry point that collapse-doctor's package declares (``import verl`` loads every entry point
  of that group, unless ``VERL_USE_EXTERNAL_PLUGINS=none``);
- ``VERL_USE_EXTERNAL_MODULES=collapse_doctor.integrations.verl`` (``import verl`` imports the modules it names).

Loaded, it wraps ``Tracking.__init__`` and ``Tracking.finish`` once (:func:`register`): a ``collapse_doctor`` entry in
the backend list is taken out before verl's own ``__init__`` runs, and a :class:`VerlMonitor` is added last to
``Tracking.logger``, so verl calls it after every other backend with the same ``(data, step)``.

Per step the monitor appends verl's numeric metrics to ``OUTPUT/verl_metrics.jsonl`` in verl's file-logger layout
(``{"step": N, "data": {...}}``) and diagnoses the run with the pipeline ``watch`` uses
(:class:`~collapse_doctor.pipeline.incremental.IncrementalScan`: the new lines only, each rollout dump reduced once):
that file, plus verl's ``trainer.rollout_data_dir/<step>.jsonl`` dumps when they are written, so
``collapse-doctor scan OUTPUT`` gives the same diagnosis. ``OUTPUT`` is ``collapse_doctor.output_dir``, else the
rollout dump directory, else ``trainer.default_local_dir/collapse_doctor``.

With ``fail_on`` it stops the run: :class:`CollapseDoctorStop` is raised from ``Tracking.log`` after every other
backend has the step's point (verl's loop does not catch it: the trainer, then ``ray.get`` in ``main_ppo``, fails
with the finding). Its own errors never reach the trainer: one :class:`CollapseDoctorWarning`, and the monitor
switches itself off.

This module imports without verl (``register()`` then does nothing) and imports nothing heavy until a monitor is
built.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import Finding, FindingKey, Severity, check_fail_on

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.pipeline.incremental import IncrementalScan

BACKEND = "collapse_doctor"
"""The name in verl's ``trainer.logger`` list."""
TESTED_VERL = ">=0.9,<0.10"
METRICS_FILE = "verl_metrics.jsonl"
"""The monitor's copy of verl's metrics, in verl's file-logger layout (a scalar log ``scan`` reads)."""
TRAINED_GROUPS_TAG = "collapse_doctor/trained_groups"
FILTER_ON_REWARD_TAG = "collapse_doctor/filter_on_reward"
"""1 when dynamic sampling filters on the trained reward (verl ``algorithm.filter_groups.metric=reward``), 0 when it
filters on another ``reward_extra_info`` field (``acc``, ...): written beside ``trained_groups``."""
VERL_REWARD_METRIC = "reward"
"""verl's filter metric that is the trained (pre-KL) reward itself (``FILTER_GROUPS_REWARD_METRIC``)."""
"""Groups in the trained batch (``data.train_batch_size``), written beside verl's metrics under filter_groups: verl
logs the groups it drops, not the ones it trains."""
CHECK_BUDGET = 0.01
"""The detectors run after a step only while their total time stays within this share of the training time."""
ENV_FAIL_ON = "COLLAPSE_DOCTOR_FAIL_ON"
CONFIG_KEYS = frozenset({"fail_on", "output_dir", "config", "check_every", "check_budget"})
"""The keys of the ``collapse_doctor`` section of verl's config (``+collapse_doctor.fail_on=critical``)."""
LOGGER = logging.getLogger("collapse_doctor")


class CollapseDoctorStop(RuntimeError):
    """A finding reached ``fail_on``: raised from verl's ``Tracking.log`` to stop the run."""


class CollapseDoctorWarning(UserWarning):
    """collapse-doctor's monitoring failed and switched itself off; training went on."""


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _number(value: Any) -> float | None:
    """A metric as a float (Python and NumPy numbers, one-element tensors), or None for anything else."""
    if isinstance(value, (bool, str, bytes, Mapping, list, tuple)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _training_point(data: Mapping[str, Any]) -> bool:
    """Whether verl logged a training step (not only the validation before training, at step 0)."""
    return any(key.startswith(("critic/", "actor/", "training/")) for key in data)


class VerlMonitor:
    """The ``collapse_doctor`` backend of verl's ``Tracking``: ``log(data, step)`` per step and ``finish()``.

    ``output_dir``: where ``verl_metrics.jsonl`` goes. ``rollout_dir``: verl's ``trainer.rollout_data_dir`` (its
    ``<step>.jsonl`` dumps join the diagnosis), or None. ``fail_on``: "info", "warning" or "critical" raises
    :class:`CollapseDoctorStop` at the first finding at or above it (None: never). ``config``: a collapse-doctor
    config file or :class:`~collapse_doctor.core.config.Config` (default: discovered from ``output_dir``, as
    ``scan`` does). ``trained_groups``: the trained batch in groups, logged beside the metrics (under
    filter_groups). ``check_every``: steps between checks; the checks also stay within ``check_budget`` of the
    training time, and one more runs at ``finish()``. ``print_finding``: called with each line printed (default
    stderr).
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        rollout_dir: str | Path | None = None,
        fail_on: str | None = None,
        config: Config | str | Path | None = None,
        trained_groups: int | None = None,
        filter_metric: str | None = None,
        check_every: int = 1,
        check_budget: float = CHECK_BUDGET,
        print_finding: Callable[[str], None] | None = _print_line,
        summary: bool = True,
    ) -> None:
        if int(check_every) < 1:
            raise UsageError(f"collapse_doctor.check_every={check_every}: must be at least 1", hint="1 is the default")
        if not 0 < check_budget <= 1:
            hint = f"check_budget={CHECK_BUDGET} (a share of the training time) is the default"
            raise UsageError(f"collapse_doctor.check_budget={check_budget}: must be in (0, 1]", hint=hint)
        self.fail_on = check_fail_on(fail_on, option="collapse_doctor.fail_on") if fail_on else None
        self.output_dir = Path(output_dir)
        self.rollout_dir = Path(rollout_dir) if rollout_dir else None
        self.config = config
        self.trained_groups = trained_groups
        self.filter_metric = filter_metric
        """The metric dynamic sampling filters groups on (verl ``algorithm.filter_groups.metric``), or None."""
        self.check_every = int(check_every)
        self.check_budget = check_budget
        self.print_finding = print_finding
        self.summary = summary
        self.metrics_path = self.output_dir / METRICS_FILE
        self.diagnosis: Diagnosis | None = None
        """The last check's diagnosis of the run so far."""
        self.stopped_by: list[Finding] = []
        """The findings that stopped the run (``fail_on``), if any."""
        self.error: str | None = None
        """Why the monitor switched itself off, if it did."""
        self.checks = 0
        self.check_seconds = 0.0
        self.steps_logged = 0
        self._last_check_step: int | None = None
        self._last_step: int | None = None
        self._started = time.perf_counter()
        self._reported: dict[FindingKey, Severity] = {}
        self._incremental: IncrementalScan | None = None
        self._finished = False
        self._stopped = False
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # Appended: a resumed run (a new process, the same directory) keeps the steps before its checkpoint.
        self._file = self.metrics_path.open("ab", buffering=0)

    @classmethod
    def from_verl_config(cls, project_name: str, experiment_name: str, config: Mapping[str, Any] | None) -> VerlMonitor:
        """The monitor a verl run asks for: ``config`` is the dict verl hands ``Tracking`` (the resolved trainer
        config); its ``collapse_doctor`` section (``+collapse_doctor.fail_on=critical`` on verl's command line) and
        ``COLLAPSE_DOCTOR_FAIL_ON`` give the options."""
        config = config or {}
        ours = dict(config.get(BACKEND) or {})
        unknown = sorted(set(ours) - CONFIG_KEYS)
        if unknown:
            raise UsageError(
                f"verl config: unknown key collapse_doctor.{unknown[0]}",
                hint=f"the collapse_doctor section takes {', '.join(sorted(CONFIG_KEYS))}",
            )
        trainer = dict(config.get("trainer") or {})
        rollout_dir = trainer.get("rollout_data_dir") or None
        output_dir = ours.get("output_dir") or rollout_dir
        if not output_dir:
            local = trainer.get("default_local_dir") or os.path.join("checkpoints", project_name, experiment_name)
            output_dir = os.path.join(str(local), BACKEND)
        algorithm = dict(config.get("algorithm") or {})
        filter_groups = dict(algorithm.get("filter_groups") or {})
        trained, metric = None, None
        if filter_groups.get("enable"):
            size = (config.get("data") or {}).get("train_batch_size")
            trained = int(size) if size else None
            metric = str(filter_groups.get("metric") or "") or None
        check_every, budget = ours.get("check_every", 1), ours.get("check_budget", CHECK_BUDGET)
        try:
            check_every, budget = int(check_every), float(budget)
        except (TypeError, ValueError):
            raise UsageError(
                f"verl config: collapse_doctor.check_every={check_every!r} / check_budget={budget!r}: not numbers",
                hint=f"check_every=1 and check_budget={CHECK_BUDGET} are the defaults",
            ) from None
        return cls(
            output_dir,
            rollout_dir=rollout_dir,
            fail_on=ours.get("fail_on") or os.environ.get(ENV_FAIL_ON) or None,
            config=ours.get("config"),
            trained_groups=trained,
            filter_metric=metric,
            check_every=check_every,
            check_budget=budget,
        )

    # -- verl's backend interface ---------------------------------------------------------------------------

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """One ``Tracking.log`` call: record the metrics, check the run, raise :class:`CollapseDoctorStop` on
        ``fail_on`` (once)."""
        if self.error is not None or self._finished:
            return
        failing = self._guarded("logging a step", lambda: self._log(data, int(step)))
        if failing and not self._stopped:
            self._stopped = True
            line = self._stop_line(int(step))
            self._say(line)
            raise CollapseDoctorStop(line)

    def finish(self) -> None:
        """The end of the run (``Tracking.finish``): close the metrics file, check every step once more, sum up."""
        if self._finished:
            return
        self._finished = True
        self._guarded("closing the metrics file", self._file.close)
        if self.error is None and self.steps_logged:
            self._guarded("checking the run", lambda: self.check(final=True))
            if self.summary:
                self._guarded("summing up", lambda: self._say(self._summary_line()))

    # -- what it does ---------------------------------------------------------------------------------------

    def _log(self, data: Mapping[str, Any], step: int) -> bool:
        values = {str(key): number for key, value in data.items() if (number := _number(value)) is not None}
        if self.trained_groups is not None and _training_point(values):
            values[TRAINED_GROUPS_TAG] = float(self.trained_groups)
        if self.filter_metric is not None and _training_point(values):
            values[FILTER_ON_REWARD_TAG] = float(self.filter_metric == VERL_REWARD_METRIC)
        record = {"step": step, "data": {k: v if math.isfinite(v) else None for k, v in values.items()}}
        self._file.write((json.dumps(record, allow_nan=False) + "\n").encode())
        self.steps_logged += 1
        self._last_step = step
        if not _training_point(values):
            return False
        due = self._last_check_step is None or step - self._last_check_step >= self.check_every
        elapsed = time.perf_counter() - self._started
        if not due or (self.checks and self.check_seconds > self.check_budget * elapsed):
            return False
        self.check()
        return bool(self.stopped_by)

    def inputs(self, *, final: bool = False) -> list[Path]:
        """What a check reads: the metrics file and the rollout dumps of the steps before the last one logged (verl
        may still be writing that step's; every dump at the end)."""
        paths = [self.metrics_path]
        if self.rollout_dir is not None and self.rollout_dir.is_dir():
            from collapse_doctor.io.rollouts.verl import FILE_NAME

            for path in sorted(self.rollout_dir.iterdir()):
                found = FILE_NAME.fullmatch(path.name)
                if found and (final or self._last_step is None or int(found.group(1)) < self._last_step):
                    paths.append(path)
        return paths

    def check(self, *, final: bool = False) -> Diagnosis:
        """Diagnose the run so far (scan's pipeline on :meth:`inputs`); print what is new; note what fails."""
        from collapse_doctor.core.findings import failing, news, withdrawn
        from collapse_doctor.core.options import ScanOptions
        from collapse_doctor.pipeline.incremental import IncrementalScan
        from collapse_doctor.pipeline.watch import finding_line, withdrawn_line

        started = time.perf_counter()
        if self._incremental is None:
            self._incremental = IncrementalScan()
        (diagnosis,) = self._incremental.diagnose_runs(self.inputs(final=final), ScanOptions(config=self.config))
        self.check_seconds += time.perf_counter() - started
        self.checks += 1
        self._last_check_step = self._last_step
        gone = withdrawn(self._reported, self.diagnosis.findings if self.diagnosis else (), diagnosis.findings)
        self.diagnosis = diagnosis
        for finding in gone:
            self._say(f"collapse-doctor: {withdrawn_line(diagnosis, finding)}")
        for finding in news(self._reported, diagnosis.findings):
            self._say(f"collapse-doctor: {finding_line(diagnosis, finding)}")
        if self.fail_on is not None and not self.stopped_by:
            self.stopped_by = failing(diagnosis.findings, self.fail_on)
        return diagnosis

    def _say(self, line: str | None) -> None:
        if line is not None and self.print_finding is not None:
            self.print_finding(line)

    def _stop_line(self, step: int) -> str:
        from collapse_doctor.core.text_safety import printable

        first = self.stopped_by[0]
        onset = f" (onset step {first.onset_step})" if first.onset_step is not None else ""
        more = f", and {len(self.stopped_by) - 1} more" if len(self.stopped_by) > 1 else ""
        return printable(
            f"collapse-doctor: stopping the verl run after step {step} (fail_on={self.fail_on}): {first.code} "
            f"{first.severity.label} {first.title}{onset}{more}; the last checkpoint is the last save_freq one; "
            f"details: collapse-doctor scan {self.output_dir}"
        )

    def _summary_line(self) -> str | None:
        from collapse_doctor.core.findings import VERDICTS, severity_counts
        from collapse_doctor.core.result import signal_sentence
        from collapse_doctor.core.text_safety import printable

        diagnosis = self.diagnosis
        if diagnosis is None:
            return None
        counts = severity_counts(f.severity for f in diagnosis.findings) or "no findings"
        steps = diagnosis.run.steps or len({int(s) for s in diagnosis.scalars.steps()} if diagnosis.scalars else ())
        signal = f"{signal_sentence(diagnosis.run.signal)}; " if diagnosis.run.signal else ""
        return printable(
            f"collapse-doctor: {VERDICTS[diagnosis.verdict]} after {steps:,} steps: {signal}{counts}; "
            f"full report: collapse-doctor report {self.output_dir} --html report.html"
        )

    # -- never break the training loop -----------------------------------------------------------------------

    def _guarded(self, what: str, body: Callable[[], Any]) -> Any:
        """``body()``, or None after reporting its exception once and switching the monitor off."""
        if self.error is not None:
            return None
        try:
            return body()
        except Exception as exc:  # never break the user's training loop
            detail = " ".join(str(exc).split())[:300]
            self.error = f"{what}: {type(exc).__name__}: {detail}"
            LOGGER.debug("collapse-doctor failed in %s", what, exc_info=exc)
            warnings.warn(
                f"collapse-doctor switched itself off ({self.error}); training goes on without it",
                CollapseDoctorWarning,
                stacklevel=3,
            )
            return None


def _monitor_for(project_name: str, experiment_name: str, config: Any) -> VerlMonitor | None:
    """The run's monitor; a config mistake is the user's error (raised: the run has not started), anything else
    ours (a warning, and the run goes on without collapse-doctor)."""
    try:
        return VerlMonitor.from_verl_config(project_name, experiment_name, config)
    except UsageError:
        raise
    except Exception as exc:
        warnings.warn(
            f"collapse-doctor could not start ({type(exc).__name__}: {exc}); training goes on without it",
            CollapseDoctorWarning,
            stacklevel=3,
        )
        return None


def register() -> bool:
    """Teach verl's ``Tracking`` the ``collapse_doctor`` backend (once per process); False when verl is missing.

    Wraps ``Tracking.__init__`` (the name is taken out of ``default_backend`` before verl's own ``__init__``,
    which asserts each name is in its closed list, and the monitor is added last to ``self.logger``) and
    ``Tracking.finish`` (verl's backends first, then the monitor's last check). Nothing changes for a run that does
    not name ``collapse_doctor``.
    """
    try:
        from verl.utils import tracking
    except Exception:  # verl missing, or not importable here: nothing to register
        return False
    cls: Any = tracking.Tracking
    if getattr(cls, "_collapse_doctor_registered", False):
        return True
    original_init, original_finish = cls.__init__, cls.finish

    @functools.wraps(original_init)
    def __init__(
        self: Any,
        project_name: str,
        experiment_name: str,
        default_backend: Any = "console",
        config: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        names = [default_backend] if isinstance(default_backend, str) else [str(n) for n in default_backend]
        others = [n for n in names if n != BACKEND]
        original_init(self, project_name, experiment_name, others, config, *args, **kwargs)
        if BACKEND in names:
            monitor = _monitor_for(project_name, experiment_name, config)
            if monitor is not None:
                self.logger[BACKEND] = monitor

    @functools.wraps(original_finish)
    def finish(self: Any, *args: Any, **kwargs: Any) -> None:
        monitor = None if getattr(self, "_finished", False) else getattr(self, "logger", {}).get(BACKEND)
        try:
            original_finish(self, *args, **kwargs)
        finally:
            if isinstance(monitor, VerlMonitor):
                monitor.finish()

    cls.__init__ = __init__
    cls.finish = finish
    if BACKEND not in cls.supported_backend:
        cls.supported_backend.append(BACKEND)
    cls._collapse_doctor_registered = True
    return True


def __getattr__(name: str) -> Any:
    # verl's plugin loader only looks the entry point up (`EntryPoint.load()`, no call): looking up
    # `verl_plugin` registers, even where this module was imported before verl.
    if name == "verl_plugin":
        register()
        return register
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if "verl" in sys.modules:  # imported by verl itself (VERL_USE_EXTERNAL_MODULES), or after it
    register()
