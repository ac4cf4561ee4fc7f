"""Stacking steps keeps each step's completion codes apart and fills missing lengths with NaN."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from collapse_doctor.core.batching import stack_chunk
from collapse_doctor.core.schema import RolloutBatch


def _batch(step: int, codes: list[int] | None, lengths: list[float] | None) -> RolloutBatch:
    n = 4
    return RolloutBatch(
        step=step,
        rewards=np.zeros((n, 1), np.float32),
        group_index=np.array([0, 0, 1, 1]),
        num_groups=2,
        row_ids=np.arange(n) + 4 * step,
        group_keys=pa.array([0, 0, 1, 1]),
        completion_codes=None if codes is None else np.array(codes, dtype=np.int64),
        completion_lengths=None if lengths is None else np.array(lengths),
    )


def test_codes_are_shifted_per_step_and_nulls_stay_null() -> None:
    chunk = stack_chunk([_batch(0, [0, 1, 0, -1], [1, 2, 1, np.nan]), _batch(1, [0, 0, -1, 2], None)])
    assert chunk.completion_codes is not None and chunk.completion_lengths is not None
    assert chunk.completion_codes.tolist() == [0, 1, 0, -1, 2, 2, -1, 4]
    np.testing.assert_array_equal(chunk.completion_lengths, [1, 2, 1, np.nan, np.nan, np.nan, np.nan, np.nan])


def test_a_step_without_codes_leaves_the_chunk_without() -> None:
    chunk = stack_chunk([_batch(0, [0, 1, 0, 1], None), _batch(1, None, None)])
    assert chunk.completion_codes is None and chunk.completion_lengths is None
