"""TensorBoard event files: every point, both scalar encodings, framing errors, restarts, several runs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

from collapse_doctor import diagnose
from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.logs.tensorboard import read_event_file
from collapse_doctor.report.schemas import schema_text
from tests.helpers.paths import ROOT as REPO_ROOT
from tests.helpers.scalar_runs import (
    collapsed_series,
    record,
    scalar_event,
    session_start,
    trl_run,
    write_events,
    write_raw,
)

SCHEMA = json.loads(schema_text("scan"))


def _event_file(directory: Path) -> Path:
    return next(p for p in directory.rglob("*") if "tfevents" in p.name)


def test_reads_every_point_like_event_accumulator(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rng = np.random.default_rng(0)
    values = {"train/kl": rng.random(12_000), "train/reward": rng.random(12_000)}
    write_events(tmp_path / "run", values)
    log = ScalarCache().read([_event_file(tmp_path)])
    assert log.points == 24_000 and log.duplicates == 0
    accumulator = EventAccumulator(str(_event_file(tmp_path)), size_guidance={"scalars": 0})
    accumulator.Reload()
    for tag in values:
        expected = accumulator.Scalars(tag)
        assert len(expected) == 12_000  # more than EventAccumulator's default reservoir of 10,000
        np.testing.assert_array_equal(log.tags[tag].steps, [e.step for e in expected])
        np.testing.assert_array_equal(log.tags[tag].values, np.float32([e.value for e in expected]))


def test_tensor_scalars_and_simple_values(tmp_path: Path) -> None:
    path = write_raw(
        tmp_path / "events.out.tfevents.1.host",
        [scalar_event("a", 1.5, 0, 1.0), scalar_event("b", 2.5, 0, 1.0, tensor=True)],
    )
    log = ScalarCache().read([path])
    assert log.tags["a"].values.tolist() == [1.5]
    assert log.tags["b"].values.tolist() == [2.5]


def test_truncated_last_record_is_a_note_not_an_error(tmp_path: Path) -> None:
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(20)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])
    read = read_event_file(path)
    assert read.truncated and read.points == 19
    assert read.end == len(whole) - len(record(payloads[-1]))
    log = ScalarCache().read([path])
    assert any("incomplete" in note for note in log.notes())


def test_corrupt_record_names_the_byte_offset(tmp_path: Path) -> None:
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(5)]
    path = write_raw(tmp_path / "run" / "events.out.tfevents.1.host", payloads)
    data = bytearray(path.read_bytes())
    second = len(record(payloads[0]))
    data[second + 14] ^= 0xFF  # inside the second payload
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"corrupt TensorBoard record at byte {second} "):
        read_event_file(path)
    result = CliRunner().invoke(app, ["scan", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "checksum mismatch" in result.stderr


@pytest.mark.parametrize("where", ["length", "data"])
def test_checksums_checked_beside_the_decoding_still_come_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Large files check CRCs on a second thread while decoding: a bad record is still the one error, whatever the
    decoding found (here the damaged byte also breaks the record's shape)."""
    from collapse_doctor.io.logs import tensorboard

    monkeypatch.setattr(tensorboard, "PARALLEL_CHECK_RECORDS", 2)
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(50)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    data = bytearray(path.read_bytes())
    at = sum(len(record(p)) for p in payloads[:30])
    data[at + (9 if where == "length" else 14)] ^= 0xFF  # the length's CRC, or inside the payload
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"corrupt TensorBoard record at byte {at} \({where} checksum mismatch\)"):
        read_event_file(path)
    path.write_bytes(b"".join(record(p) for p in payloads))
    assert read_event_file(path).points == 50


def test_restarts_keep_the_latest_point_and_honour_session_start(tmp_path: Path) -> None:
    first = [scalar_event("train/kl", 1.0, s, 100.0 + s) for s in range(10)]
    # Restart from step 5: a START event purges steps >= 5 logged before it.
    first += [session_start(5, 200.0)] + [scalar_event("train/kl", 2.0, s, 200.0 + s) for s in range(5, 8)]
    write_raw(tmp_path / "events.out.tfevents.100.host", first)
    # A second file (a PyTorch restart without START): steps 7..9 again, later wall times win.
    write_raw(
        tmp_path / "events.out.tfevents.300.host", [scalar_event("train/kl", 3.0, s, 300.0 + s) for s in (7, 8, 9)]
    )
    log = ScalarCache().read(sorted(tmp_path.iterdir()))
    kl = log.tags["train/kl"]
    assert kl.steps.tolist() == list(range(10))
    assert kl.values.tolist() == [1.0] * 5 + [2.0] * 2 + [3.0] * 3
    assert log.purged == 5 and log.duplicates == 1
    assert log.points == 16


def test_incremental_reads_parse_only_new_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collapse_doctor.io.logs import tensorboard

    opened: list[int] = []
    source = tensorboard._Source

    def opening(path: Path, start: int, stop: int | None) -> tensorboard._Source:
        opened.append(start)
        return source(path, start, stop)

    monkeypatch.setattr(tensorboard, "_Source", opening)
    path = tmp_path / "events.out.tfevents.1.host"
    payloads = [scalar_event("train/kl", float(i), i, float(i)) for i in range(30)]
    data = b"".join(record(p) for p in payloads)
    ten = sum(len(record(p)) for p in payloads[:10])
    path.write_bytes(data[: ten + 5])  # ten records and a partial one
    cache = ScalarCache()
    assert cache.read([path]).tags["train/kl"].steps.tolist() == list(range(10))
    path.write_bytes(data)
    log = cache.read([path])
    assert log.tags["train/kl"].steps.tolist() == list(range(30)) and log.points == 30
    assert opened == [0, ten]  # the second read began where the first ended, and continued it
    assert [(r.start, r.end, r.records) for r in cache._reads[path]] == [(0, len(data), 30)]


def test_scan_of_a_scalar_only_run_reports_points_and_skips_rollout_detectors(tmp_path: Path) -> None:
    trl_run(tmp_path)
    out = tmp_path / "scan.json"
    result = CliRunner().invoke(app, ["scan", str(tmp_path), "--json", str(out)], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["run"]["scalar_points"] == 200 * 11
    assert data["run"]["scalar_framework"] == "trl"
    assert data["run"]["channels"] == ["correct_reward", "format_reward"]
    assert data["detectors"]["CD101"]["status"] == "skipped"
    assert data["detectors"]["CD501"]["status"] == "ran"
    assert data["scalars"]["series"]["kl"]["step"][:3] == [0, 1, 2]
    assert {row["channel"] for row in data["channels"]} == {"correct_reward", "format_reward"}
    assert "scalar log 2,200 points (trl)" in result.stdout
    assert "reward std peak -> now" in result.stdout
    markdown = tmp_path / "summary.md"
    assert CliRunner().invoke(app, ["scan", str(tmp_path), "--markdown", str(markdown)]).exit_code == 0
    assert "200 steps in the scalar log (2,200 points, trl), no rollouts" in markdown.read_text()


def test_several_runs_are_reported_side_by_side(tmp_path: Path) -> None:
    from tests.helpers.scalar_runs import trl_series

    write_events(tmp_path / "logs" / "good", trl_series())
    write_events(tmp_path / "logs" / "bad", collapsed_series())
    assert sorted(r.name for r in discover_runs([tmp_path / "logs"])) == ["bad", "good"]
    runner = CliRunner()
    result = runner.invoke(app, ["scan", str(tmp_path / "logs"), "--format", "json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["verdict"] == "collapsed" and data["exit_code"] == 1
    assert {r["run"]["name"]: r["verdict"] for r in data["runs"]} == {"bad": "collapsed", "good": "healthy"}
    for run in data["runs"]:
        jsonschema.validate(run, SCHEMA)
    text = runner.invoke(app, ["scan", str(tmp_path / "logs")], env={"NO_COLOR": "1"})
    assert "run bad:" in text.stdout and "run good:" in text.stdout
    good = runner.invoke(app, ["scan", str(tmp_path / "logs"), "--run", "good", "--format", "json"])
    assert good.exit_code == 0 and json.loads(good.stdout)["run"]["name"] == "good"
    missing = runner.invoke(app, ["scan", str(tmp_path / "logs"), "--run", "other"])
    assert missing.exit_code == 2 and "matches no run; found: bad, good" in missing.stderr
    junit = runner.invoke(app, ["scan", str(tmp_path / "logs"), "--junit", str(tmp_path / "j.xml")])
    assert junit.exit_code == 1 and (tmp_path / "j.xml").read_text().count("<testsuite ") == 2
    with pytest.raises(Exception, match="found 2 runs"):
        diagnose([tmp_path / "logs"], ScanOptions.of(device="cpu"))


def test_sample_trl_tensorboard_log() -> None:
    sample = REPO_ROOT / "sample_logs" / "trl-tensorboard"
    diagnosis = diagnose([sample], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_points == 2200 and diagnosis.run.scalar_framework == "trl"
    found = {(f.code, f.channels, f.onset_step) for f in diagnosis.findings}
    # entropy falls while the reward rises (0.3 -> 0.65): convergence, not CD503
    assert found == {("CD505", ("format_reward",), 100)}


@pytest.mark.parametrize("new_length", [3, 1 << 40], ids=["shorter", "past-the-end"])
def test_corrupt_length_names_its_record(new_length: int, tmp_path: Path) -> None:
    payloads = [scalar_event("train/kl", 0.1 * i, i, float(i)) for i in range(6)]
    path = write_raw(tmp_path / "events.out.tfevents.1.host", payloads)
    data = bytearray(path.read_bytes())
    third = sum(len(record(p)) for p in payloads[:2])
    data[third : third + 8] = new_length.to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"corrupt TensorBoard record at byte {third} \\(length checksum"):
        read_event_file(path)


def _walk_one_by_one(data: bytes) -> tuple[list[int], list[int], bool]:
    """The reference walk: one header after the other."""
    starts, lengths, pos = [], [], 0
    while pos <= len(data) - 12:
        length = int.from_bytes(data[pos : pos + 8], "little")
        starts.append(pos)
        lengths.append(length)
        pos += length + 16
    truncated = pos != len(data)
    if pos > len(data):
        starts.pop()
        lengths.pop()
    return starts, lengths, truncated


@pytest.mark.parametrize(
    "layout", ["periodic", "periodic with breaks", "random", "cut mid-record", "scalars and one odd record a step"]
)
def test_the_guessing_walk_finds_what_the_one_by_one_walk_finds(layout: str) -> None:
    """The walk guesses blocks of records from the repeating pattern of lengths and checks every guess against the
    data: the records it finds are exactly the one-by-one walk's, whatever the layout."""
    from collapse_doctor.io.logs.tensorboard import _walk

    rng = np.random.default_rng(len(layout))
    pattern = [int(n) for n in rng.integers(1, 60, 7)]
    out = bytearray()
    for i in range(20_000):
        size = pattern[i % 7] if layout != "random" else int(rng.integers(1, 60))
        if layout == "periodic with breaks" and i % 997 == 0:
            size = int(rng.integers(1, 60))
        if layout.startswith("scalars") and i % 8 == 7:  # a histogram or text record of its own size each step
            size = int(rng.integers(100, 3000))
        out += size.to_bytes(8, "little") + bytes(4) + bytes(rng.integers(0, 256, size, dtype=np.uint8)) + bytes(4)
    data = bytes(out[:-9] if layout == "cut mid-record" else out)
    starts, lengths, truncated, _ = _walk(data)
    expected = _walk_one_by_one(data)
    assert (starts.tolist(), lengths.tolist(), truncated) == expected
    assert len(expected[0]) == (19_999 if layout == "cut mid-record" else 20_000)


def test_tags_that_decode_alike_are_one_tag() -> None:
    """Two tags whose bytes differ but are both invalid UTF-8 decode to the same text (as protobuf's parser gives
    it): one tag, every index pointing at it."""
    from collapse_doctor.io.logs.event_fastpath import _tag_ids

    buf = np.frombuffer(b"\xff\xfeok" + bytes(32), dtype=np.uint8)
    names, ids = _tag_ids(buf, np.array([0, 1, 2, 0]), np.array([1, 1, 2, 1]))
    assert names == ["\ufffd", "ok"] and ids.tolist() == [0, 0, 1, 0]
