"""Tracker readers (W&B run files, Trackio project databases, MLflow stores) on files the real libraries wrote."""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.core.scalars import ScalarSeries
from collapse_doctor.io.discovery import RunInputs, choose_run, discover_runs
from collapse_doctor.io.formats import FORMATS, classify
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.logs.wandb_log import read_wandb_log
from collapse_doctor.io.open import read_scalar_log
from tests.helpers.scalar_runs import collapsed_series
from tests.helpers.trackers import NAN_TAG, STEPS, VERL_KEYS, Corpus, shared_tracker_corpus

BLOCK = 32 * 1024


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_tracker_corpus(tmp_path_factory)


def _wandb_file(corpus: Corpus, name: str) -> Path:
    return next(corpus.wandb_runs[name].glob("run-*.wandb"))


def _run(path: Path, name: str | None = None) -> RunInputs:
    runs = discover_runs([path])
    return choose_run(runs, name)


def _scalars(run: RunInputs) -> ScalarSeries:
    scalars = read_scalar_log(run)
    assert scalars is not None
    return scalars


# What each tracker holds, read back: the values logged, at the trainer's steps.

TRL_RUNS = {
    "wandb": lambda c: _run(c.wandb, c.wandb_runs["trl-collapsed"].name),
    "trackio": lambda c: _run(c.trackio, "trl-project/trl-collapsed"),
    "mlflow_db": lambda c: _run(c.mlflow_db.parent, "mlflow/trl-collapsed"),
    "mlflow_files": lambda c: _run(c.mlruns, "mlruns/trl-collapsed"),
}


@pytest.mark.parametrize("tracker", sorted(TRL_RUNS))
def test_a_trl_run_reads_the_values_logged_at_the_global_steps(corpus: Corpus, tracker: str) -> None:
    run = TRL_RUNS[tracker](corpus)
    assert run.scalar_kind == tracker
    scalars = _scalars(run)
    assert scalars.framework == "trl"
    logged = collapsed_series(0)
    for tag, values in logged.items():
        name = next((n for n, t in scalars.tags.items() if t == tag), None)
        assert name is not None, f"{tag} not mapped; tags: {scalars.tags}"
        points = scalars.series[name]
        np.testing.assert_array_equal(points.steps, STEPS)
        np.testing.assert_allclose(points.values, values, rtol=1e-12)
    # Bookkeeping and non-scalars are no series; a NaN stays NaN.
    assert "train/global_step" not in scalars.raw_tags and "train/completions/sample" not in scalars.raw_tags
    assert NAN_TAG in scalars.raw_tags


def test_a_logged_table_is_no_series_and_no_restart(corpus: Corpus) -> None:
    """TRL's `completions` table (log_completions=True) is logged after the metrics at every logging step; its
    bookkeeping keys (`completions/ncols`, `nrows`, `size`) are the table file's, not training metrics."""
    run = TRL_RUNS["wandb"](corpus)
    log = ScalarCache().read(run.scalar_files(), "wandb")
    assert not [tag for tag in log.tags if tag.startswith("completions")]
    assert not [note for note in log.notes() if "again" in note or "twice" in note]


def test_the_same_values_read_through_tensorboard_and_every_tracker_are_equal(corpus: Corpus) -> None:
    events = _scalars(_run(corpus.events_trl))
    for tracker, run_of in TRL_RUNS.items():
        scalars = _scalars(run_of(corpus))
        assert {name: scalars.tags[name] for name in events.tags} == events.tags, tracker
        for name, points in events.series.items():
            np.testing.assert_array_equal(scalars.series[name].steps, points.steps)
            # TensorBoard keeps float32 (simple_value), the trackers float64.
            np.testing.assert_allclose(scalars.series[name].values, points.values, rtol=1e-6)


@pytest.mark.parametrize(
    ("path_of", "name"),
    [
        (lambda c: c.wandb, None),
        (lambda c: c.trackio, "verl-project/verl-collapsed"),
        (lambda c: c.mlflow_db.parent, "mlflow/verl-collapsed"),
    ],
    ids=["wandb", "trackio", "mlflow_db"],
)
def test_verl_runs_keep_verl_names_at_verl_steps(corpus: Corpus, path_of: object, name: str | None) -> None:
    path = path_of(corpus)  # type: ignore[operator]
    run = _run(path, name or corpus.wandb_runs["verl-collapsed"].name)
    scalars = _scalars(run)
    assert scalars.framework == "verl"
    logged = collapsed_series(0)
    for trl_tag, verl_tag in VERL_KEYS.items():
        name_of = next(n for n, t in scalars.tags.items() if t == verl_tag)
        np.testing.assert_array_equal(scalars.series[name_of].steps, STEPS)
        np.testing.assert_allclose(scalars.series[name_of].values, logged[trl_tag], rtol=1e-12)


def test_nan_values_stay_nan(corpus: Corpus) -> None:
    for tracker, run_of in TRL_RUNS.items():
        log = ScalarCache().read(run_of(corpus).scalar_files(), member=run_of(corpus).member)
        values = log.tags[NAN_TAG].values
        assert len(values) == len(STEPS) and np.isnan(values).all(), tracker


# Discovery: one run per tracker run, picked by --run.


def test_every_run_of_a_database_is_its_own_run(corpus: Corpus) -> None:
    names = sorted(r.name for r in discover_runs([corpus.trackio]))
    assert names == ["trl-project/trl-collapsed", "trl-project/trl-healthy", "verl-project/verl-collapsed"]
    mlflow = sorted(r.name for r in discover_runs([corpus.mlflow_db]))
    assert mlflow == ["mlflow/no-metrics", "mlflow/trl-collapsed", "mlflow/verl-collapsed"]  # deleted: skipped
    assert sorted(r.name for r in discover_runs([corpus.mlruns])) == ["mlruns/trl-collapsed"]
    wandb = discover_runs([corpus.wandb])
    assert sorted(r.name for r in wandb) == sorted(p.name for p in corpus.wandb_runs.values())
    assert all(r.scalar_kind == "wandb" and r.member is None for r in wandb)


def test_run_is_picked_by_full_or_bare_name_or_wandb_id(corpus: Corpus) -> None:
    runs = discover_runs([corpus.trackio])
    assert choose_run(runs, "trl-healthy").name == "trl-project/trl-healthy"
    assert choose_run(runs, "trl-project/trl-collapsed").member == "trl-collapsed"
    run_dir = corpus.wandb_runs["trl-collapsed"]
    run_id = run_dir.name.rsplit("-", 1)[1]
    assert choose_run(discover_runs([corpus.wandb]), run_id).root == run_dir
    assert choose_run(discover_runs([corpus.wandb]), "verl-collapsed").root == corpus.wandb_runs["verl-collapsed"]
    everything = discover_runs([corpus.root])
    with pytest.raises(UsageError, match=r"matches [0-9]+ runs"):
        choose_run(everything, "trl-collapsed")
    with pytest.raises(UsageError, match=r"found [0-9]+ runs"):
        choose_run(runs, None)


def test_databases_are_recognised_by_content(corpus: Corpus, tmp_path: Path) -> None:
    assert classify(corpus.trackio / "trl-project.db") == "trackio"
    assert classify(corpus.mlflow_db) == "mlflow_db"
    garbage = tmp_path / "cache.db"
    garbage.write_bytes(b"not a database\n" * 100)
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE metrics (name TEXT, value REAL)")
    assert classify(garbage) is None and classify(other) is None
    # Beside a real run they are ignored; named explicitly they are one line naming the file.
    shutil.copy(corpus.mlflow_db, tmp_path / "mlflow.db")
    assert len(discover_runs([tmp_path])) == 3
    with pytest.raises(InputError, match=r"cache.db: not an SQLite database"):
        discover_runs([garbage])
    with pytest.raises(
        InputError, match=r"app.sqlite: an SQLite database without a tracker's tables \(found: metrics\)"
    ):
        discover_runs([other])


def test_a_store_without_runs_named_explicitly_is_an_error(corpus: Corpus) -> None:
    with pytest.raises(InputError, match=r"mlflow\.db: holds no runs"):
        discover_runs([corpus.empty_db])
    with pytest.raises(InputError, match="no run found"):
        discover_runs([corpus.empty_db.parent])


def test_a_database_with_several_runs_read_whole_names_them(corpus: Corpus) -> None:
    with pytest.raises(UsageError, match="holds 3 runs: trl-collapsed, no-metrics, verl-collapsed"):
        FORMATS["mlflow_db"].read(corpus.mlflow_db, 0)  # type: ignore[misc]


def test_databases_are_read_without_changing_them(corpus: Corpus, tmp_path: Path) -> None:
    for db in (corpus.trackio / "trl-project.db", corpus.mlflow_db):
        copy = tmp_path / db.stem / db.name
        copy.parent.mkdir()
        shutil.copy(db, copy)
        before = sorted(p.name for p in copy.parent.iterdir()), copy.read_bytes(), copy.stat().st_mtime_ns
        for run in discover_runs([copy]):
            read_scalar_log(run)
        # No -wal / -shm left behind (Trackio's database is in WAL mode), nothing written.
        assert (sorted(p.name for p in copy.parent.iterdir()), copy.read_bytes(), copy.stat().st_mtime_ns) == before


def test_a_damaged_database_is_one_line(corpus: Corpus, tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    data = bytearray(corpus.mlflow_db.read_bytes())
    data[4096 : len(data)] = b"\xff" * (len(data) - 4096)  # every page after the first overwritten
    db.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"mlflow.db: cannot read the SQLite database"):
        discover_runs([db])


# W&B framing, on the files wandb wrote.


def _chunks(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, length) of every chunk: an independent walk of the LevelDB-log framing."""
    out, pos = [], 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        assert zlib.crc32(data[pos + 7 : pos + 7 + length], zlib.crc32(bytes([kind]))) == crc
        out.append((pos, kind, length))
        pos += 7 + length
    return out


def test_wandb_file_spans_blocks_and_every_history_row_is_read(corpus: Corpus) -> None:
    path = _wandb_file(corpus, "trl-collapsed")
    data = path.read_bytes()
    assert data[:7] == b":W&B\xe1\xbe\x00"
    kinds = [kind for _, kind, _ in _chunks(data)]
    assert len(data) > 2 * BLOCK and 2 in kinds and 4 in kinds  # records split across blocks: FIRST ... LAST
    read = read_wandb_log(path)
    assert not read.truncated and read.end == len(data)
    assert sorted(set(read.steps.tolist())) == STEPS.tolist()


def _cut_points(data: bytes) -> list[int]:
    chunks = _chunks(data)
    split = next(pos for pos, kind, _ in chunks if kind == 2)
    return [
        split + 3,  # inside a chunk header
        split + 100,  # inside a FIRST chunk's data
        next(pos for pos, kind, _ in chunks if pos > split and kind == 4) + 2,  # between FIRST and LAST
        len(data) - 1,
    ]


def test_a_wandb_file_being_written_reads_to_its_last_whole_record(corpus: Corpus, tmp_path: Path) -> None:
    data = _wandb_file(corpus, "trl-collapsed").read_bytes()
    full = read_wandb_log(_wandb_file(corpus, "trl-collapsed"))
    live = tmp_path / "run-live.wandb"
    for cut in _cut_points(data):
        live.write_bytes(data[:cut])
        part = read_wandb_log(live)
        assert part.truncated and part.end <= cut
        assert part.points < full.points or cut == len(data) - 1
        # The points read are the first ones of the whole file.
        np.testing.assert_array_equal(part.steps, full.steps[: part.points])
        # Reading on from where it stopped, once the rest is there, gives the whole file.
        cache = ScalarCache()
        cache.read([live], "wandb")
        live.write_bytes(data)
        resumed = cache.read([live], "wandb")
        whole = ScalarCache().read([live], "wandb")
        assert resumed.points == whole.points == full.points and not resumed.truncated
        for tag, points in whole.tags.items():
            np.testing.assert_array_equal(resumed.tags[tag].values, points.values)


def test_a_cut_wandb_file_is_noted_in_the_scan(corpus: Corpus, tmp_path: Path) -> None:
    data = _wandb_file(corpus, "trl-collapsed").read_bytes()
    live = tmp_path / "wandb" / "run-20261201_000000-live" / "run-live.wandb"
    live.parent.mkdir(parents=True)
    live.write_bytes(data[: _cut_points(data)[1]])
    scalars = _scalars(_run(tmp_path))
    assert any("last record incomplete" in note and "run-live.wandb" in note for note in scalars.notes)


def test_a_wandb_checksum_mismatch_names_the_byte(corpus: Corpus, tmp_path: Path) -> None:
    data = bytearray(_wandb_file(corpus, "trl-collapsed").read_bytes())
    offset, _, _ = _chunks(bytes(data))[40]
    data[offset + 10] ^= 0xFF
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"run-bad.wandb: corrupt W&B record at byte {offset} \(checksum mismatch\)"):
        read_wandb_log(bad)


def test_a_file_without_the_wandb_header_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"\x00" * 64 + b"hello")
    with pytest.raises(InputError, match=r"run-x.wandb: not a W&B run file \(no ':W&B' header\)"):
        read_wandb_log(bad)
    empty = tmp_path / "run-y.wandb"
    empty.write_bytes(b"")
    assert read_wandb_log(empty).points == 0


def test_without_wandb_installed_the_hint_names_the_extra(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb.proto", None)
    monkeypatch.setitem(sys.modules, "wandb.proto.wandb_internal_pb2", None)
    with pytest.raises(InputError, match=r"pip install 'collapse-doctor\[wandb\]'"):
        read_wandb_log(_wandb_file(corpus, "trl-collapsed"))


def test_typed_history_values_and_nested_keys_are_read(tmp_path: Path) -> None:
    """wandb 0.31 writes ``value_json``; the typed ``value`` oneof (newer writers) is read too."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for step in range(3):
        record = pb.Record(num=step + 1)
        history = record.history
        history.item.add(key="_step", value_json=str(step))
        history.item.add(key="train/kl", number=0.5 + step)
        history.item.add(nested_key=["train", "rewards", "fmt", "mean"], integer=step)
        history.item.add(key="flag", boolean=True)
        history.item.add(key="note", text="x")
        rows.append(record.SerializeToString())
    data = bytearray(b":W&B\xe1\xbe\x00")
    for payload in rows:
        data += struct.pack("<IHB", zlib.crc32(payload, zlib.crc32(b"\x01")), len(payload), 1) + payload
    path = tmp_path / "run-typed.wandb"
    path.write_bytes(bytes(data))
    log = ScalarCache().read([path], "wandb")
    assert sorted(log.tags) == ["train/kl", "train/rewards/fmt/mean"]
    np.testing.assert_array_equal(log.tags["train/kl"].values, [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(log.tags["train/rewards/fmt/mean"].steps, [0, 1, 2])


def test_a_database_being_written_is_read_to_its_last_commit(corpus: Corpus, tmp_path: Path) -> None:
    db = tmp_path / "trl-project.db"
    shutil.copy(corpus.trackio / "trl-project.db", db)
    [run] = [r for r in discover_runs([db]) if r.member == "trl-collapsed"]
    before = _scalars(run).series["kl"]
    writer = sqlite3.connect(db)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the writer holds the write lock, its row not committed yet
        writer.execute(
            "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, ?, ?, ?, ?)",
            ("x", "2026-12-01T00:00:00+00:00", "trl-collapsed", 0, '{"train/kl": 7.5, "train/global_step": 402}'),
        )
        during = _scalars(run).series["kl"]
        np.testing.assert_array_equal(during.values, before.values)
        writer.commit()
    finally:
        writer.close()
    after = _scalars(run).series["kl"]
    assert after.steps[-1] == 402 and after.values[-1] == 7.5 and len(after.steps) == len(before.steps) + 1


def test_reading_a_wandb_file_starts_no_thread_or_process(corpus: Corpus) -> None:
    """Only wandb's record definitions are imported: no service process, no thread, nothing sent."""
    code = (
        "import os, sys, threading\n"
        "from collapse_doctor.io.logs.wandb_log import read_wandb_log\n"
        "read = read_wandb_log(sys.argv[1])\n"
        "def parent(pid):\n"
        "    try:\n"
        "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
        "    except OSError:\n"
        "        return None\n"
        "children = [p for p in os.listdir('/proc') if p.isdigit() and parent(p) == str(os.getpid())]\n"
        "print(read.points, threading.active_count(), len(children))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(_wandb_file(corpus, "trl-collapsed"))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    ).stdout.split()
    assert int(out[0]) > 0 and out[1:] == ["1", "0"]
