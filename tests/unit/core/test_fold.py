"""Long scalar series folded into step buckets: short ones untouched, long ones equal to a NumPy reference of the
bucket means whatever pieces the points came in, purges and repeated steps as the module docstring says."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_doctor.core.fold import SeriesFold, fold_series


def _reference(steps: np.ndarray, values: np.ndarray, cap: int) -> dict[str, np.ndarray | int]:
    """Bucket statistics of a sorted series with one point per step, by the definition: the smallest power-of-two
    width leaving at most ``cap`` buckets, then a loop over the buckets."""
    width = 1
    while len(np.unique(steps // width)) > cap:
        width *= 2
    keys = steps // width
    out: dict[str, list[float]] = {k: [] for k in ("first", "mean", "low", "high", "points", "finite", "nan", "last")}
    for key in np.unique(keys):
        inside = keys == key
        v = values[inside]
        finite = v[np.isfinite(v)]
        out["first"].append(steps[inside][0])
        out["last"].append(steps[inside][-1])
        out["mean"].append(finite.mean() if len(finite) else np.nan)
        out["low"].append(finite.min() if len(finite) else np.nan)
        out["high"].append(finite.max() if len(finite) else np.nan)
        out["points"].append(len(v))
        out["finite"].append(len(finite))
        out["nan"].append(int(np.isnan(v).sum()))
    return {"width": width} | {k: np.asarray(v) for k, v in out.items()}


def _series(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.choice(np.arange(5 * n), size=n, replace=False)).astype(np.int64)  # gaps between steps
    values = rng.normal(size=n).astype(np.float32).astype(np.float64)
    values[rng.random(n) < 0.01] = np.nan
    values[rng.random(n) < 0.005] = np.inf
    return steps, values


def _result(fold: SeriesFold) -> tuple[np.ndarray, ...]:
    steps, values, buckets = fold.result()
    assert buckets is not None
    return steps, values, buckets.points, buckets.finite, buckets.nan, buckets.minima, buckets.maxima


def test_a_series_of_at_most_the_cap_is_untouched_bit_for_bit() -> None:
    steps, values = _series(64)
    fold = SeriesFold(cap=64)
    for lo in range(0, 64, 10):
        fold.add(steps[lo : lo + 10], values[lo : lo + 10])
    got_steps, got_values, buckets = fold.result()
    assert buckets is None and not fold.folded
    assert np.array_equal(got_steps, steps) and np.array_equal(got_values, values, equal_nan=True)


@pytest.mark.parametrize(("n", "cap"), [(65, 64), (1000, 64), (10_000, 128), (50_000, 16_384)])
def test_a_long_series_is_the_bucket_means_of_a_numpy_reference(n: int, cap: int) -> None:
    steps, values = _series(n, seed=n)
    got_steps, means, buckets = fold_series(steps, values, cap=cap)
    expected = _reference(steps, values, cap)
    assert buckets.width == expected["width"] and len(got_steps) <= cap
    assert np.array_equal(got_steps, expected["first"]) and np.array_equal(buckets.last_steps, expected["last"])
    for name in ("points", "finite", "nan"):
        assert np.array_equal(getattr(buckets, name), expected[name]), name
    np.testing.assert_allclose(means, expected["mean"], rtol=1e-12, atol=1e-15, equal_nan=True)
    assert np.array_equal(buckets.minima, expected["low"], equal_nan=True)
    assert np.array_equal(buckets.maxima, expected["high"], equal_nan=True)
    assert buckets.total == n


def test_the_result_does_not_depend_on_the_pieces_the_points_came_in() -> None:
    steps, values = _series(5000, seed=3)
    whole = SeriesFold(cap=100)
    whole.add(steps, values)
    rng = np.random.default_rng(4)
    for _ in range(5):
        cuts = np.sort(rng.choice(np.arange(1, 5000), size=40, replace=False))
        pieces = SeriesFold(cap=100)
        for part_steps, part_values in zip(np.split(steps, cuts), np.split(values, cuts), strict=True):
            pieces.add(part_steps, part_values)
            pieces.result()  # a poll in between changes nothing
        for a, b in zip(_result(whole), _result(pieces), strict=True):
            assert np.array_equal(a, b, equal_nan=True)  # bit for bit


def test_a_step_logged_twice_before_it_is_folded_keeps_the_later_point() -> None:
    fold = SeriesFold(cap=8)
    fold.add(np.array([0, 1, 2, 3, 3, 4, 5, 6, 7]), np.array([0.0, 1, 2, 3, 30, 4, 5, 6, 7]))
    steps, means, buckets = fold.result()
    assert buckets is not None and buckets.width == 1
    assert means[steps == 3].tolist() == [30.0] and fold.duplicates == 1 and buckets.total == 8


def test_a_restart_without_start_replaces_the_folded_buckets_from_its_step_on() -> None:
    fold = SeriesFold(cap=4)
    fold.add(np.arange(40), np.ones(40))  # buckets of 16 steps: 0-15, 16-31, 32-39
    fold.add(np.arange(20, 30), np.full(10, 5.0))  # restarted at step 20, stopped at 29
    steps, means, buckets = fold.result()
    assert buckets is not None
    # the bucket holding step 20 goes whole (steps 16-19 with it), and so does every later one
    assert steps.tolist() == [0, 20] and means.tolist() == [1.0, 5.0] and buckets.points.tolist() == [16, 10]
    assert fold.duplicates == 24


def test_a_session_start_purges_exactly_what_is_pending_and_whole_buckets_before() -> None:
    fold = SeriesFold(cap=4)
    fold.add(np.arange(3), np.ones(3))
    assert fold.truncate(1) == 2 and fold.result()[0].tolist() == [0]  # nothing folded: exact
    fold = SeriesFold(cap=4)
    fold.add(np.arange(40), np.ones(40))
    dropped = fold.truncate(18)  # inside the bucket of steps 16-31: it goes whole
    steps, _, buckets = fold.result()
    assert buckets is not None and steps.tolist() == [0] and dropped == 24 and fold.purged == 24
    fold.add(np.arange(18, 50), np.full(32, 2.0))
    steps, means, buckets = fold.result()
    assert buckets is not None and steps[0] == 0 and means[0] == 1.0 and buckets.total == 16 + 32


def test_extend_joins_a_later_fold_at_the_coarser_width() -> None:
    steps, values = _series(3000, seed=9)
    values = np.nan_to_num(values, nan=0.0, posinf=0.0)
    first, second = SeriesFold(cap=64), SeriesFold(cap=64)
    first.add(steps[:500], values[:500])
    second.add(steps[500:], values[500:])
    got_steps, means, buckets = first.extend(second).result()
    expected = _reference(steps, values, 64)
    assert buckets is not None and buckets.width == expected["width"] and buckets.total == 3000
    assert np.array_equal(got_steps, expected["first"])
    np.testing.assert_allclose(means, expected["mean"], rtol=1e-12)
