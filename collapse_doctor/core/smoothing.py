"""Smoothing and persistence on per-step series: the one implementation every detector uses.

Pure numpy functions, no state. A level is smoothed with a centred rolling median, a share with a rolling
mean; the window shrinks at the edges (only the values that exist count), and NaN values are ignored.
"""

from __future__ import annotations

import warnings

import numpy as np

FAST_PATH_MIN = 4096
"""Series at least this long (and NaN-free) take the fast paths: below :data:`SCIPY_MIN`, a sorted sliding window
(medians) or running sums (means), above it scipy's C filters for their interior."""

SCIPY_MIN = 16_385
"""Series at least this long take scipy's filters. Shorter ones (every scalar series a scan reads: longer logs are
folded to at most 16,384 step buckets, :mod:`collapse_doctor.core.fold`) never import scipy.ndimage (28 MiB of
resident memory, 0.1 s)."""


EXACT_BLOCK_VALUES = 2**24
"""Window values (``n * window``) above which a rolling mean takes cumulative sums instead of each window's mean."""

BLOCK_VALUES = 2**18
"""Window values the exact path materialises at once (a block of rows): a few MiB of temporaries at any length."""


def _rolling_exact(values: np.ndarray, half: int, how: str, first: int = 0, last: int | None = None) -> np.ndarray:
    """The shrinking-window reduction at positions ``first..last - 1`` (default: every position)."""
    padded = np.concatenate([np.full(half, np.nan), values, np.full(half, np.nan)])
    width = 2 * half + 1
    block = max(1, BLOCK_VALUES // width)
    reduce = np.nanmedian if how == "median" else np.nanmean
    last = len(values) if last is None else last
    out = np.empty(last - first, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for start in range(first, last, block):
            stop = min(last, start + block)
            windows = np.lib.stride_tricks.sliding_window_view(padded[start : stop + 2 * half], width)
            if how == "median" and not np.isnan(padded[start : stop + 2 * half]).any():
                out[start - first : stop - first] = np.median(windows, axis=1)  # no NaN: no masked-array copies
            else:
                out[start - first : stop - first] = reduce(windows, axis=1)
    return out


def _rolling_mean_cumsum(values: np.ndarray, half: int) -> np.ndarray:
    """The shrinking-window mean ignoring NaN from cumulative sums: O(n) whatever the window."""
    finite = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    index = np.arange(len(values))
    lo, hi = np.maximum(index - half, 0), np.minimum(index + half + 1, len(values))
    count = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, (sums[hi] - sums[lo]) / np.maximum(count, 1), np.nan)


SORTED_WINDOW_VALUES = 2**22
"""Window values above which a median over NaN-holding values slides a sorted window instead of taking each
window's median (``n * window`` grows with the square of a run's steps: the window is a share of them)."""


def _rolling_median_long(values: np.ndarray, half: int) -> np.ndarray:
    """The shrinking-window median ignoring NaN of a long series: pandas' rolling median (a skip list in C) where
    pandas is installed, else :func:`_rolling_median_sorted`; both equal :func:`_rolling_exact`."""
    try:
        import pandas as pd
    except ImportError:
        return _rolling_median_sorted(values, half)
    rolled = pd.Series(values).rolling(2 * half + 1, center=True, min_periods=1).median()
    return np.asarray(rolled.to_numpy(dtype=np.float64))


def _rolling_median_sorted(values: np.ndarray, half: int) -> np.ndarray:
    """The shrinking-window median ignoring NaN (as :func:`_rolling_exact`), by one sorted window of the finite
    values slid along: each step inserts the value entering and removes the one leaving.

    >>> data = np.array([1.0, np.nan, 5.0, 2.0, np.nan, np.nan, 7.0])
    >>> bool(np.allclose(_rolling_median_sorted(data, 2), _rolling_exact(data, 2, "median"), equal_nan=True))
    True
    """
    from bisect import bisect_left, insort

    n = len(values)
    out = np.full(n, np.nan)
    window: list[float] = []
    finite = ~np.isnan(values)
    for j in range(min(n, half + 1)):
        if finite[j]:
            insort(window, float(values[j]))
    for i in range(n):
        k = len(window)
        if k:
            out[i] = window[k // 2] if k % 2 else 0.5 * (window[k // 2 - 1] + window[k // 2])
        entering, leaving = i + half + 1, i - half
        if entering < n and finite[entering]:
            insort(window, float(values[entering]))
        if leaving >= 0 and finite[leaving]:
            del window[bisect_left(window, float(values[leaving]))]
    return out


def _edge_medians(values: np.ndarray, half: int) -> np.ndarray:
    """Medians of the growing windows ``values[:half + 1 + i]`` for ``i < half`` (the left edge; NaN-free input),
    kept sorted by insertion: O(half * window) memory moves instead of ``half`` windows materialised."""
    from bisect import insort

    window = sorted(values[: half + 1].tolist())
    out = np.empty(half, dtype=np.float64)
    for i in range(half):
        k = len(window)
        out[i] = window[k // 2] if k % 2 else 0.5 * (window[k // 2 - 1] + window[k // 2])
        insort(window, float(values[half + 1 + i]))
    return out


def rolling(values: np.ndarray, window: int, how: str = "median", *, cumulative: bool = False) -> np.ndarray:
    """Centred rolling median (or mean, ``how="mean"``) over ``window`` values (made odd), ignoring NaN.

    The window shrinks at the edges. Long NaN-free series compute their medians with one sorted window slid along
    (up to :data:`SCIPY_MIN` points) or their interior with scipy's C filters and their edges exactly (longer
    ones), with the same result; their means, and long windows of means, use cumulative sums; nothing
    materialises more than :data:`BLOCK_VALUES` window values.
    ``cumulative=True`` takes the cumulative sums for a mean at any length: a window's sum is then a difference
    of running sums, which rounds differently (in the last bits) from summing the window's values.

    >>> rolling(np.array([0.0, 3.0, 0.0, 3.0]), 3, how="mean", cumulative=True).tolist()
    [1.5, 1.0, 2.0, 1.5]
    >>> rolling(np.array([1.0, 9.0, 1.0, 1.0, 1.0]), 3).tolist()
    [5.0, 1.0, 1.0, 1.0, 1.0]
    >>> rolling(np.array([1.0, np.nan, 3.0]), 3, how="mean").tolist()
    [1.0, 2.0, 3.0]
    """
    data = np.asarray(values, dtype=np.float64)
    half = max(1, int(window)) // 2
    n = len(data)
    if half == 0 or n == 0:
        return data.copy()
    fast = n >= max(FAST_PATH_MIN, 4 * half + 2)
    if how == "mean" and (cumulative or n * (2 * half + 1) > EXACT_BLOCK_VALUES or (fast and n < SCIPY_MIN)):
        return _rolling_mean_cumsum(data, half)
    if not fast or np.isnan(data).any():
        if how == "median" and n * (2 * half + 1) > SORTED_WINDOW_VALUES:
            if n < SCIPY_MIN:
                return _rolling_median_sorted(data, half)
            return _rolling_median_long(data, half)  # a long series with NaN: O(n log w), not O(n w)
        return _rolling_exact(data, half, how)
    if n < SCIPY_MIN:  # the median of every window, exactly as below, without importing scipy
        return _rolling_median_sorted(data, half)
    from scipy.ndimage import median_filter, uniform_filter1d

    size = 2 * half + 1
    if how == "median":
        out = np.asarray(median_filter(data, size=size, mode="nearest"), dtype=np.float64)
    else:
        out = np.asarray(uniform_filter1d(data, size=size, mode="nearest"), dtype=np.float64)
    if how == "median":  # the growing edge windows, by sorted insertion (the same medians, far less work)
        out[:half] = _edge_medians(data, half)
        out[n - half :] = _edge_medians(data[::-1], half)[::-1]
        return out
    edge = 2 * half  # the first (last) half windows lie within the first (last) 2 * half values
    out[:half] = _rolling_exact(data[:edge], half, how, 0, half)
    out[n - half :] = _rolling_exact(data[n - edge :], half, how, half, edge)
    return out


class Stretch(tuple[int, int]):
    """``(start, end)`` indices of a sustained condition, inclusive, with the per-row ``condition`` it was found in
    (so a grader can ask whether the condition still holds in most of a later window, not only whether a
    sustained episode reaches it). Compares, unpacks and prints as the plain pair."""

    condition: np.ndarray

    def __new__(cls, start: int, end: int, condition: np.ndarray) -> Stretch:
        made = super().__new__(cls, (start, end))
        made.condition = condition
        return made


def persistent_onset(condition: np.ndarray, min_run: int) -> Stretch | None:
    """Where a condition holds persistently: (start, end) indices, inclusive, or ``None``.

    ``start`` opens the first stretch of at least ``min_run`` consecutive True values (the onset);
    ``end`` closes the last such stretch, so the range covers every sustained episode. The result is a
    :class:`Stretch` that also carries the condition.

    >>> persistent_onset(np.array([0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1], bool), 3)
    (4, 11)
    >>> persistent_onset(np.array([1, 0, 1], bool), 2) is None
    True
    """
    min_run = max(1, int(min_run))
    values = np.asarray(condition, dtype=bool)
    padded = np.concatenate([[False], values, [False]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    starts, ends = edges[::2], edges[1::2] - 1
    long_enough = (ends - starts + 1) >= min_run
    if not long_enough.any():
        return None
    return Stretch(int(starts[long_enough][0]), int(ends[long_enough][-1]), values)


def finite_peak(values: np.ndarray, steps: np.ndarray) -> tuple[float, int | None]:
    """The highest finite value and the step it is at (the first such); ``(nan, None)`` with none.

    >>> finite_peak(np.array([0.2, np.nan, 0.5, 0.5]), np.array([10, 11, 12, 13]))
    (0.5, 12)
    """
    finite = np.isfinite(values)
    if not finite.any():
        return float("nan"), None
    at = int(np.argmax(np.where(finite, values, -np.inf)))
    return float(values[at]), int(steps[at])


def ratio_to_running_peak(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value over the highest value so far (along axis 0), and that running peak.

    The ratio is NaN where the peak is not positive (nothing to fall from) or the value is NaN.

    >>> ratio, peak = ratio_to_running_peak(np.array([0.0, 0.8, np.nan, 0.2]))
    >>> ratio.tolist()[1:], peak.tolist()
    ([1.0, nan, 0.25], [0.0, 0.8, 0.8, 0.8])
    """
    data = np.asarray(values, dtype=np.float64)
    peak = np.fmax.accumulate(np.where(np.isfinite(data), data, -np.inf), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(peak > 0, data / np.where(peak > 0, peak, 1.0), np.nan)
    return ratio, peak
