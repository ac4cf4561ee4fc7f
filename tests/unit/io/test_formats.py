"""The format registry: every format is recognised, named in the hint and read; discovery follows it."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ReadOptions
from collapse_doctor.io import formats
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.formats import (
    FORMATS,
    FORMATS_HINT,
    PER_STEP_KINDS,
    ROLLOUT_KINDS,
    ROLLOUTS,
    SCALARS,
    Format,
    classify,
    formats_hint,
    is_per_step,
    register,
)
from collapse_doctor.io.logs.tensorboard import EventFileRead
from collapse_doctor.io.logs.trainer_logs import records_to_read
from collapse_doctor.io.open import open_rollouts, read_scalar_log
from collapse_doctor.io.rollouts.parquet import ParquetRun
from collapse_doctor.io.rollouts.table_run import TableRun
from tests.helpers.scalar_runs import scalar_event, write_raw
from tests.helpers.tables import make_table
from tests.helpers.trackers import TRACKER_KINDS, one_point_file


def _jsonl(path: Path, rows: Sequence[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(root: Path) -> Path:
    path = root / "rollouts.parquet"
    pq.write_table(make_table(steps=2, groups=2, group_size=4), path)
    return path


def _trl(root: Path) -> Path:
    path = root / "completions" / "completions_00001.parquet"
    path.parent.mkdir(parents=True)
    prompts = [f"q{g}" for g in range(2) for _ in range(4)]
    completions = [f"a{i}" for i in range(8)]
    table = {"step": [1] * 8, "prompt": prompts, "completion": completions, "format_reward": [0.0, 1.0] * 4}
    pq.write_table(pa.table(table), path)
    return path


def _verl(root: Path) -> Path:
    rows = [{"input": f"q{i // 4}", "output": f"a{i}", "score": float(i % 2), "step": 1} for i in range(8)]
    return _jsonl(root / "rollout_data" / "1.jsonl", rows)


def _nemo(root: Path) -> Path:
    rows = [{"content": [f"q{i // 4}", f"a{i}"], "rewards": float(i % 2)} for i in range(8)]
    return _jsonl(root / "train_data_step1.jsonl", rows)


def _events(root: Path) -> Path:
    return write_raw(root / "events.out.tfevents.1.host", [scalar_event("train/kl", 0.1, 1, 1.0)])


def _trainer_state(root: Path) -> Path:
    path = root / "trainer_state.json"
    path.write_text(json.dumps({"log_history": [{"step": 1, "loss": 0.5}]}))
    return path


def _verl_file_log(root: Path) -> Path:
    return _jsonl(root / "metrics.jsonl", [{"step": 1, "data": {"critic/score/mean": 0.5}}])


def _completions_rows() -> list[dict[str, object]]:
    """TRL's completions table of one step: 2 prompts x 4 completions (tests/e2e/test_tracker_tables.py has the
    tables TRL itself logged through wandb and trackio)."""
    return [
        {"step": 1, "prompt": f"q{i // 4}", "completion": f"a{i}", "format_reward": float(i % 2), "advantage": 0.0}
        for i in range(8)
    ]


def _wandb_table(root: Path) -> Path:
    """W&B's layout of a logged table: ``{"columns": [...], "data": [[...], ...]}`` under files/media/table/."""
    path = root / "wandb" / "offline-run-20261205_000000-abc123" / "files" / "media" / "table"
    path.mkdir(parents=True)
    rows = _completions_rows()
    columns = list(rows[0])
    table = {"columns": columns, "data": [[row[c] for c in columns] for row in rows]}
    (path / "completions_3_0f1e2d.table.json").write_text(json.dumps(table))
    return path / "completions_3_0f1e2d.table.json"


def _trackio_table(root: Path) -> Path:
    """Trackio's schema (0.43): one ``metrics`` row per log call, a table as ``{"_type": "trackio.table",
    "_value": [row objects]}``."""
    import sqlite3

    path = root / "project.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE metrics (id INTEGER PRIMARY KEY, run_id TEXT, timestamp TEXT, run_name TEXT, "
            "step INTEGER, metrics TEXT)"
        )
        table = {"completions": {"_type": "trackio.table", "_value": _completions_rows()}}
        db.execute("INSERT INTO metrics VALUES (1, 'r', 't', 'run', 1, ?)", (json.dumps({"train/kl": 0.1}),))
        db.execute("INSERT INTO metrics VALUES (2, 'r', 't', 'run', 2, ?)", (json.dumps(table).encode(),))
    return path


WRITERS: dict[str, Callable[[Path], Path]] = {
    "parquet": _parquet,
    "trl_completions": _trl,
    "verl_rollouts": _verl,
    "nemo_rl": _nemo,
    "events": _events,
    "trainer_state": _trainer_state,
    "verl_file_log": _verl_file_log,
    "wandb_table": _wandb_table,
    "trackio_table": _trackio_table,
    **{kind: partial(one_point_file, kind) for kind in TRACKER_KINDS},
}
"""A small file of each built-in format, as its trainer writes it."""


def test_every_format_has_a_writer_here() -> None:
    assert set(WRITERS) == set(FORMATS), "add a writer for the new format to WRITERS"


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_every_format_is_recognised_and_read_by_its_entry(tmp_path: Path, kind: str) -> None:
    path = WRITERS[kind](tmp_path)
    fmt = FORMATS[kind]
    if fmt.open_member is not None:  # inside a tracker database: found by discovery, read per run
        [run] = discover_runs([path])
        assert classify(path) == "trackio" and run.rollout_kind == kind and run.member == "run"
        reader = open_rollouts(run, ReadOptions())
        assert reader is not None and reader.num_rows == 8 and next(reader.iter_steps()).num_groups == 2
        return
    assert classify(path) == kind
    if fmt.role == ROLLOUTS:
        assert fmt.open is not None
        reader = fmt.open([path], ReadOptions(), True)
        assert reader.num_rows == 8 or kind == "parquet"
        assert next(reader.iter_steps()).num_groups == 2
        assert reader.dynamic_weight_channels == ()
    else:
        assert fmt.read is not None
        assert fmt.read(path, 0).points == 1


def test_files_of_no_format_are_not_recognised(tmp_path: Path) -> None:
    for name in ("notes.txt", "metrics.csv", "config.json"):
        (tmp_path / name).write_text("x")
        assert classify(tmp_path / name) is None
    assert classify(_jsonl(tmp_path / "other.jsonl", [{"a": 1}])) is None


def test_the_hint_names_every_format_rollouts_first() -> None:
    assert all(fmt.hint in FORMATS_HINT for fmt in FORMATS.values())
    assert (
        FORMATS_HINT
        == formats_hint()
        == (
            "collapse-doctor reads Parquet rollout tables, TRL completions/completions_<step>.parquet, verl "
            "<rollout_data_dir>/<step>.jsonl, NeMo-RL train_data_step<N>.jsonl, TRL completions tables in W&B run "
            "directories (files/media/table/completions_*.table.json), TRL completions tables in Trackio "
            "databases, TensorBoard event files, "
            "W&B run files (wandb/run-*/run-<id>.wandb), Trackio project databases (<project>.db), MLflow SQLite "
            "stores (mlflow.db), MLflow file stores (mlruns/), "
            "trainer_state.json and verl file-logger JSONL (docs/input-formats.md); rename rollout dumps to those "
            "names, and map a Parquet table's own column names with --step-col, --group-col or --group-size, and "
            "--reward-cols"
        )
    )


def test_kind_sets_come_from_the_registry() -> None:
    by_rank = sorted(FORMATS.values(), key=lambda f: f.rank)
    assert tuple(f.kind for f in by_rank if f.role == ROLLOUTS) == ROLLOUT_KINDS
    assert ROLLOUT_KINDS == ("parquet", "trl_completions", "verl_rollouts", "nemo_rl", "wandb_table", "trackio_table")
    assert tuple(f.kind for f in by_rank if f.per_step) == PER_STEP_KINDS
    assert PER_STEP_KINDS == ("trl_completions", "verl_rollouts", "nemo_rl")
    assert all(is_per_step(kind) == (kind in PER_STEP_KINDS) for kind in FORMATS)


def _nested_runs(root: Path) -> list[list[str]]:
    """Event files at the top, two rollout sets of different kinds below: how discovery groups them."""
    _events(root)
    _verl(root / "a")
    _nemo(root / "b")
    runs = discover_runs([root / "events.out.tfevents.1.host", root / "a", root / "b"])
    return sorted(sorted([r.rollout_kind or "-", *r.scalar_logs]) for r in runs)


def test_discovery_handles_sets_in_registry_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Events rank first: their run takes the first rollout set nested in it; the second is a run of its own.
    assert _nested_runs(tmp_path / "first") == [["events", "verl_rollouts"], ["nemo_rl"]]
    monkeypatch.setitem(FORMATS, "events", replace(FORMATS["events"], rank=20))
    # Ranked after the rollouts, the event dir is nested with both rollout runs and becomes a run of its own.
    assert _nested_runs(tmp_path / "last") == [["-", "events"], ["nemo_rl"], ["verl_rollouts"]]


def test_register_refuses_a_kind_twice_and_checks_the_entry() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(FORMATS["parquet"])
    with pytest.raises(ValueError, match="needs `open`"):
        Format(kind="x", role=ROLLOUTS, recognise=lambda p, _: False, hint="x", rank=5)
    with pytest.raises(ValueError, match="needs `read`"):
        Format(kind="x", role=SCALARS, recognise=lambda p, _: False, hint="x", rank=5)


# A made-up format, registered only here: CSV rollout tables and CSV scalar logs.


def _open_csv(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    rows = [row for path in files for row in csv.DictReader(path.open())]
    table = pa.table(
        {
            "step": pa.array([int(r["step"]) for r in rows], pa.int64()),
            "group_id": pa.array([int(r["group"]) for r in rows], pa.int64()),
            "reward/correct": pa.array([float(r["correct"]) for r in rows], pa.float64()),
        }
    )
    return TableRun(table, label=files[0].parent, sources=files, **read.reader_kwargs())


def _read_csv_scalars(path: Path, start: int) -> EventFileRead:
    records = [(int(r["step"]), {"train/kl": float(r["kl"])}) for r in csv.DictReader(path.open())]
    return records_to_read(path, records)


CSV_ROLLOUTS = Format(
    kind="csv_rollouts",
    role=ROLLOUTS,
    recognise=lambda path, _: path.name.endswith(".rollouts.csv"),
    hint="CSV rollouts",
    rank=5,
    per_step=True,
    open=_open_csv,
)
CSV_SCALARS = Format(
    kind="csv_scalars",
    role=SCALARS,
    recognise=lambda path, first_line: path.suffix == ".csv" and first_line().startswith("step,kl"),
    hint="CSV scalars",
    rank=9,
    read=_read_csv_scalars,
    precedence=5,
)


def test_a_format_registered_in_a_test_is_discovered_and_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FORMATS, CSV_ROLLOUTS.kind, CSV_ROLLOUTS)
    monkeypatch.setitem(FORMATS, CSV_SCALARS.kind, CSV_SCALARS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rng = np.random.default_rng(0)
    for step in (1, 2):
        lines = ["step,group,correct"] + [f"{step},{i // 4},{rng.integers(0, 2)}" for i in range(8)]
        (run_dir / f"step{step}.rollouts.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "metrics.csv").write_text("step,kl\n1,0.1\n2,0.2\n")
    (run_dir / "notes.csv").write_text("a,b\n")  # a CSV of no format: ignored

    [run] = discover_runs([run_dir])
    assert run.rollout_kind == "csv_rollouts" and len(run.rollout_files) == 2
    assert run.scalar_kind == "csv_scalars" and run.scalar_files() == [run_dir / "metrics.csv"]
    assert is_per_step("csv_rollouts") and "CSV rollouts" in formats.formats_hint()
    reader = open_rollouts(run, ReadOptions())
    assert reader is not None and reader.channels == ("correct",)
    assert [b.step for b in reader.iter_steps()] == [1, 2]
    scalars = read_scalar_log(run)
    assert scalars is not None and scalars.framework == "trl"
    np.testing.assert_allclose(scalars.series["kl"].values, [0.1, 0.2])


def test_without_the_entry_the_made_up_files_are_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "step1.rollouts.csv").write_text("step,group,correct\n1,0,1\n")
    with pytest.raises(InputError, match="no run found in this directory"):
        discover_runs([tmp_path])


def test_a_trl_output_dir_with_both_rollout_sources_is_one_run_read_once(tmp_path: Path) -> None:
    """TRL's completions/ beside the callback's rollouts/ in one output dir: one run, from rollouts/; each alone is
    read as before; two rollouts/ parts beside completions/ stay one source."""
    out = tmp_path / "out"
    _trl(out)
    parts = out / "rollouts"
    parts.mkdir()
    for first in (1, 3):  # two parts of one run: steps 1-2 and 3-4
        table = make_table(steps=2, groups=2, group_size=4)
        steps = pa.array(np.asarray(table["step"]) + first, pa.int64())
        pq.write_table(
            table.set_column(table.schema.get_field_index("step"), "step", steps), parts / f"part-{first:06d}.parquet"
        )
    _events(out / "runs" / "x")
    [run] = discover_runs([out])
    assert run.rollout_kind == "parquet" and run.rollout_files == sorted(parts.glob("*.parquet"))
    assert "events" in run.scalar_logs
    [note] = run.set_aside
    assert str(out / "completions") in note and "read once" in note
    (out / "rollouts" / "part-000001.parquet").unlink()
    (out / "rollouts" / "part-000003.parquet").unlink()
    parts.rmdir()
    [alone] = discover_runs([out])
    assert alone.rollout_kind == "trl_completions" and alone.set_aside == ()
