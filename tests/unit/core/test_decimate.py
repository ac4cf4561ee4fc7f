"""decimate: per slice of the steps, the first minimum and the last maximum (NaN counting as the largest), as a
sort by (slice, value) would pick them."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_doctor.core.scalars import decimate


def _by_sorting(values: np.ndarray, max_points: int) -> np.ndarray:
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


@pytest.mark.parametrize("seed", range(40))
def test_same_points_as_sorting(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, max_points = int(rng.integers(5, 5000)), int(rng.integers(2, 300))
    values = rng.integers(0, 4, n).astype(float) if seed % 3 == 0 else rng.normal(size=n)  # ties, or none
    if seed % 4 == 0:
        values[rng.random(n) < 0.2] = np.nan
    if seed == 8:
        values[:] = np.nan
    assert np.array_equal(decimate(values, max_points), _by_sorting(values, max_points))
