"""Parquet ingestion: discovery, multi-file runs, streaming per step, validation and warnings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.batching import StackedChunk, stack_chunk
from collapse_doctor.core.errors import InputError, SchemaError, UsageError
from collapse_doctor.io.rollouts import parquet as parquet_io
from collapse_doctor.io.rollouts.parquet import ParquetRun, resolve_inputs
from tests.helpers.tables import WriteTable, make_table


def _rows_by_completion(run: ParquetRun) -> dict[str, tuple[int, int, tuple[float, ...]]]:
    """completion -> (step, group key, rewards), from every yielded step."""
    out = {}
    for batch in run.iter_steps():
        texts = batch.extra.column("completion").to_pylist()
        keys = batch.group_keys.to_pylist()
        for i, text in enumerate(texts):
            out[text] = (batch.step, keys[i], tuple(batch.rewards[i].tolist()))
    return out


def test_discovers_canonical_columns(write_table: WriteTable) -> None:
    run = ParquetRun([write_table(make_table())])
    assert run.channels == ("format", "correct")
    assert run.weights == {"format": 1.0, "correct": 1.0}
    assert run.steps == [0, 1, 2]
    assert run.num_rows == 96
    batches = list(run.iter_steps())
    assert [b.step for b in batches] == [0, 1, 2]
    assert all(b.num_groups == 4 and b.group_sizes().tolist() == [8] * 4 for b in batches)


@pytest.mark.parametrize("style", ["underscore", "struct", "flattened"])
def test_reward_column_spellings(write_table: WriteTable, style: str) -> None:
    table = make_table(text=False)
    fmt, cor = table.column("reward/format"), table.column("reward/correct")
    base = table.drop_columns(["reward/format", "reward/correct"])
    if style == "underscore":
        table = base.append_column("reward_format", fmt).append_column("reward_correct", cor)
    elif style == "flattened":
        table = base.append_column("rewards.format", fmt).append_column("rewards.correct", cor)
    else:
        struct = pa.StructArray.from_arrays([fmt.combine_chunks(), cor.combine_chunks()], ["format", "correct"])
        table = base.append_column("rewards", struct)
    run = ParquetRun([write_table(table)])
    assert run.channels == ("format", "correct")
    first = next(run.iter_steps())
    np.testing.assert_array_equal(first.rewards[:, 0], fmt.to_numpy()[: first.num_rows])


def test_column_overrides(write_table: WriteTable) -> None:
    table = make_table(text=False).rename_columns(["iteration", "uid", "fmt_score", "acc"])
    path = write_table(table)
    run = ParquetRun([path], step_col="iteration", group_col="uid", reward_cols=["fmt_score", "acc"])
    assert run.channels == ("fmt_score", "acc")
    assert run.steps == [0, 1, 2]
    with pytest.raises(SchemaError, match=r"expected column 'step'.*Hint: pass --step-col"):
        ParquetRun([path])


def test_struct_field_override(write_table: WriteTable) -> None:
    table = make_table(text=False)
    struct = pa.StructArray.from_arrays(
        [table.column("reward/format").combine_chunks(), table.column("reward/correct").combine_chunks()],
        ["format", "correct"],
    )
    table = table.drop_columns(["reward/format", "reward/correct"]).append_column("scores", struct)
    run = ParquetRun([write_table(table)], reward_cols=["scores.correct"])
    assert run.channels == ("correct",)


def test_run_split_across_shuffled_files_matches_single_file(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=5)
    single = _rows_by_completion(ParquetRun([write_table(table, "single.parquet")]))
    order = np.random.default_rng(1).permutation(table.num_rows)
    shuffled = table.take(pa.array(order))
    for k, part in enumerate(np.array_split(np.arange(table.num_rows), 3)):
        write_table(shuffled.take(pa.array(part)), f"parts/part-{k}.parquet", row_group_size=17)
    split_run = ParquetRun([str(tmp_path / "parts")])
    assert len(split_run.files) == 3
    assert _rows_by_completion(split_run) == single
    glob_run = ParquetRun([str(tmp_path / "parts" / "part-*.parquet")])
    assert _rows_by_completion(glob_run) == single


def test_one_file_per_step(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=4)
    for step in range(4):
        mask = pa.compute.equal(table.column("step"), step)
        write_table(table.filter(mask), f"steps/step_{step}.parquet")
    run = ParquetRun([tmp_path / "steps"])
    assert [b.step for b in run.iter_steps()] == [0, 1, 2, 3]


def test_same_file_twice_is_read_once(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table())
    assert resolve_inputs([path, str(tmp_path / "*.parquet")]) == [path]


def test_steps_stream_before_the_whole_input_is_read(write_table: WriteTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorted input: step 0 is handed on after the first batches, and one step is open at a time."""
    monkeypatch.setattr(parquet_io, "BATCH_ROWS", 32)
    run = ParquetRun([write_table(make_table(steps=10), row_group_size=32)])
    read = 0
    original = parquet_io._iter_batches

    def counting(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        nonlocal read
        for batch in original(*args, **kwargs):  # type: ignore[arg-type]
            read += 1
            yield batch

    monkeypatch.setattr(parquet_io, "_iter_batches", counting)
    steps = run.iter_steps()
    first = next(steps)
    assert first.step == 0
    assert read == 1  # 32 rows per step: the first batch completes step 0
    assert [b.step for b in steps] == list(range(1, 10))
    assert read == 10


def test_groups_rebuilt_from_prompt_and_blocks(write_table: WriteTable) -> None:
    table = make_table(steps=2, groups=3).drop_columns(["group_id"])
    by_prompt = next(ParquetRun([write_table(table, "p.parquet")]).iter_steps())
    assert by_prompt.num_groups == 3
    assert by_prompt.group_sizes().tolist() == [8, 8, 8]
    blocks = ParquetRun([write_table(table.drop_columns(["prompt"]), "b.parquet")], group_size=4)
    first = next(blocks.iter_steps())
    assert first.num_groups == 6
    assert first.group_index.tolist()[:9] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    with pytest.raises(SchemaError, match="cannot tell which rollouts belong to one group"):
        ParquetRun([write_table(table.drop_columns(["prompt"]), "none.parquet")])


def test_string_group_ids(write_table: WriteTable) -> None:
    table = make_table()
    ids = pa.array([f"uid-{v}" for v in table.column("group_id").to_pylist()])
    table = table.set_column(1, "group_id", ids)
    first = next(ParquetRun([write_table(table)]).iter_steps())
    assert first.num_groups == 4
    assert first.group_keys.to_pylist()[0] == "uid-0"


def test_weights_precedence(write_table: WriteTable) -> None:
    path = write_table(make_table(), weights={"format": 2.0, "correct": 0.25})
    assert ParquetRun([path]).weights == {"format": 2.0, "correct": 0.25}
    assert ParquetRun([path], weights={"correct": 0.5}).weights == {"format": 2.0, "correct": 0.5}
    with pytest.raises(UsageError, match=r"unknown channel\(s\) \['length'\]"):
        ParquetRun([path], weights={"length": 1.0})


def test_warnings_with_counts(write_table: WriteTable) -> None:
    table = make_table(steps=2, groups=3)
    fmt = table.column("reward/format").to_numpy().copy()
    fmt[[0, 5, 9]] = np.nan
    table = table.set_column(2, "reward/format", pa.array(fmt))
    group = table.column("group_id").to_numpy().copy()
    group[0] = 99  # a group of one, and its old group is now ragged (7)
    table = table.set_column(1, "group_id", pa.array(group))
    completion = table.column("completion").to_pylist()
    completion[2] = completion[3]  # same group, same text: a duplicate row
    table = table.set_column(table.schema.get_field_index("completion"), "completion", pa.array(completion))
    run = ParquetRun([write_table(table)])
    list(run.iter_steps())
    warnings = "\n".join(run.notes.warnings())
    assert "reward/format: 3 NaN value(s)" in warnings
    assert "1 group(s) of size 1" in warnings
    assert "ragged group sizes: 2 group(s) differ from the usual size 8" in warnings
    assert "duplicate" not in warnings  # identical completions in a group: normal GRPO, not a warning
    assert any("1 duplicate row(s)" in line for line in run.notes.info())


@pytest.mark.parametrize(
    ("mutate", "error", "pattern"),
    [
        (
            lambda t: t.drop_columns(["step"]),
            SchemaError,
            r"expected column 'step'; found columns: \[group_id",
        ),
        (
            lambda t: t.drop_columns(["reward/format", "reward/correct"]),
            SchemaError,
            r"no reward column found.*Hint: pass --reward-cols",
        ),
        (
            lambda t: t.set_column(2, "reward/format", pa.array(["x"] * t.num_rows)),
            SchemaError,
            r"reward column 'reward/format' has type string, expected numbers",
        ),
        (lambda t: t.slice(0, 0), InputError, r"the input has no rows"),
        (
            lambda t: t.set_column(3, "reward/correct", pa.array([np.inf, -np.inf] + [0.5] * (t.num_rows - 2))),
            SchemaError,
            r"reward column 'reward/correct' has 2 row\(s\) with \+inf or -inf",
        ),
        (
            lambda t: t.set_column(0, "step", pa.array([None, *list(range(t.num_rows - 1))], pa.int64())),
            SchemaError,
            r"step column 'step' has 1 empty \(null\) values",
        ),
        (
            lambda t: t.set_column(0, "step", pa.array(["a"] * t.num_rows)),
            SchemaError,
            r"step column 'step' has type string, expected integers",
        ),
    ],
    ids=["no-step", "no-reward", "non-numeric-reward", "empty", "inf", "null-step", "string-step"],
)
def test_bad_tables(write_table: WriteTable, mutate, error, pattern) -> None:  # type: ignore[no-untyped-def]
    path = write_table(mutate(make_table()))
    with pytest.raises(error, match=pattern) as info:
        ParquetRun([path])
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_files(tmp_path: Path, write_table: WriteTable) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        ParquetRun([tmp_path / "missing.parquet"])
    text = tmp_path / "notes.parquet"
    text.write_text("step,reward\n1,0.5\n")
    with pytest.raises(InputError, match="not a Parquet file"):
        ParquetRun([text])
    good = write_table(make_table())
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputError, match="truncated or corrupt Parquet file"):
        ParquetRun([truncated])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match="directory holds no Parquet files"):
        ParquetRun([tmp_path / "empty_dir"])
    with pytest.raises(InputError, match="pattern matches no file"):
        ParquetRun([str(tmp_path / "nothing-*.parquet")])


def test_second_file_missing_a_column(write_table: WriteTable) -> None:
    a = write_table(make_table(), "a.parquet")
    b = write_table(make_table().drop_columns(["reward/correct"]), "b.parquet")
    with pytest.raises(SchemaError, match=r"b.parquet: missing column\(s\) \['reward/correct'\]"):
        ParquetRun([a, b])


def test_null_group_id_is_an_error(write_table: WriteTable) -> None:
    table = make_table()
    group = pa.array([None, *table.column("group_id").to_pylist()[1:]], pa.int64())
    run = ParquetRun([write_table(table.set_column(1, "group_id", group))])
    with pytest.raises(SchemaError, match=r"group column 'group_id' has 1 empty \(null or NaN\) value\(s\) at step 0"):
        list(run.iter_steps())


def test_bool_and_int_rewards_become_float(write_table: WriteTable) -> None:
    table = make_table(text=False)
    table = table.set_column(2, "reward/format", pa.array(table.column("reward/format").to_numpy() > 0.5))
    table = table.set_column(3, "reward/correct", pa.array([1, None] * (table.num_rows // 2), pa.int32()))
    first = next(ParquetRun([write_table(table)]).iter_steps())
    assert first.rewards.dtype == np.float32
    assert np.isnan(first.rewards[1, 1])
    assert set(np.unique(first.rewards[:, 0]).tolist()) <= {0.0, 1.0}


def test_metadata_weights_must_be_json(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table().replace_schema_metadata({"collapse_doctor.weights": "not json"})
    path = tmp_path / "meta.parquet"
    pq.write_table(table, path)
    with pytest.raises(SchemaError, match="is not a JSON object of numbers"):
        ParquetRun([path])


def _per_step(chunks: list[StackedChunk]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """step -> (rewards, group ids counted from 0 within the step), from stacked chunks."""
    out = {}
    for chunk in chunks:
        for k, step in enumerate(chunk.steps.tolist()):
            rows = chunk.step_index == k
            groups = chunk.group_index[rows]
            out[step] = (chunk.rewards[rows], groups - groups.min())
    return out


def _assert_chunks_match_steps(run: ParquetRun, max_rows: int) -> list[StackedChunk]:
    chunks = list(run.iter_chunks(max_rows))
    for chunk in chunks:
        assert chunk.num_groups == int(chunk.group_index.max()) + 1
        assert np.all(np.diff(chunk.steps) > 0)
    reference = _per_step([stack_chunk([batch]) for batch in run.iter_steps()])
    got = _per_step(chunks)
    assert got.keys() == reference.keys()
    for step, (rewards, groups) in reference.items():
        np.testing.assert_array_equal(got[step][0], rewards, err_msg=f"step {step}")
        np.testing.assert_array_equal(got[step][1], groups, err_msg=f"step {step}")
    return chunks


@pytest.mark.parametrize("layout", ["group_id", "interleaved", "string_ids", "prompt", "blocks", "unsorted"])
def test_chunks_match_per_step_assembly(write_table: WriteTable, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    # Small record batches so that steps span batches and chunks are cut between them.
    monkeypatch.setattr(parquet_io, "BATCH_ROWS", 20)
    table = make_table(steps=6, groups=5, group_size=6)
    options: dict[str, object] = {}
    if layout == "interleaved":  # a group's rows are not consecutive: ids repeat later in the step
        steps = table.column("step").to_numpy()
        table = table.take(pa.array(np.lexsort((np.arange(table.num_rows) % 7, steps))))
        assert table.column("group_id").to_pylist()[:4] == [0, 1, 2, 3]
    elif layout == "string_ids":
        table = table.set_column(1, "group_id", pc.cast(table.column("group_id"), pa.string()))
    elif layout == "prompt":
        table = table.drop_columns(["group_id"])
    elif layout == "blocks":
        table = table.drop_columns(["group_id", "prompt"]).slice(0, 168)  # the last step is ragged
        options["group_size"] = 5
    elif layout == "unsorted":
        table = table.take(pa.array(np.random.default_rng(0).permutation(table.num_rows)))
    run = ParquetRun([write_table(table, row_group_size=45)], **options)  # type: ignore[arg-type]
    assert run.sorted_steps == (layout != "unsorted")
    chunks = _assert_chunks_match_steps(run, max_rows=50)
    assert len(chunks) > 2
    if layout == "blocks":
        assert run.notes.ragged_blocks == 2  # counted once per pass


def test_chunks_across_files_and_large_steps(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=4, groups=4, group_size=8, text=False)
    # Step 1 is split over two files; chunks smaller than one step keep each step whole.
    write_table(table.slice(0, 40), "a/part-0.parquet")
    write_table(table.slice(40), "a/part-1.parquet")
    run = ParquetRun([tmp_path / "a"])
    assert run.sorted_steps
    # Chunks are cut between record batches, at the last step boundary read so far.
    chunks = _assert_chunks_match_steps(run, max_rows=10)
    assert [c.steps.tolist() for c in chunks] == [[0], [1, 2, 3]]
    assert [c.steps.tolist() for c in _assert_chunks_match_steps(run, max_rows=10_000)] == [[0, 1, 2, 3]]


def test_null_group_id_is_an_error_in_chunks(write_table: WriteTable) -> None:
    table = make_table()
    group = pa.array([*table.column("group_id").to_pylist()[:40], None, *table.column("group_id").to_pylist()[41:]])
    run = ParquetRun([write_table(table.set_column(1, "group_id", group))])
    with pytest.raises(SchemaError, match=r"group column 'group_id' has 1 empty \(null or NaN\) value\(s\) at step 1"):
        list(run.iter_chunks(1000))


@pytest.mark.parametrize("sorted_steps", [True, False])
def test_rewards_checked_in_pass_two_when_deferred(write_table: WriteTable, sorted_steps: bool) -> None:
    table = make_table(steps=4, text=False)
    correct = table.column("reward/correct").to_numpy().copy()
    correct[[5, 70]] = np.nan
    table = table.set_column(3, "reward/correct", pa.array(correct))
    if not sorted_steps:
        table = table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows)))
    path = write_table(table)
    early, late = ParquetRun([path]), ParquetRun([path], check_rewards_first=False)
    assert late.notes.nan_rewards["correct"] == 0  # nothing read yet
    chunks = list(late.iter_chunks(1000))
    assert late.notes.nan_rewards == early.notes.nan_rewards == {"format": 0, "correct": 2}
    assert sum(len(c.rewards) for c in chunks) == early.num_rows

    bad = correct.copy()
    bad[100] = np.inf
    path = write_table(table.set_column(3, "reward/correct", pa.array(bad)), "bad.parquet")
    late = ParquetRun([path], check_rewards_first=False)  # opening does not read the rewards
    with pytest.raises(SchemaError, match=r"bad.parquet: reward column 'reward/correct' has 1 row\(s\) with \+inf"):
        list(late.iter_chunks(1000))
