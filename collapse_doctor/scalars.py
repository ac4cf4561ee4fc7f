"""A run's scalar log in canonical names: what the CD5xx detectors and the report's scalar panels read.

Readers (TensorBoard event files, TRL ``trainer_state.json``, verl's file-logger JSONL) produce raw tags;
:func:`scalar_series` maps them with the framework's tag map (:mod:`collapse_doctor.io.tags`) and derives
the share of zero-variance groups where a framework logs it another way (NeMo-RL's ``pct_0 + pct_1``,
OpenRLHF's dynamic-filtering pass rate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.io import tags as T
from collapse_doctor.io.tensorboard import TagPoints

JSON_MAX_POINTS = 10_000
"""Points per series in the JSON output; longer series are decimated (min and max per slice)."""


@dataclass
class ScalarSeries:
    """Canonical scalar series of one run: ``series[name]`` holds its own steps (tags are logged unevenly)."""

    framework: str | None
    series: dict[str, TagPoints]
    tags: dict[str, str]
    """``{canonical name: raw tag}`` (derived series name their inputs)."""
    points: int
    sources: tuple[Path, ...] = ()
    notes: list[str] = field(default_factory=list)
    raw_tags: tuple[str, ...] = ()

    def __contains__(self, name: str) -> bool:
        return name in self.series

    def get(self, name: str) -> TagPoints | None:
        return self.series.get(name)

    @property
    def channels(self) -> tuple[str, ...]:
        """Reward channels seen as per-channel series (mean, std, collapse-doctor's monitor), in name order."""
        names = {key.split("/", 1)[1] for key in self.series if key.startswith(T.CHANNEL_PREFIXES)}
        return tuple(sorted(names))

    def steps(self) -> np.ndarray:
        """Every step at which some canonical series has a point."""
        parts = [p.steps for p in self.series.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def to_json(self, max_points: int = JSON_MAX_POINTS) -> dict[str, Any]:
        """``{"framework", "points", "tags", "series": {name: {"points", "step", "value"}}}``, NaN as null.

        A series longer than ``max_points`` keeps the lowest and highest point of each of ``max_points / 2``
        equal slices of its steps (spikes survive, the plot looks the same); ``points`` is its full length.
        """
        out: dict[str, Any] = {}
        for name, p in self.series.items():
            keep = decimate(p.values, max_points)
            out[name] = {
                "points": len(p.steps),
                "step": [int(s) for s in p.steps[keep].tolist()],
                "value": [None if not np.isfinite(v) else float(f"{v:.6g}") for v in p.values[keep].tolist()],
            }
        return {"framework": self.framework, "points": self.points, "tags": dict(self.tags), "series": out}


def decimate(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices keeping each slice's minimum and maximum, at most ``max_points`` of them, in order.

    >>> decimate(np.array([0.0, 5.0, 1.0, 2.0, -3.0, 0.0]), 4).tolist()
    [0, 1, 3, 4]
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    bucket = (np.arange(n) * buckets) // n
    order = np.lexsort((np.nan_to_num(values, nan=np.inf), bucket))
    bounds = np.flatnonzero(np.diff(bucket[order])) + 1
    first = order[np.concatenate([[0], bounds])]
    last = order[np.concatenate([bounds - 1, [n - 1]])]
    return np.unique(np.concatenate([first, last]))


def _aligned(a: TagPoints, b: TagPoints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    return steps, a.values[ia], b.values[ib]


def scalar_series(
    raw: Mapping[str, TagPoints],
    *,
    points: int,
    sources: Sequence[Path] = (),
    notes: Sequence[str] = (),
    framework: str | None = None,
) -> ScalarSeries:
    """Map raw tags to canonical series (framework auto-detected unless given) and add derived ones."""
    framework = framework or T.detect_framework(raw)
    mapping = T.map_tags(raw, framework) if framework else {}
    for name, tag in T.map_tags(raw, T.MONITOR).items():
        mapping.setdefault(name, tag)  # collapse-doctor's own monitor, when the trainer does not log it
    series = {name: raw[tag] for name, tag in mapping.items()}
    tags = dict(mapping)
    if T.ZERO_STD_SHARE not in series:
        fail, ok = series.get(T.PCT_ALL_FAIL), series.get(T.PCT_ALL_PASS)
        if fail is not None and ok is not None:
            steps, a, b = _aligned(fail, ok)
            series[T.ZERO_STD_SHARE] = TagPoints(steps, (a + b) / 100.0)
            tags[T.ZERO_STD_SHARE] = f"({mapping[T.PCT_ALL_FAIL]} + {mapping[T.PCT_ALL_PASS]}) / 100"
        elif T.PASS_RATE in series:
            rate = series[T.PASS_RATE]
            series[T.ZERO_STD_SHARE] = TagPoints(rate.steps, 1.0 - rate.values)
            tags[T.ZERO_STD_SHARE] = f"1 - {mapping[T.PASS_RATE]}"
    return ScalarSeries(
        framework=framework,
        series=dict(sorted(series.items())),
        tags=tags,
        points=points,
        sources=tuple(sources),
        notes=list(notes),
        raw_tags=tuple(sorted(raw)),
    )
