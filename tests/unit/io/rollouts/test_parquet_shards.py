"""Shards of a Parquet run: row ranges that end where a step ends, read in another process like the whole run.

What is right follows from the layout: a run's shards cover its rows once, in order, each ending at a step's
last row; reading the shards one after another yields the chunks' rows, steps and groups of the whole run, and
their counts (NaN rewards, group sizes) add up to the whole run's.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.rollouts.parquet import ParquetRun
from collapse_doctor.io.rollouts.table_run import TableRun
from tests.helpers.tables import make_table


def _run(tmp_path: Path) -> ParquetRun:
    table = make_table(steps=40, groups=8, text=False)  # 64 rows per step
    rewards = table.column("reward/correct").to_numpy().copy()
    rewards[::37] = np.nan
    table = table.set_column(table.schema.get_field_index("reward/correct"), "reward/correct", pa.array(rewards))
    pq.write_table(table.slice(0, 1000), tmp_path / "a.parquet", row_group_size=300)  # cuts inside a step
    pq.write_table(table.slice(1000), tmp_path / "b.parquet", row_group_size=256)
    return ParquetRun([tmp_path / "a.parquet", tmp_path / "b.parquet"], check_rewards_first=False)


def _concat(chunks: list, name: str) -> np.ndarray:
    return np.concatenate([getattr(c, name) for c in chunks])


def test_shards_cover_the_rows_once_and_end_at_step_ends(tmp_path: Path) -> None:
    run = _run(tmp_path)
    shards = run.shards(700)
    assert shards[0][0] == 0 and shards[-1][1] == run.num_rows == 2560
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shards))
    assert all(end % 64 == 0 for _, end in shards)  # 64 rows per step
    assert [end - start for start, end in shards] == [704, 704, 704, 448]  # the first step end at/after 700


def test_shards_read_elsewhere_give_the_whole_runs_chunks_and_counts(tmp_path: Path) -> None:
    whole = _run(tmp_path)
    expected = list(whole.iter_chunks(500))
    run = _run(tmp_path)
    parts = []
    for start, end in run.shards(700):
        shard = pickle.loads(pickle.dumps(run.shard(start, end)))  # as a Ray task gets it
        parts += list(shard.iter_chunks(500))
        run.add_notes(shard.notes)
    run.finish_shards()
    for name in ("rewards", "steps"):
        assert np.array_equal(_concat(expected, name), _concat(parts, name), equal_nan=True)
    row_steps = [np.concatenate([c.steps[c.step_index] for c in chunks]) for chunks in (expected, parts)]
    assert np.array_equal(*row_steps)
    assert run.notes.nan_rewards == whole.notes.nan_rewards and sum(run.notes.nan_rewards.values()) == 70
    assert run.notes.group_sizes == whole.notes.group_sizes == {8: 320}
    steps = [list(s.iter_steps()) for s in (run.shard(*r) for r in run.shards(700))]
    assert [b.step for part in steps for b in part] == list(range(40))
    assert np.array_equal(np.concatenate([b.row_ids for part in steps for b in part]), np.arange(2560))


def test_all_nan_rewards_are_still_an_error_after_the_shards(tmp_path: Path) -> None:
    table = make_table(steps=20, groups=4, channels=("a",), text=False)
    table = table.set_column(2, "reward/a", pa.array(np.full(table.num_rows, np.nan, dtype=np.float32)))
    pq.write_table(table, tmp_path / "nan.parquet", row_group_size=100)
    run = ParquetRun([tmp_path / "nan.parquet"], check_rewards_first=False)
    for start, end in run.shards(200):
        shard = run.shard(start, end)
        list(shard.iter_chunks(100))  # a shard alone does not judge the whole run
        run.add_notes(shard.notes)
    with pytest.raises(InputError, match="no finite reward in any channel"):
        run.finish_shards()


def test_steps_out_of_order_have_no_shards(tmp_path: Path) -> None:
    table = make_table(steps=10, groups=4, text=False)
    pq.write_table(table.take(pa.array(np.arange(table.num_rows)[::-1])), tmp_path / "r.parquet")
    assert ParquetRun([tmp_path / "r.parquet"]).shards(64) == []


def test_an_in_memory_table_run_is_reduced_where_it_was_read(tmp_path: Path) -> None:
    """A trainer layout read whole (JSONL, TRL completions) is small and lives in this process: no shards; it
    still pickles (its table with it) and reads the same after."""
    table = make_table(steps=10, groups=4, text=False)
    run = TableRun(table, label=tmp_path, sources=[tmp_path / "x.jsonl"])
    assert run.shards(64) == []
    again = pickle.loads(pickle.dumps(run))
    assert _concat(list(again.iter_chunks(1000)), "steps").tolist() == list(range(10))


def test_shards_planned_from_the_footers_read_no_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Ray the driver opens the run and plans its shards from the footers: row-group boundaries (300-row groups
    in a.parquet, 256 in b.parquet), at least 700 rows each, the rest joined to the last; its tasks read the steps."""
    from collapse_doctor.io.rollouts import parquet
    from collapse_doctor.io.rollouts.parquet import steps_read_in_tasks

    _run(tmp_path)  # writes the files

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a column was read")

    monkeypatch.setattr(parquet, "_iter_batches", no_reading)
    with steps_read_in_tasks():
        run = ParquetRun([tmp_path / "a.parquet", tmp_path / "b.parquet"], check_rewards_first=False)
    assert run.num_rows == 2560
    assert run.plan_shards(700) == [(0, 900), (900, 1768), (1768, 2560)]
    table = pa.table({"step": [3, 3, 1, 1], "reward/a": [1.0, 0.0, 1.0, 0.0], "group_id": [0, 0, 0, 0]})
    pq.write_table(table, tmp_path / "backwards.parquet", row_group_size=2)
    with steps_read_in_tasks():
        backwards = ParquetRun([tmp_path / "backwards.parquet"], check_rewards_first=False)
    assert backwards.plan_shards(1) == []  # the footers show a later row group starting lower: reduced locally
