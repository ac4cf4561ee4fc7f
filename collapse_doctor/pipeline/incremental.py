"""Scan a growing run again, reading only what is new (what ``watch`` does every poll).

It composes the pipeline's steps (:mod:`collapse_doctor.pipeline.scan`) with what earlier polls kept:

- Scalar logs: a :class:`~collapse_doctor.io.logs.scalar_cache.ScalarCache` parses only the records appended to
  each event file or verl file log since the last read.
- Rollouts written one file per step (the per-step formats of :mod:`collapse_doctor.io.formats`: TRL
  ``completions_<step>.parquet``, verl ``<step>.jsonl``, NeMo-RL ``train_data_step<N>.jsonl``): each file is
  reduced to its per-step statistics once, when it appears (or changes); the run's series is the union of
  the files' series, and the detectors run on it.
- Canonical Parquet runs may spread a step over several files, so they are scanned again whole when a
  file was added or grew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis, RunSummary
from collapse_doctor.core.series import RunSeries
from collapse_doctor.engine.reduce import reduce_rollouts
from collapse_doctor.io.discovery import RunInputs
from collapse_doctor.io.formats import is_per_step
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.open import open_rollouts, read_scalar_log
from collapse_doctor.io.storage.remote import file_signature
from collapse_doctor.judge.algorithm import detect_algorithm
from collapse_doctor.judge.summary import rollout_summary, with_scalar_log
from collapse_doctor.pipeline.scan import (
    ScanHooks,
    ScanPlan,
    aggregation_phases,
    detect,
    plan_scan,
    scan_run,
    step_aggregation,
)


def _signature(path: Path) -> tuple[int, int, str]:
    return file_signature(path)  # objects in storage: size, mtime and ETag (from the listing, no request)


def merge_series(parts: Sequence[RunSeries]) -> RunSeries | None:
    """One series from the series of disjoint step sets (``None`` when their layouts differ)."""
    first = parts[0]
    if any(p.channels != first.channels or p.values.keys() != first.values.keys() for p in parts):
        return None
    steps = np.concatenate([p.steps for p in parts])
    order = np.argsort(steps, kind="stable")
    values = {name: np.concatenate([p.values[name] for p in parts])[order] for name in first.values}
    return RunSeries(steps=steps[order], channels=first.channels, pairs=first.pairs, values=values)


@dataclass
class _Part:
    """One per-step rollout file reduced: its size and mtime when read, its summary and its series."""

    signature: tuple[int, int, str]
    summary: RunSummary
    series: RunSeries
    aggregation: dict[int, str]
    """``{step: aggregation}`` of the file's ``aggregation`` column (empty without one)."""


class IncrementalScan:
    """Diagnoses the runs under ``paths`` again and again, reusing what earlier calls read."""

    def __init__(self) -> None:
        self.scalar_cache = ScalarCache()
        self._parts: dict[str, dict[Path, _Part]] = {}
        self.files_reduced = 0
        """Rollout files reduced to series so far (each once, unless it changed)."""

    def diagnose_runs(self, paths: Sequence[str | Path], options: ScanOptions | None = None) -> list[Diagnosis]:
        plan = plan_scan(paths, options)
        hooks = ScanHooks(scalar_cache=self.scalar_cache)
        out = []
        for run in plan.runs:
            merged = self._per_step(plan, run) if run.rollout_kind and is_per_step(run.rollout_kind) else None
            out.append(merged if merged is not None else scan_run(plan, run, hooks).diagnosis)
        return out

    def _reduce_file(self, plan: ScanPlan, run: RunInputs, path: Path, signature: tuple[int, int, str]) -> _Part:
        from collapse_doctor.engine.advantages import device_name

        alone = replace(run, rollout_files=[path], scalar_logs={})
        reader = open_rollouts(alone, plan.options.read, check_rewards_first=False)
        assert reader is not None  # a rollout kind always opens a reader
        device = device_name(plan.options.device)
        series = reduce_rollouts(reader, device)
        summary = rollout_summary(reader, series, algorithm=("unknown", ""), device=device)
        self.files_reduced += 1
        return _Part(signature, summary, series, step_aggregation(reader) or {})

    def _per_step(self, plan: ScanPlan, run: RunInputs) -> Diagnosis | None:
        parts = self._parts.setdefault(run.name, {})
        current = {p: _signature(p) for p in run.rollout_files}
        for gone in set(parts) - set(current):
            del parts[gone]
        for path, signature in current.items():
            if path not in parts or parts[path].signature != signature:
                parts[path] = self._reduce_file(plan, run, path, signature)
        done = [parts[p] for p in sorted(parts)]
        series = merge_series([part.series for part in done])
        if series is None:
            return None  # channels or columns changed between files: scan the run as a whole
        runs = [part.summary for part in done]
        dynamic = tuple(dict.fromkeys(c for r in runs for c in r.dynamic_weight_channels))
        labels = {step: label for part in done for step, label in part.aggregation.items()}
        (algorithm, source), phases, notes = aggregation_phases(
            labels, plan.options.algo, detect_algorithm(series, plan.options.algo, dynamic)
        )
        summary = RunSummary(
            sources=tuple(s for r in runs for s in r.sources),
            steps=series.num_steps,
            rollouts=sum(r.rollouts for r in runs),
            groups=sum(r.groups for r in runs),
            group_size_min=min(r.group_size_min for r in runs),
            group_size_max=max(r.group_size_max for r in runs),
            first_step=int(series.steps[0]) if series.num_steps else None,
            last_step=int(series.steps[-1]) if series.num_steps else None,
            channels=runs[0].channels,
            weights=runs[0].weights,
            algorithm=algorithm,
            algorithm_source=source,
            logged_advantage=all(r.logged_advantage for r in runs),
            device=runs[0].device,
            warnings=tuple(dict.fromkeys([*(w for r in runs for w in r.warnings), *notes])),
            weights_source=runs[0].weights_source,
            dynamic_weight_channels=dynamic,
            phases=phases,
        )
        scalars = read_scalar_log(run, self.scalar_cache)
        summary = with_scalar_log(summary, scalars, name=run.name if plan.named else None, has_rollouts=True)
        return detect(summary, series, scalars, plan.config, plan.codes)
