"""What the readers tell the engine about completions: a code per row (equal text, equal code within a step; a
null text a value of its own) and a length (the ``completion_length`` column, else the text's characters).

Every way a chunk is made carries them: sorted steps cut from the record batches, steps assembled one by one
and stacked, shards read elsewhere, and the framework adapters' in-memory tables.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.batching import StackedChunk
from collapse_doctor.io.rollouts import parquet
from collapse_doctor.io.rollouts.parquet import ParquetRun
from collapse_doctor.io.rollouts.trl import open_trl_completions


def _table(steps: int = 6, groups: int = 4, size: int = 4, seed: int = 0) -> pa.Table:
    """Completions drawn from few texts (repeats within and across groups and steps), some null."""
    rng = np.random.default_rng(seed)
    n = steps * groups * size
    texts: list[str | None] = [f"answer {k}" + "!" * k for k in rng.integers(0, 6, n)]
    for i in range(0, n, 13):
        texts[i] = None
    return pa.table(
        {
            "step": np.repeat(np.arange(steps), groups * size),
            "group_id": np.tile(np.repeat(np.arange(groups), size), steps),
            "reward/a": rng.random(n),
            "completion": pa.array(texts, pa.string()),
        }
    )


def _rows(chunks: list[StackedChunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row steps, codes and lengths of a reader's chunks, concatenated."""
    steps = np.concatenate([c.steps[c.step_index] for c in chunks])
    codes = [c.completion_codes for c in chunks]
    lengths = [c.completion_lengths for c in chunks]
    assert all(c is not None for c in codes) and all(x is not None for x in lengths)
    return steps, np.concatenate(codes), np.concatenate(lengths)  # type: ignore[arg-type]


def _check_codes(steps: np.ndarray, codes: np.ndarray, texts: list[str | None]) -> None:
    """Within each step, two rows have the same code exactly when they have the same text (None included)."""
    assert codes.dtype == np.int64
    for s in np.unique(steps):
        rows = np.flatnonzero(steps == s)
        text = [texts[i] for i in rows]
        same_code = codes[rows][:, None] == codes[rows][None, :]
        same_text = np.array([[a == b for b in text] for a in text])
        assert np.array_equal(same_code, same_text), s
        assert all((codes[i] == -1) == (texts[i] is None) for i in rows)


@pytest.mark.parametrize("shuffled", [False, True])
def test_codes_and_character_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffled: bool) -> None:
    monkeypatch.setattr(parquet, "BATCH_ROWS", 20)  # several record batches, so several chunks
    table = _table()
    if shuffled:  # steps out of order: assembled step by step, then stacked
        table = table.take(np.random.default_rng(1).permutation(table.num_rows))
    pq.write_table(table, tmp_path / "run.parquet", row_group_size=20)
    run = ParquetRun([tmp_path / "run.parquet"])
    assert run.sorted_steps != shuffled
    chunks = list(run.iter_chunks(40))
    assert len(chunks) > 1
    texts = table.column("completion").to_pylist()
    if shuffled:  # the chunk's rows are the steps' rows as assembled, in the order the steps were completed
        batches = list(ParquetRun([tmp_path / "run.parquet"]).iter_steps())
        texts = [t for b in batches if b.extra is not None for t in b.extra.column("completion").to_pylist()]
    steps, codes, lengths = _rows(chunks)
    _check_codes(steps, codes, texts)
    want = np.array([np.nan if t is None else len(t) for t in texts])
    np.testing.assert_array_equal(lengths, want)


def test_stacked_steps_keep_their_codes_apart(tmp_path: Path) -> None:
    # Step by step every step's codes start at 0: stacked, they are shifted so that no two steps share one.
    table = _table()
    pq.write_table(table.take(np.random.default_rng(2).permutation(table.num_rows)), tmp_path / "run.parquet")
    run = ParquetRun([tmp_path / "run.parquet"])
    (chunk,) = list(run.iter_chunks(10_000))
    assert chunk.completion_codes is not None
    per_step = [
        set(chunk.completion_codes[(chunk.step_index == s) & (chunk.completion_codes >= 0)].tolist()) for s in range(6)
    ]
    assert all(not (a & b) for i, a in enumerate(per_step) for b in per_step[i + 1 :])


def test_a_length_column_wins_and_is_read_on_every_path(tmp_path: Path) -> None:
    table = _table()
    tokens = pa.array([None if i % 7 == 0 else i % 50 for i in range(table.num_rows)], pa.int32())
    table = table.append_column("completion_length", tokens)
    want = np.array([np.nan if v is None else v for v in tokens.to_pylist()], dtype=np.float64)
    pq.write_table(table, tmp_path / "sorted.parquet")
    (chunk,) = list(ParquetRun([tmp_path / "sorted.parquet"]).iter_chunks(10_000))
    np.testing.assert_array_equal(chunk.completion_lengths, want)
    no_text = table.drop_columns(["completion"])
    pq.write_table(no_text, tmp_path / "lengths.parquet")
    run = ParquetRun([tmp_path / "lengths.parquet"])
    batches = list(run.iter_steps())
    np.testing.assert_array_equal(np.concatenate([b.completion_lengths for b in batches]), want)
    (chunk,) = list(run.iter_chunks(10_000))
    assert chunk.completion_codes is None
    np.testing.assert_array_equal(chunk.completion_lengths, want)


def test_without_text_or_lengths_there_is_nothing(tmp_path: Path) -> None:
    pq.write_table(_table().drop_columns(["completion"]), tmp_path / "run.parquet")
    run = ParquetRun([tmp_path / "run.parquet"])
    for chunk in [*run.iter_chunks(30), *ParquetRun([tmp_path / "run.parquet"]).iter_steps()]:
        assert chunk.completion_codes is None and chunk.completion_lengths is None


def test_shards_carry_the_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet, "BATCH_ROWS", 32)
    table = _table(steps=20)
    pq.write_table(table, tmp_path / "run.parquet", row_group_size=50)
    run = ParquetRun([tmp_path / "run.parquet"])
    whole = _rows(list(run.iter_chunks(64)))
    parts = []
    for start, end in run.shards(100):
        shard = pickle.loads(pickle.dumps(run.shard(start, end)))
        parts += list(shard.iter_chunks(64))
    got = _rows(parts)
    _check_codes(got[0], got[1], table.column("completion").to_pylist())
    np.testing.assert_array_equal(got[0], whole[0])
    np.testing.assert_array_equal(got[2], whole[2])


def test_the_trl_adapter_carries_them(tmp_path: Path) -> None:
    folder = tmp_path / "completions"
    folder.mkdir()
    texts = ["same"] * 4 + ["a", "bb", "ccc", "a"]
    pq.write_table(
        pa.table(
            {
                "step": [1] * 8,
                "prompt": ["p"] * 4 + ["q"] * 4,
                "completion": texts,
                "accuracy": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0],
                "advantage": [0.0] * 8,
            }
        ),
        folder / "completions_00001.parquet",
    )
    run = open_trl_completions([folder / "completions_00001.parquet"])
    steps, codes, lengths = _rows(list(run.iter_chunks(1000)))
    _check_codes(steps, codes, list(texts))
    assert lengths.tolist() == [4, 4, 4, 4, 1, 2, 3, 1]
