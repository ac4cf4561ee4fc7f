"""The block-by-block TensorBoard reader: every point as EventAccumulator (or the flat reference) gives it, whatever
the block size, with bounded memory; the CRC paths against a byte-at-a-time reference."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.logs import tensorboard
from collapse_doctor.io.logs.crc32c import TABLE, crc32c_many
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.logs.tensorboard import EventFileRead, merge_reads, read_event_file
from tests.helpers.scalar_runs import record, scalar_event, session_start, write_raw

BLOCK_SIZES = [300, 4096, 1 << 20]
"""Block sizes: smaller than one histogram record, a few dozen records, the default."""


def _summary_writer_file(directory: Path) -> Path:
    """Several tags, scalars and non-scalar events between them (histograms longer than a small block, text)."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(3)
    writer = SummaryWriter(str(directory))
    for step in range(400):
        writer.add_scalar("train/kl", float(rng.random()), step)
        writer.add_scalar("train/reward", float(rng.standard_normal()), step)
        if step % 7 == 0:
            writer.add_histogram("weights", rng.standard_normal(500), step)
            writer.add_text("note", f"step {step} " * 20, step)
        if step % 3 == 0:
            writer.add_scalar("train/rewards/format/mean", float(rng.random()), step * 10)  # steps of its own
        writer.add_scalar("train/big_step", float(step), 2**40 + step)  # a 6-byte step varint
    writer.close()
    return next(p for p in directory.iterdir() if "tfevents" in p.name)


def _accumulator(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: ([e.step for e in events.Scalars(tag)], [e.value for e in events.Scalars(tag)])
        for tag in events.Tags()["scalars"]
    }


@pytest.mark.parametrize("block", BLOCK_SIZES)
def test_summary_writer_file_reads_as_event_accumulator_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    path = _summary_writer_file(tmp_path)
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    monkeypatch.setattr(tensorboard, "PARALLEL_CHECK_RECORDS", 4)  # the checks on the second thread too
    log = ScalarCache().read([path])
    expected = _accumulator(path)
    assert sorted(log.tags) == sorted(expected)
    for tag, (steps, values) in expected.items():
        assert log.tags[tag].steps.tolist() == steps
        np.testing.assert_array_equal(log.tags[tag].values, np.float32(values))
        assert log.tags[tag].values.dtype == np.float64 and log.tags[tag].steps.dtype == np.int64
    assert log.points == sum(len(s) for s, _ in expected.values()) and log.duplicates == 0
    read = read_event_file(path)
    assert read.end == path.stat().st_size and not read.truncated


def test_tags_logged_together_share_one_steps_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_raw(
        tmp_path / "events.out.tfevents.1.host",
        [scalar_event(tag, float(s), s, float(s)) for s in range(300) for tag in ("a", "b", "c")],
    )
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", 500)  # blocks end inside a step
    log = ScalarCache().read([path])
    assert log.tags["a"].steps is log.tags["b"].steps is log.tags["c"].steps
    assert not log.tags["a"].steps.flags.writeable


@pytest.mark.parametrize("block", BLOCK_SIZES)
def test_a_cut_last_record_ends_the_read_in_any_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    payloads = [scalar_event("train/kl", 0.5 * i, i, float(i)) for i in range(200)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    whole = path.read_bytes()
    for cut in (1, 7, len(record(payloads[-1])) - 1):
        path.write_bytes(whole[:-cut])
        read = read_event_file(path)
        assert read.truncated and read.points == 199 and read.records == 199
        assert read.end == len(whole) - len(record(payloads[-1]))
        assert read.columns is not None and read.columns["train/kl"].steps.tolist() == list(range(199))


@pytest.mark.parametrize("block", BLOCK_SIZES)
def test_a_checksum_error_in_a_later_block_names_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(300)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    data = bytearray(path.read_bytes())
    at = sum(len(record(p)) for p in payloads[:250])
    data[at + 20] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"corrupt TensorBoard record at byte {at} \(data checksum mismatch\)"):
        read_event_file(path)


@pytest.mark.parametrize("block", [100, 1 << 20])
def test_a_corrupt_length_far_past_the_end_is_an_error_not_a_huge_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(40)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    data = bytearray(path.read_bytes())
    at = sum(len(record(p)) for p in payloads[:10])
    data[at : at + 8] = (1 << 40).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"corrupt TensorBoard record at byte {at} \\(length checksum"):
        read_event_file(path)


def _reference(payload_files: list[list[bytes]]) -> tuple[dict[str, tuple[list[int], list[float]]], int]:
    """What the reader must give, point by point: purges by SessionLog START, then per (tag, step) the point with
    the latest wall time (then the last logged), sorted by step; and the number of points logged."""
    from tensorboard.compat.proto.event_pb2 import Event

    points: list[tuple[str, int, float, float, int]] = []  # tag, step, value, wall, sequence
    seq = logged = 0
    for payloads in payload_files:
        for payload in payloads:
            event = Event.FromString(payload)
            seq += 1
            if event.HasField("session_log") and event.session_log.status == 1:
                points = [p for p in points if p[1] < event.step]
                continue
            for value in event.summary.value:
                points.append((value.tag, event.step, value.simple_value, event.wall_time, seq))
                logged += 1
    best: dict[tuple[str, int], tuple[float, int, float]] = {}
    for tag, step, value, wall, order in points:
        key = (tag, step)
        if key not in best or (wall, order) >= best[key][:2]:
            best[key] = (wall, order, value)
    out: dict[str, tuple[list[int], list[float]]] = {}
    for (tag, step), (_, _, value) in sorted(best.items()):
        out.setdefault(tag, ([], []))[0].append(step)
        out[tag][1].append(value)
    return out, logged


def _write_files(tmp_path: Path, payload_files: list[list[bytes]]) -> list[Path]:
    return [write_raw(tmp_path / f"events.out.tfevents.{100 + i}.host", p) for i, p in enumerate(payload_files)]


LAYOUTS = {
    "restart in a new file": [
        [scalar_event("kl", 1.0, s, 100.0 + s) for s in range(50)],
        [scalar_event("kl", 2.0, s, 300.0 + s) for s in range(30, 60)],
    ],
    "a step logged twice in one file": [
        [scalar_event("kl", float(s), s, 100.0 + s) for s in range(40)]
        + [scalar_event("kl", -1.0, 7, 200.0), scalar_event("kl", -2.0, 3, 201.0)]
    ],
    "steps out of order": [[scalar_event("kl", float(s), s, 100.0 + i) for i, s in enumerate([5, 3, 9, 1, 3, 0])]],
    "an earlier wall time for a repeated step": [
        [scalar_event("kl", float(s), s, 500.0 + s) for s in range(30)]
        + [scalar_event("kl", -1.0, 10, 100.0), scalar_event("kl", -2.0, 12, 900.0)]
    ],
    "clocks that disagree across files": [
        [scalar_event("kl", 1.0, s, 1000.0 + s) for s in range(20)],
        [scalar_event("kl", 2.0, s, 10.0 + s) for s in range(10, 30)],
    ],
    "a START in a later block": [
        [scalar_event(t, float(s), s, 100.0 + s) for s in range(60) for t in ("kl", "reward")]
        + [session_start(25, 300.0)]
        + [scalar_event("kl", 9.0, s, 300.0 + s) for s in range(25, 40)]
    ],
    "a START in the second file": [
        [scalar_event("kl", 1.0, s, 100.0 + s) for s in range(50)],
        [session_start(20, 400.0)] + [scalar_event("kl", 3.0, s, 400.0 + s) for s in range(20, 35)],
    ],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block", [200, 1 << 20])
def test_restarts_and_repeated_steps_resolve_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, block: int
) -> None:
    monkeypatch.setattr(tensorboard, "CHUNK_BYTES", block)
    files = _write_files(tmp_path, LAYOUTS[layout])
    log = ScalarCache().read(files)
    expected, logged = _reference(LAYOUTS[layout])
    assert {t: (p.steps.tolist(), p.values.tolist()) for t, p in log.tags.items()} == expected
    assert log.points == logged
    kept = sum(len(s) for s, _ in expected.values())
    assert log.points == kept + log.duplicates + log.purged


def test_wall_times_are_read_again_only_when_a_duplicate_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    again: list[bool] = []
    original = tensorboard.read_event_file

    def counting(*args: object, **kwargs: object) -> EventFileRead:
        again.append(bool(kwargs.get("keep_walls")))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tensorboard, "read_event_file", counting)
    for layout, rereads in (("a step logged twice in one file", 0), ("an earlier wall time for a repeated step", 1)):
        again.clear()
        (files,) = [_write_files(tmp_path / layout.replace(" ", "-"), LAYOUTS[layout])]
        merge_reads([original(f) for f in files])
        assert again.count(True) == rereads, layout


def test_parts_read_as_the_file_grows_give_the_whole_read(tmp_path: Path) -> None:
    payloads = LAYOUTS["a START in a later block"][0] + [scalar_event("kl", 5.0, 3, 50.0)]
    data = b"".join(record(p) for p in payloads)
    path = tmp_path / "events.out.tfevents.1.host"
    cache = ScalarCache()
    for cut in (700, 3000, 3001, 5500, len(data)):
        path.write_bytes(data[:cut])
        log = cache.read([path])
    (resumed,) = cache._reads[path]  # each poll continued the one read (a long tag's fold goes on)
    assert resumed.start == 0 and resumed.end == len(data)
    whole = ScalarCache().read([path])
    assert {t: (p.steps.tolist(), p.values.tolist()) for t, p in log.tags.items()} == {
        t: (p.steps.tolist(), p.values.tolist()) for t, p in whole.tags.items()
    }
    assert (log.points, log.duplicates, log.purged, log.files, log.truncated) == (
        whole.points,
        whole.duplicates,
        whole.purged,
        whole.files,
        whole.truncated,
    )


def test_memory_of_a_read_is_its_points_plus_one_block(tmp_path: Path) -> None:
    """The read holds a block and its temporaries beside the points: not the file, not per-point objects."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
    from bench_tensorboard import write_event_file

    path = tmp_path / "events.out.tfevents.1.host"
    write_event_file(path, 200_000)  # 20 tags x 10,000 steps
    read_event_file(path)  # imports and tables first
    tracemalloc.start()
    try:
        log = merge_reads([read_event_file(path)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = sum(p.values.nbytes for p in log.tags.values()) + log.tags["train/kl"].steps.nbytes
    assert len({id(p.steps) for p in log.tags.values()}) == 1 and log.points == 200_000
    assert peak < kept + 12 * tensorboard.CHUNK_BYTES, (peak, kept)


def _crc_reference(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = int(TABLE[(crc ^ byte) & 0xFF]) ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_crcs_of_ranges_of_every_length_and_alignment() -> None:
    rng = np.random.default_rng(11)
    data = rng.integers(0, 256, 20_000, dtype=np.uint8)
    starts = rng.integers(0, 19_000, 3_000)
    lengths = np.concatenate([rng.integers(0, 300, 2_900), np.full(100, 57)])
    starts[-5:] = len(data) - lengths[-5:]  # ranges that end with the data: no room past them
    got = crc32c_many(data, starts, lengths)
    raw = data.tobytes()
    expected = [_crc_reference(raw[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
    assert got.tolist() == expected
