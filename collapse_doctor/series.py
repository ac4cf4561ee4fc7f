"""Per-step series of a run: the small, sorted summary that detectors and reports read."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

PAIR_SEPARATOR = "|"


def channel_pairs(channels: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """Channel pairs in the order the ``[S, P]`` statistics use (``itertools.combinations``).

    >>> channel_pairs(["a", "b", "c"])
    [('a', 'b'), ('a', 'c'), ('b', 'c')]
    """
    return list(combinations(channels, 2))


@dataclass
class RunSeries:
    """Statistics per training step, sorted by step.

    ``values[name]`` is ``[S]`` (run-level), ``[S, C]`` (per channel, in ``channels`` order) or
    ``[S, P]`` (per channel pair, in ``pairs`` order).
    """

    steps: np.ndarray
    channels: tuple[str, ...]
    pairs: list[tuple[str, str]]
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, Any]:
        """``{"step": [...], name: [...] | {channel: [...]} | {"a|b": [...]}}`` with NaN as null."""
        out: dict[str, Any] = {"step": [int(s) for s in self.steps]}
        for name, array in self.values.items():
            if array.ndim == 1:
                out[name] = _floats(array)
            elif name.startswith(("corr_", "within_corr")):
                out[name] = {f"{a}{PAIR_SEPARATOR}{b}": _floats(array[:, k]) for k, (a, b) in enumerate(self.pairs)}
            else:
                out[name] = {c: _floats(array[:, k]) for k, c in enumerate(self.channels)}
        return out


def _floats(array: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(f"{v:.6g}") for v in array.tolist()]


class SeriesBuilder:
    """Collects per-chunk statistics in arrival order and sorts them by step at the end."""

    def __init__(self, channels: tuple[str, ...], pairs: list[tuple[str, str]]) -> None:
        self.channels = channels
        self.pairs = pairs
        self._steps: list[np.ndarray] = []
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, steps: np.ndarray, stats: dict[str, np.ndarray]) -> None:
        self._steps.append(np.asarray(steps, dtype=np.int64))
        for name, value in stats.items():
            self._parts.setdefault(name, []).append(np.asarray(value, dtype=np.float64))

    def build(self) -> RunSeries:
        steps = np.concatenate(self._steps) if self._steps else np.zeros(0, dtype=np.int64)
        order = np.argsort(steps, kind="stable")
        values = {name: np.concatenate(parts)[order] for name, parts in self._parts.items()}
        return RunSeries(steps=steps[order], channels=self.channels, pairs=self.pairs, values=values)


def rolling(values: np.ndarray, window: int, how: str = "median") -> np.ndarray:
    """Centered rolling median (or mean) ignoring NaN; the window shrinks at the edges.

    >>> rolling(np.array([1.0, 9.0, 1.0, 1.0, 1.0]), 3).tolist()
    [5.0, 1.0, 1.0, 1.0, 1.0]
    """
    window = max(1, int(window))
    if window == 1 or len(values) == 0:
        return values.astype(np.float64)
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), values.astype(np.float64), np.full(half, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        reduce = np.nanmedian if how == "median" else np.nanmean
        return np.asarray(reduce(windows, axis=1))
