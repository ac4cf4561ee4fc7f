"""Scan a growing run again, reading only what is new (what ``watch`` does every poll).

- Scalar logs: a :class:`~collapse_doctor.io.sources.ScalarCache` parses only the records appended to
  each event file or verl file log since the last read.
- Rollouts written one file per step (TRL ``completions_<step>.parquet``, verl ``<step>.jsonl``, NeMo-RL
  ``train_data_step<N>.jsonl``): each file is reduced to its per-step statistics once, when it appears (or
  changes); the run's series is the union of the files' series, and the detectors run on it.
- Canonical Parquet runs may spread a step over several files, so they are scanned again whole when a
  file was added or grew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.diagnosis import (
    Diagnosis,
    RunSummary,
    detect_algorithm,
    diagnose,
    diagnosis_from_series,
    resolve_config,
)
from collapse_doctor.io.sources import RunInputs, ScalarCache, choose_run, discover_runs, read_scalar_log
from collapse_doctor.scalar_run import summary_extras
from collapse_doctor.series import RunSeries

PER_STEP_KINDS = ("trl_completions", "verl_rollouts", "nemo_rl")
_NO_DETECTORS = ["CD"]
"""``ignore`` that skips every detector: a file's own scan only reduces it to series."""


def _signature(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1)
    return stat.st_size, stat.st_mtime_ns


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
    signature: tuple[int, int]
    diagnosis: Diagnosis


class IncrementalScan:
    """Diagnoses the runs under ``paths`` again and again, reusing what earlier calls read."""

    def __init__(self) -> None:
        self.scalar_cache = ScalarCache()
        self._parts: dict[str, dict[Path, _Part]] = {}
        self.files_reduced = 0
        """Rollout files reduced to series so far (each once, unless it changed)."""

    def diagnose_runs(
        self, paths: Sequence[str | Path], *, run_name: str | None = None, **options: Any
    ) -> list[Diagnosis]:
        runs = discover_runs(paths)
        chosen = [choose_run(runs, run_name)] if run_name is not None else runs
        named = run_name is not None or len(runs) > 1
        out = []
        for run in chosen:
            merged = self._per_step(run, named, options) if run.rollout_kind in PER_STEP_KINDS else None
            if merged is None:
                merged = diagnose(
                    paths,
                    run_name=run.name if named else None,
                    scalar_cache=self.scalar_cache,
                    allow_empty=len(chosen) > 1,
                    **options,
                )
            out.append(merged)
        return out

    def _per_step(self, run: RunInputs, named: bool, options: dict[str, Any]) -> Diagnosis | None:
        parts = self._parts.setdefault(run.name, {})
        current = {p: _signature(p) for p in run.rollout_files}
        for gone in set(parts) - set(current):
            del parts[gone]
        file_options = {k: v for k, v in options.items() if k not in ("only", "ignore", "fail_on")}
        for path, signature in current.items():
            if path not in parts or parts[path].signature != signature:
                part = diagnose([path], ignore=_NO_DETECTORS, **file_options)
                parts[path] = _Part(signature, part)
                self.files_reduced += 1
        diagnoses = [parts[p].diagnosis for p in sorted(parts)]
        series = merge_series([d.series for d in diagnoses])
        if series is None:
            return None  # channels or columns changed between files: scan the run as a whole
        config, codes = resolve_config(
            run.files,
            options.get("config"),
            fail_on=options.get("fail_on"),
            only=options.get("only"),
            ignore=options.get("ignore"),
        )
        runs = [d.run for d in diagnoses]
        files = [s for r in runs for s in r.sources] if any(r.rollouts for r in runs) else []
        algorithm, source = detect_algorithm(series, options.get("algo", "auto"), files)
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
            warnings=tuple(dict.fromkeys(w for r in runs for w in r.warnings)),
        )
        scalars = read_scalar_log(run, self.scalar_cache)
        summary, scalars = summary_extras(summary, run, None, scalars, multiple=named)
        return diagnosis_from_series(summary, series, config, codes, scalars)
