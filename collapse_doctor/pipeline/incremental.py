"""Scan a growing run again, reading only what is new (what ``watch`` does every poll).

It composes the pipeline's steps (:mod:`collapse_doctor.pipeline.scan`) with what earlier polls kept:

- Scalar logs: a :class:`~collapse_doctor.io.logs.scalar_cache.ScalarCache` parses only the records appended to
  each event file or verl file log since the last read.
- Rollouts written one file per step (the per-step formats of :mod:`collapse_doctor.io.formats`: TRL
  ``completions_<step>.parquet``, verl ``<step>.jsonl``, NeMo-RL ``train_data_step<N>.jsonl``): each file is
  reduced once, when it appears (or changes), to a :class:`~collapse_doctor.core.reduction.RunReduction`; the
  run's reduction is their merge, judged by :func:`~collapse_doctor.pipeline.scan.diagnose_reduction` exactly as
  ``scan`` judges the whole run (weights inferred from the logged advantages reduce each file once more, once).
- Canonical Parquet runs may spread a step over several files, so they are scanned again whole when a
  file was added or grew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.reduction import RunReduction, merge_reductions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.engine.reduce import reduce_rollouts
from collapse_doctor.io.discovery import RunInputs
from collapse_doctor.io.formats import is_per_step
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.open import open_rollouts, read_scalar_log
from collapse_doctor.io.storage.remote import file_signature
from collapse_doctor.pipeline.scan import ScanHooks, ScanPlan, diagnose_reduction, plan_scan, reduction_of, scan_run

WeightsKey = tuple[tuple[str, float], ...] | None
"""The weights a file was reduced with (``None``: as the run's read options say)."""


@dataclass
class _Part:
    """One per-step rollout file: its size, mtime and ETag when read, and its reduction per set of weights."""

    signature: tuple[int, int, str]
    reductions: dict[WeightsKey, RunReduction] = field(default_factory=dict)


class IncrementalScan:
    """Diagnoses the runs under ``paths`` again and again, reusing what earlier calls read."""

    def __init__(self) -> None:
        self.scalar_cache = ScalarCache()
        self._parts: dict[str, dict[Path, _Part]] = {}
        self.files_reduced = 0
        """Rollout files reduced to series so far (each once per set of weights, unless it changed)."""

    def diagnose_runs(self, paths: Sequence[str | Path], options: ScanOptions | None = None) -> list[Diagnosis]:
        plan = plan_scan(paths, options)
        hooks = ScanHooks(scalar_cache=self.scalar_cache)
        out = []
        for run in plan.runs:
            merged = self._per_step(plan, run) if run.rollout_kind and is_per_step(run.rollout_kind) else None
            out.append(merged if merged is not None else scan_run(plan, run, hooks).diagnosis)
        return out

    def _reduce_file(self, plan: ScanPlan, run: RunInputs, path: Path, weights: WeightsKey) -> RunReduction:
        from collapse_doctor.engine.advantages import device_name

        read = plan.options.read if weights is None else replace(plan.options.read, weights=dict(weights))
        alone = replace(run, rollout_files=[path], scalar_logs={})
        reader = open_rollouts(alone, read, check_rewards_first=False)
        assert reader is not None  # a rollout kind always opens a reader
        device = device_name(plan.options.device)
        self.files_reduced += 1
        return reduction_of(reader, reduce_rollouts(reader, device), device)

    def _reductions(self, plan: ScanPlan, run: RunInputs, weights: WeightsKey) -> list[RunReduction]:
        """Every rollout file of the run reduced with ``weights`` (each file once per set of weights)."""
        parts = self._parts[run.name]
        out = []
        for path in sorted(parts):
            part = parts[path]
            if weights not in part.reductions:
                part.reductions[weights] = self._reduce_file(plan, run, path, weights)
            out.append(part.reductions[weights])
        return out

    def _per_step(self, plan: ScanPlan, run: RunInputs) -> Diagnosis | None:
        """The run judged on the merged reductions of its files (what ``scan`` of the whole run computes), or
        ``None`` when the files cannot be merged (channels or columns changed): then it is scanned whole."""
        parts = self._parts.setdefault(run.name, {})
        current = {p: file_signature(p) for p in run.rollout_files}
        for path in set(parts) - set(current):
            del parts[path]
        for path, signature in current.items():
            if path not in parts or parts[path].signature != signature:
                parts[path] = _Part(signature)
        try:
            merged = merge_reductions(self._reductions(plan, run, None))
        except InputError:
            # A file that cannot be judged alone (a step whose rewards are all NaN: "no finite reward") may be
            # fine as part of the run: read the run whole, as scan does.
            return None
        if merged is None:
            return None

        def reduce_with(weights: dict[str, float]) -> RunReduction:
            again = merge_reductions(self._reductions(plan, run, tuple(sorted(weights.items()))))
            assert again is not None  # the same files merged with the run's weights
            return again

        scalars = read_scalar_log(run, self.scalar_cache)
        judged = diagnose_reduction(
            plan,
            merged,
            scalars,
            name=run.name if plan.named else None,
            scalar_files=run.scalar_files(),
            set_aside=run.set_aside,
            run_notes=run.warnings,
            reduce_with=reduce_with,
        )
        return judged.diagnosis
