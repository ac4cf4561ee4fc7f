"""Turn streamed steps into chunks for one engine call: several steps, dense indices, one device."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collapse_doctor.core.schema import RolloutBatch

CHUNK_ROWS = 1 << 20


def chunk_steps(batches: Iterable[RolloutBatch], max_rows: int = CHUNK_ROWS) -> Iterator[list[RolloutBatch]]:
    """Group consecutive steps into lists of about ``max_rows`` rows (a large step stays whole)."""
    chunk: list[RolloutBatch] = []
    rows = 0
    for batch in batches:
        if chunk and rows + batch.num_rows > max_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(batch)
        rows += batch.num_rows
    if chunk:
        yield chunk


@dataclass(frozen=True)
class StackedChunk:
    """Several steps' rows stacked, with group ids unique across the chunk and a step index."""

    rewards: np.ndarray
    group_index: np.ndarray
    step_index: np.ndarray
    steps: np.ndarray
    num_groups: int
    logged: np.ndarray | None

    def tensors(self, channels: Sequence[str], weights: Mapping[str, float], device: str):  # type: ignore[no-untyped-def]
        """(rewards, group_index, step_index, weights, logged) as torch tensors on ``device``."""
        import torch

        dev = torch.device(device)
        logged = _tensor(self.logged).to(dev) if self.logged is not None else None
        return (
            _tensor(self.rewards).to(dev),
            _tensor(self.group_index).to(dev),
            _tensor(self.step_index).to(dev),
            torch.tensor([weights[c] for c in channels], dtype=torch.float32, device=dev),
            logged,
        )


def _tensor(array: np.ndarray):  # type: ignore[no-untyped-def]
    """``torch.from_numpy`` without its warning for read-only arrays (zero-copy Arrow buffers).

    A writable array is shared as is; a read-only one is copied once (torch tensors are always writable,
    so sharing a read-only buffer would let a kernel write into memory Arrow owns).
    """
    import torch

    return torch.from_numpy(np.require(array, requirements="W"))


def stack_chunk(chunk: list[RolloutBatch]) -> StackedChunk:
    offsets = np.cumsum([0] + [b.num_groups for b in chunk[:-1]])
    sizes = [b.num_rows for b in chunk]
    logged = None
    if all(b.advantage is not None for b in chunk):
        logged = np.concatenate([b.advantage for b in chunk if b.advantage is not None])
    return StackedChunk(
        rewards=np.concatenate([b.rewards for b in chunk]),
        group_index=np.concatenate([b.group_index + o for b, o in zip(chunk, offsets, strict=True)]),
        step_index=np.repeat(np.arange(len(chunk)), sizes),
        steps=np.array([b.step for b in chunk], dtype=np.int64),
        num_groups=int(sum(b.num_groups for b in chunk)),
        logged=logged,
    )
