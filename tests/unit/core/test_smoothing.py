"""smoothing.rolling: every path (exact, C-filter interior, cumulative-sum means, sorted edges) gives the
shrinking-window median or mean of a plain numpy loop, and memory stays bounded on long windows."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_doctor.core import smoothing
from collapse_doctor.core.smoothing import rolling


def _loop(values: np.ndarray, window: int, how: str) -> np.ndarray:
    half = window // 2
    reduce = np.nanmedian if how == "median" else np.nanmean
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half) : i + half + 1]
        out.append(reduce(part) if np.isfinite(part).any() else np.nan)
    return np.asarray(out)


@pytest.mark.parametrize("how", ["median", "mean"])
@pytest.mark.parametrize("window", [3, 51, 1001])
@pytest.mark.parametrize("nan", [False, True])
def test_every_path_matches_the_loop(how: str, window: int, nan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(window)
    values = rng.normal(size=6000)
    if nan:
        values[rng.random(6000) < 0.1] = np.nan
    expected = _loop(values, window, how)
    np.testing.assert_allclose(rolling(values, window, how), expected, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(smoothing, "SCIPY_MIN", 4096)  # scipy's filters for the interior
    np.testing.assert_allclose(rolling(values, window, how), expected, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(smoothing, "EXACT_BLOCK_VALUES", 5000)  # small blocks, cumsum means, sorted edges
    monkeypatch.setattr(smoothing, "BLOCK_VALUES", 5000)
    np.testing.assert_allclose(rolling(values, window, how), expected, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(smoothing, "SORTED_WINDOW_VALUES", 1)  # long NaN-holding medians: pandas' or the sorted
    np.testing.assert_allclose(rolling(values, window, how), expected, rtol=1e-12, atol=1e-12)
    if how == "median":
        half = window // 2
        np.testing.assert_allclose(smoothing._rolling_median_sorted(values, half), expected, rtol=1e-12, atol=1e-12)


def test_a_long_median_with_nan_is_not_quadratic() -> None:
    """200,000 steps with a 5% persistence window (10,001 values) and NaN holes took minutes per call (one nanmedian
    of each window); the sliding path takes well under a second (not timed here: benchmarks time; this pins that
    the long path is the one taken)."""
    values = np.random.default_rng(1).normal(size=200_000)
    values[::7] = np.nan
    out = rolling(values, 10_001)
    assert out[100_000] == pytest.approx(np.nanmedian(values[95_000:105_001]))


def test_a_window_of_a_tenth_of_a_million_points_fits_in_memory() -> None:
    """A 5% persistence window on a 1M-step log used to materialise 1e10 values at the edges."""
    values = np.random.default_rng(0).normal(size=1_000_000)
    means = rolling(values, 100_001, how="mean")
    medians = rolling(values, 50_001)
    assert means[0] == pytest.approx(values[:50_001].mean()) and medians[-1] == pytest.approx(
        np.median(values[-25_001:])
    )
