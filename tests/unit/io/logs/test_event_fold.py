"""Event files whose tags are longer than the fold cap: read into step buckets, the same whether the file is read at
once, block by block or poll by poll (watch's ScalarCache), with purges, repeated steps and several files; a tag
under the cap in the same file is read point for point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.core import fold
from collapse_doctor.core.fold import fold_series
from collapse_doctor.io.logs import tensorboard
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from tests.helpers.scalar_runs import record, scalar_event, session_start, write_raw

CAP = 64


@pytest.fixture(autouse=True)
def _small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold, "FOLD_CAP", CAP)


def _payloads(steps: int, *, seed: int = 0, short_every: int = 20) -> tuple[list[bytes], dict[str, np.ndarray]]:
    """Two tags at every step (long) and one every ``short_every`` steps (short), as float32 values."""
    rng = np.random.default_rng(seed)
    values = {
        "train/kl": rng.random(steps).astype(np.float32).astype(np.float64),
        "train/reward": rng.normal(size=steps).astype(np.float32).astype(np.float64),
    }
    values["train/reward"][::97] = np.nan
    payloads = []
    for step in range(steps):
        payloads += [scalar_event(tag, float(v[step]), step, 1000.0 + step) for tag, v in values.items()]
        if step % short_every == 0:
            payloads.append(scalar_event("train/entropy", step / steps, step, 1000.0 + step))
    return payloads, values


def _as_lists(log: tensorboard.ScalarLog) -> dict[str, tuple[list[int], list[float], object]]:
    out = {}
    for tag, points in log.tags.items():
        b = points.buckets
        extra = None if b is None else (b.width, b.points.tolist(), b.minima.tolist(), b.maxima.tolist())
        out[tag] = (points.steps.tolist(), np.nan_to_num(points.values, nan=-9.0).tolist(), extra)
    return out


def test_long_tags_are_their_bucket_means_and_a_short_tag_is_untouched(tmp_path: Path) -> None:
    payloads, values = _payloads(1000)
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    log = ScalarCache().read([path])
    for tag, v in values.items():
        points = log.tags[tag]
        steps, means, buckets = fold_series(np.arange(1000), v, cap=CAP)
        assert points.buckets is not None and points.buckets.width == buckets.width == 16
        assert np.array_equal(points.steps, steps)
        np.testing.assert_allclose(points.values, means, rtol=1e-12, equal_nan=True)
        reference = [np.nanmean(v[lo : lo + 16]) for lo in range(0, 1000, 16)]
        np.testing.assert_allclose(points.values, reference, rtol=1e-12)
    entropy = log.tags["train/entropy"]
    assert entropy.buckets is None and entropy.steps.tolist() == list(range(0, 1000, 20))
    assert log.folded == {"train/kl": (1000, 63, 16), "train/reward": (1000, 63, 16)}
    assert "train/kl: 1,000 points read as 63 buckets of 16 steps" in " ".join(log.notes())


@pytest.mark.parametrize("block", [300, 4096, 1 << 20])
def test_the_same_buckets_in_one_read_block_by_block_and_poll_by_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    payloads, _ = _payloads(700, seed=1)
    payloads[900:900] = [session_start(250, 2000.0)]  # a restart inside a folded bucket, mid-file
    data = b"".join(record(p) for p in payloads)
    path = tmp_path / "events.out.tfevents.1.host"
    path.write_bytes(data)
    whole = ScalarCache().read([path])
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    cache = ScalarCache()
    rng = np.random.default_rng(block)
    for cut in [*np.sort(rng.integers(1, len(data), size=12)).tolist(), len(data)]:
        path.write_bytes(data[:cut])
        polled = cache.read([path])
    assert _as_lists(polled) == _as_lists(whole)
    assert (polled.points, polled.duplicates, polled.purged) == (whole.points, whole.duplicates, whole.purged)


def test_a_session_start_inside_a_folded_bucket_drops_that_bucket_whole(tmp_path: Path) -> None:
    payloads = [scalar_event("train/kl", 1.0, step, float(step)) for step in range(200)]  # buckets of 4 steps
    payloads.append(session_start(101, 500.0))  # inside the bucket of steps 100-103
    payloads += [scalar_event("train/kl", 3.0, step, 500.0 + step) for step in range(101, 150)]
    log = ScalarCache().read([write_raw(tmp_path / "events.out.tfevents.1.host", payloads)])
    kl = log.tags["train/kl"]
    assert kl.buckets is not None and kl.buckets.width == 4
    assert 100 not in kl.steps.tolist()  # step 100 went with its bucket
    assert kl.values[kl.steps < 100].tolist() == [1.0] * 25 and set(kl.values[kl.steps > 100].tolist()) == {3.0}
    assert log.purged == 100  # 99 points at steps >= 101, and step 100 with them


def test_a_restart_without_start_in_a_second_file_replaces_what_it_logs_again(tmp_path: Path) -> None:
    first = [scalar_event("train/kl", 1.0, step, float(step)) for step in range(300)]
    second = [scalar_event("train/kl", 2.0, step, 1000.0 + step) for step in range(200, 400)]
    files = [
        write_raw(tmp_path / "events.out.tfevents.1.host", first),
        write_raw(tmp_path / "events.out.tfevents.2.host", second),
    ]
    log = ScalarCache().read(files)
    kl = log.tags["train/kl"]
    assert kl.buckets is not None and kl.buckets.total == 400 and kl.buckets.width == 8
    assert set(kl.values[kl.steps < 200].tolist()) == {1.0} and set(kl.values[kl.steps >= 200].tolist()) == {2.0}
    assert log.duplicates == 100 and log.duplicate_tags == {"train/kl": 100}


def test_files_each_under_the_cap_together_over_it_are_folded_once_merged(tmp_path: Path) -> None:
    files = [
        write_raw(
            tmp_path / f"events.out.tfevents.{i}.host",
            [scalar_event("train/kl", float(step), step, float(step)) for step in range(50 * i, 50 * i + 50)],
        )
        for i in range(3)
    ]
    kl = ScalarCache().read(files).tags["train/kl"]
    assert kl.buckets is not None and kl.buckets.width == 4
    np.testing.assert_allclose(kl.values, [np.mean(np.arange(150)[lo : lo + 4]) for lo in range(0, 150, 4)])


def test_a_tag_purged_back_under_the_cap_before_any_fold_is_read_point_for_point(tmp_path: Path) -> None:
    payloads = [scalar_event("train/kl", 1.0, step, float(step)) for step in range(CAP)]
    payloads.append(session_start(10, 100.0))
    payloads += [scalar_event("train/kl", 2.0, step, 100.0 + step) for step in range(10, 40)]
    log = ScalarCache().read([write_raw(tmp_path / "events.out.tfevents.1.host", payloads)])
    kl = log.tags["train/kl"]
    assert kl.buckets is None and not log.folded
    assert kl.steps.tolist() == list(range(40)) and kl.values.tolist() == [1.0] * 10 + [2.0] * 30
