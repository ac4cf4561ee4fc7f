"""Shards planned from the footers (``--ray``'s one run), each task reading its own steps, without Ray.

What is right follows from the layout, not from the tool: the driver reads the files' footers only (pass 1 runs
in the tasks); every step is reduced once, whole, with all its groups, wherever the row groups and files cut it;
so the per-step series, the counts, pass 1's step ends and the aggregation labels are the local scan's, bit for
bit. Steps out of order are found by the tasks (or already in the footers) and the run is then reduced locally.
The executor here runs each task in this process on a pickled copy of its shard, as a Ray worker receives it.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import SchemaError
from collapse_doctor.core.series import RunSeries
from collapse_doctor.engine import reduce
from collapse_doctor.io.rollouts.parquet import ParquetRun, steps_read_in_tasks
from tests.helpers.tables import make_table


class InProcess:
    """An executor whose tasks run here, one after another, on pickled copies (what a Ray task gets)."""

    workers = 2

    def __init__(self) -> None:
        self.tasks = 0

    def map(
        self,
        work: Callable[[Any], Any],
        items: Sequence[Any],
        describe: Callable[[Any], str],
        *,
        keep_going: bool = False,
    ) -> Iterator[Any]:
        for item in items:
            self.tasks += 1
            yield pickle.loads(pickle.dumps(work(pickle.loads(pickle.dumps(item)))))


@pytest.fixture(autouse=True)
def small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards of a few hundred rows, so that the small runs here are cut into several."""
    monkeypatch.setattr(reduce, "MIN_SHARD_ROWS", 500)


def _write(table: pa.Table, root: Path, cuts: Sequence[int], row_group: int, statistics: bool = True) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for k, (a, b) in enumerate(itertools.pairwise([0, *cuts, table.num_rows])):
        path = root / f"part-{k}.parquet"
        pq.write_table(table.slice(a, b - a), path, row_group_size=row_group, write_statistics=statistics)
        files.append(path)
    return files


def _with_nan(table: pa.Table) -> pa.Table:
    rewards = table.column("reward/correct").to_numpy().copy()
    rewards[::37] = np.nan
    return table.set_column(table.schema.get_field_index("reward/correct"), "reward/correct", pa.array(rewards))


def _with_aggregation(table: pa.Table, switch: int) -> pa.Table:
    steps = table.column("step").to_numpy()
    labels = np.where(steps < switch, "sum_then_normalize", "normalize_then_sum").astype(object)
    labels[(steps == switch) & (np.arange(len(steps)) % 64 < 10)] = None  # the step's first label comes later
    return table.append_column("aggregation", pa.array(labels.tolist(), pa.string()))


def _layouts(tmp_path: Path) -> dict[str, list[Path]]:
    """Steps of 64 rows cut by files inside steps and by row groups of 300 / 256 / 100 rows; steps of 1,600 rows
    over row groups of 250 (a step spans several shards); no footer statistics; an aggregation column."""
    small = _with_nan(make_table(steps=40, groups=8, text=False))
    big = _with_nan(make_table(steps=6, groups=200, text=False, seed=1))
    return {
        "parts": _write(small, tmp_path / "parts", [1000, 1032], 300),
        "big steps": _write(big, tmp_path / "big", [4000], 250),
        "no statistics": _write(small, tmp_path / "nostats", [900], 100, statistics=False),
        "aggregation": _write(_with_aggregation(small, 23), tmp_path / "agg", [23 * 64 + 30], 256),
    }


def _same_series(a: RunSeries, b: RunSeries) -> None:
    assert np.array_equal(a.steps, b.steps)
    assert a.values.keys() == b.values.keys()
    for name in a.values:
        assert np.array_equal(a.values[name], b.values[name], equal_nan=True), name


def _footers_only(monkeypatch: pytest.MonkeyPatch, driver: list[ParquetRun]) -> None:
    """Fail if pass 1 runs anywhere, or if the driver's reader reads a column (the tasks' copies may)."""
    read = ParquetRun._batches_between

    def no_pass_1(self: ParquetRun) -> None:
        raise AssertionError("pass 1 over the whole run")

    def columns(self: ParquetRun, *args: Any) -> Any:
        assert all(self is not run for run in driver), "the driver read a column"
        return read(self, *args)

    monkeypatch.setattr(ParquetRun, "_scan", no_pass_1)
    monkeypatch.setattr(ParquetRun, "_batches_between", columns)


@pytest.mark.parametrize("layout", ["parts", "big steps", "no statistics", "aggregation"])
def test_tasks_read_the_steps_and_give_the_local_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    files = _layouts(tmp_path)[layout]
    local_run = ParquetRun(files, check_rewards_first=False)
    local = reduce.reduce_rollouts(local_run, "cpu")
    with steps_read_in_tasks():
        run = ParquetRun(files, check_rewards_first=False)
    shards = reduce.planned_shards(run, 2)
    assert len(shards) >= 4
    group_starts = {0}
    offset = 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            offset += meta.row_group(g).num_rows
            group_starts.add(offset)
    assert all(a in group_starts and b in group_starts for a, b in shards)  # cut where row groups start
    with monkeypatch.context() as patch:
        _footers_only(patch, [run])
        executor = InProcess()
        on_ray = reduce.reduce_rollouts(run, "cpu", executor=executor)
    assert executor.tasks == len(shards)
    _same_series(local, on_ray)
    assert run.num_rows == local_run.num_rows and run.steps == local_run.steps
    assert run._last_row == local_run._last_row  # pass 1's step ends, from the tasks' claims
    assert run.notes.nan_rewards == local_run.notes.nan_rewards and sum(run.notes.nan_rewards.values()) > 0
    assert run.notes.group_sizes == local_run.notes.group_sizes
    assert run.step_labels("aggregation") == local_run.step_labels("aggregation")
    if layout == "aggregation":
        labels = run.step_labels("aggregation")
        assert labels is not None and labels[22] == "sum_then_normalize" and labels[23] == "normalize_then_sum"


def test_a_step_is_owned_by_the_shard_it_starts_in(tmp_path: Path) -> None:
    files = _layouts(tmp_path)["big steps"]  # 1,600 rows a step, row groups of 250
    with steps_read_in_tasks():
        run = ParquetRun(files, check_rewards_first=False)
    claims = [pickle.loads(pickle.dumps(run.step_shard(a, b))).claim_steps() for a, b in run.plan_shards(500)]
    owned = [c.rows for c in claims if c is not None and c.rows[0] < c.rows[1]]
    assert [a for a, _ in owned] == [1600 * k for k in range(6)] and owned[-1][1] == 9600
    assert all(a[1] == b[0] for a, b in itertools.pairwise(owned))
    assert any(c is not None and c.rows[0] == c.rows[1] for c in claims)  # a shard inside one step owns nothing
    assert run.accept_claims([c for c in claims if c is not None])


@pytest.mark.parametrize("where", ["footers", "inside a row group"])
def test_steps_out_of_order_are_reduced_here(tmp_path: Path, where: str) -> None:
    table = make_table(steps=30, groups=8, text=False)
    if where == "footers":  # the last row groups come first: the footers' step ranges say so
        order = np.concatenate([np.arange(1280, 1920), np.arange(0, 1280)])
    else:  # two steps swapped inside one row group of 640 rows: only reading the rows tells
        order = np.arange(table.num_rows)
        order[704:832] = np.concatenate([np.arange(768, 832), np.arange(704, 768)])
    files = _write(table.take(pa.array(order)), tmp_path / "run", [], 640)
    local = reduce.reduce_rollouts(ParquetRun(files, check_rewards_first=False), "cpu")
    with steps_read_in_tasks():
        run = ParquetRun(files, check_rewards_first=False)
    assert (run.plan_shards(500) == []) == (where == "footers")
    executor = InProcess()
    again = reduce.reduce_rollouts(run, "cpu", executor=executor)
    assert executor.tasks == (0 if where == "footers" else 3)
    _same_series(local, again)
    assert not run.sorted_steps


def test_a_bad_step_column_is_an_error_from_the_task(tmp_path: Path) -> None:
    table = make_table(steps=20, groups=8, text=False)
    values = table.column("step").to_pylist()
    steps = pa.array([*values[:1000], None, *values[1001:]])
    files = _write(table.set_column(0, "step", steps), tmp_path / "run", [], 200)
    with steps_read_in_tasks():
        run = ParquetRun(files, check_rewards_first=False)  # the footers only: nothing to find yet
    with pytest.raises(SchemaError, match=r"part-0.parquet: step column 'step' has 1 empty"):
        reduce.reduce_rollouts(run, "cpu", executor=InProcess())
