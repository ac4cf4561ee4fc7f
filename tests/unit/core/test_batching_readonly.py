"""StackedChunk.tensors takes read-only arrays (zero-copy Arrow buffers) without a warning or an extra copy."""

from __future__ import annotations

import warnings

import numpy as np

from collapse_doctor.core.batching import StackedChunk


def _chunk(writable: bool) -> StackedChunk:
    arrays = {
        "rewards": np.arange(8, dtype=np.float32).reshape(4, 2),
        "group_index": np.array([0, 0, 1, 1], dtype=np.int64),
        "step_index": np.zeros(4, dtype=np.int64),
        "logged": np.array([1.0, -1.0, 0.5, -0.5], dtype=np.float32),
    }
    for array in arrays.values():
        array.setflags(write=writable)
    return StackedChunk(steps=np.array([0]), num_groups=2, **arrays)


def test_read_only_arrays_give_tensors_without_a_warning() -> None:
    chunk = _chunk(writable=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rewards, group_index, step_index, weights, logged = chunk.tensors(["a", "b"], {"a": 1.0, "b": 0.5}, "cpu")
    assert rewards.tolist() == chunk.rewards.tolist()
    assert logged is not None and logged.tolist() == chunk.logged.tolist()  # type: ignore[union-attr]
    assert group_index.tolist() == [0, 0, 1, 1] and step_index.tolist() == [0, 0, 0, 0]
    assert weights.tolist() == [1.0, 0.5]
    assert not chunk.rewards.flags.writeable  # the chunk's own arrays are left alone


def test_writable_arrays_are_shared_not_copied() -> None:
    chunk = _chunk(writable=True)
    rewards, group_index, step_index, _, logged = chunk.tensors(["a", "b"], {"a": 1.0, "b": 1.0}, "cpu")
    assert rewards.data_ptr() == chunk.rewards.ctypes.data
    assert group_index.data_ptr() == chunk.group_index.ctypes.data
    assert step_index.data_ptr() == chunk.step_index.ctypes.data
    assert logged is not None and chunk.logged is not None and logged.data_ptr() == chunk.logged.ctypes.data
