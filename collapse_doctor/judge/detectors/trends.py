"""Robust trend statistics for scalar series: Theil-Sen slope, Mann-Kendall test, robust noise and spike bands.

Pure numpy/scipy functions on one series' own steps (no alignment, no interpolation). They back the run-health
detectors (CD507-CD511): a trend is "real" when the Mann-Kendall test rejects no trend and the Theil-Sen change
over the stretch exceeds the series' own noise floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_TEST_POINTS = 2000
"""Longer series are reduced to this many bin medians before the O(n^2) pairwise statistics."""

MAD_TO_SIGMA = 1.4826
"""Median absolute deviation to the standard deviation of a normal distribution."""


@dataclass(frozen=True)
class TrendTest:
    """A series' monotone trend: Theil-Sen slope (per step), Mann-Kendall z and two-sided p-value, support."""

    slope: float
    z: float
    p_value: float
    points: int
    first_step: int
    last_step: int

    @property
    def change(self) -> float:
        """The Theil-Sen change over the stretch (slope times its length in steps)."""
        return self.slope * (self.last_step - self.first_step)

    def rising(self, alpha: float, noise: float) -> bool:
        """A significant upward trend whose change exceeds ``noise``."""
        return self.z > 0 and self.p_value < alpha and self.change > noise

    def falling(self, alpha: float, noise: float) -> bool:
        """A significant downward trend whose change exceeds ``noise`` (a drop larger than the noise)."""
        return self.z < 0 and self.p_value < alpha and -self.change > noise


def thin(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_TEST_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Finite points, and for long series the median step and value of ``max_points`` consecutive bins.

    >>> thin(np.arange(6), np.array([1.0, np.nan, 3.0, 4.0, 5.0, 6.0]), max_points=10)[1].tolist()
    [1.0, 3.0, 4.0, 5.0, 6.0]
    """
    keep = np.isfinite(values)
    steps, values = np.asarray(steps, dtype=np.float64)[keep], np.asarray(values, dtype=np.float64)[keep]
    n = len(values)
    if n <= max_points:
        return steps, values
    return _bin_medians(steps, max_points), _bin_medians(values, max_points)


def _bin_medians(values: np.ndarray, bins: int) -> np.ndarray:
    """The median of each of ``np.array_split(values, bins)``'s parts, two reshapes instead of a loop: the first
    ``len % bins`` parts hold one value more than the others.

    >>> _bin_medians(np.array([1.0, 5.0, 2.0, 4.0, 3.0]), 2).tolist()
    [2.0, 3.5]
    """
    size, longer = divmod(len(values), bins)
    head = longer * (size + 1)
    parts = [np.median(values[:head].reshape(longer, size + 1), axis=1)] if longer else []
    parts.append(np.median(values[head:].reshape(bins - longer, size), axis=1))
    return np.concatenate(parts)


def theil_sen_slope(steps: np.ndarray, values: np.ndarray) -> float:
    """Median of the pairwise slopes (Theil-Sen), per step; NaN with fewer than two distinct steps.

    >>> round(theil_sen_slope(np.arange(5), np.array([0.0, 1.0, 2.0, 30.0, 4.0])), 6)
    1.0
    """
    x, y = thin(steps, values)
    return _median_slope(x, y)


SLOPES_KEPT = 1 << 17
"""Pairwise slopes a Theil-Sen median holds at once: the 2,000 points of a long series have 2M pairs (32 MB as
float64), so the median is selected among the slopes near it (a sample of pairs says where) instead."""


def _slopes(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The slopes of the pairs ``(i, i + k)`` with distinct steps."""
    dx = x[k:] - x[:-k]
    ok = dx != 0
    return (y[k:] - y[:-k])[ok] / dx[ok]


def _median_slope(x: np.ndarray, y: np.ndarray) -> float:
    """``np.median`` of every pairwise slope, exactly, holding at most about :data:`SLOPES_KEPT` of them.

    >>> x = np.arange(600.0); y = np.sin(x) + 0.01 * x
    >>> every = np.concatenate([_slopes(x, y, k) for k in range(1, 600)])
    >>> _median_slope(x, y) == float(np.median(every))
    True
    """
    n = len(x)
    counts = [int(np.count_nonzero(x[k:] != x[:-k])) for k in range(1, n)]
    total = sum(counts)
    if not total:
        return float("nan")
    if total <= SLOPES_KEPT:
        return float(np.median(np.concatenate([_slopes(x, y, k) for k in range(1, n)]), overwrite_input=True))
    ranks = sorted({(total - 1) // 2, total // 2})  # the middle value (two of them: their mean, as np.median)
    rng = np.random.default_rng(0)  # which pairs bound the search changes the work, never the answer
    i, j = rng.integers(0, n, size=(2, SLOPES_KEPT // 4))
    ok = x[i] != x[j]
    sample = np.sort((y[j] - y[i])[ok] / (x[j] - x[i])[ok])
    margin = 4.0 * math.sqrt(len(sample)) + 16
    lo = sample[max(0, int(len(sample) * ranks[0] / total - margin))] if len(sample) else -np.inf
    hi = sample[min(len(sample) - 1, int(len(sample) * ranks[-1] / total + margin))] if len(sample) else np.inf
    for _ in range(2):  # the bounds hold the middle, or the second pass takes every slope on the missing side
        below, near = 0, []
        for k in range(1, n):
            s = _slopes(x, y, k)
            below += int(np.count_nonzero(s < lo))
            near.append(s[(s >= lo) & (s <= hi)])
        middle = np.concatenate(near)
        if below <= ranks[0] and below + len(middle) > ranks[-1]:
            picked = np.partition(middle, [r - below for r in ranks])[[r - below for r in ranks]]
            return float(np.mean(picked)) if len(ranks) == 2 else float(picked[0])
        lo = -np.inf if below > ranks[0] else lo
        hi = np.inf if below + len(middle) <= ranks[-1] else hi
    raise AssertionError("unreachable: the second pass holds every slope on the side that was missing")


def mann_kendall(values: np.ndarray) -> tuple[float, float]:
    """Mann-Kendall trend test in point order: ``(z, two-sided p)`` with the tie-corrected variance.

    S counts rising minus falling pairs; Var(S) = [n(n-1)(2n+5) - sum_t t(t-1)(2t+5)] / 18 over tied groups of
    size t; z uses the continuity correction. ``(0.0, 1.0)`` for fewer than 3 points or a constant series.

    >>> z, p = mann_kendall(np.arange(10.0))
    >>> round(z, 3), p < 0.001
    (3.935, True)
    >>> mann_kendall(np.ones(5))
    (0.0, 1.0)
    """
    y = np.asarray(values, dtype=np.float64)
    y = y[np.isfinite(y)]
    n = len(y)
    if n < 3:
        return 0.0, 1.0
    s = float(sum(int(np.sign(y[k:] - y[:-k]).sum()) for k in range(1, n)))  # rising minus falling pairs
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    if var <= 0 or s == 0:
        return 0.0, 1.0
    z = (s - math.copysign(1.0, s)) / math.sqrt(var)
    return z, math.erfc(abs(z) / math.sqrt(2))


def trend_test(steps: np.ndarray, values: np.ndarray) -> TrendTest:
    """Theil-Sen slope and Mann-Kendall test of one series on its own steps (long series binned first)."""
    x, y = thin(steps, values)
    z, p = mann_kendall(y)
    first, last = (int(x[0]), int(x[-1])) if len(x) else (0, 0)
    return TrendTest(theil_sen_slope(x, y), z, p, len(y), first, last)


def noise_sigma(values: np.ndarray) -> float:
    """Point-to-point noise of a series, robust to its trend: MAD of the first differences / sqrt(2).

    >>> noise_sigma(np.array([0.0, 1.0, 0.0, 1.0, 0.0])) > 0, noise_sigma(np.arange(6.0))
    (True, 0.0)
    """
    y = np.asarray(values, dtype=np.float64)
    y = y[np.isfinite(y)]
    if len(y) < 2:
        return 0.0
    d = np.diff(y)
    return float(MAD_TO_SIGMA * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def level_noise(values: np.ndarray, window: int) -> float:
    """Twice the standard error of the difference of two medians of ``window`` points (the noise floor a change
    of level must exceed to count)."""
    w = max(1, int(window))
    return 2 * 1.2533 * noise_sigma(values) * math.sqrt(2 / w)


def robust_z(values: np.ndarray, baseline: np.ndarray) -> tuple[np.ndarray, float]:
    """Residuals from a baseline in units of their robust scale (MAD), and that scale (NaN stays NaN)."""
    residual = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    finite = residual[np.isfinite(residual)]
    if not len(finite):
        return np.full(len(residual), np.nan), 0.0
    scale = float(MAD_TO_SIGMA * np.median(np.abs(finite - np.median(finite))))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (residual / scale if scale > 0 else np.where(residual > 0, np.inf, 0.0)), scale


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b between two paired series (NaN with fewer than 3 pairs or a constant one).

    >>> x = np.arange(5.0)
    >>> round(kendall_tau(x, x**2), 6), round(kendall_tau(x, -x), 6)
    (1.0, -1.0)
    """
    from scipy.stats import kendalltau

    keep = np.isfinite(a) & np.isfinite(b)
    if int(keep.sum()) < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return float("nan")
    return float(kendalltau(a[keep], b[keep]).statistic)
