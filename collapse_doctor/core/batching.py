"""Turn streamed steps into chunks for one engine call: several steps, dense indices, one device."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collapse_doctor.core.schema import RolloutBatch
from collapse_doctor.core.series import CUT_BY_FLAG

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
    completion_codes: np.ndarray | None = None
    """``[N]`` int64 completion identity (equal codes, equal text; -1 a null text), comparable within a step; None
    without a completion column."""
    completion_lengths: np.ndarray | None = None
    """``[N]`` float64 completion length (tokens, else characters; NaN where unknown); None when unknown."""
    completion_cut: np.ndarray | None = None
    """``[N]`` float64 1.0 cut at the length cap, 0.0 ended on its own, NaN unknown; None without a flag."""
    completion_cut_rule: float = CUT_BY_FLAG
    completion_tokens: bool = False
    """Whether ``completion_lengths`` count tokens (token-weighted estimators need them), not characters."""
    """How :attr:`completion_cut` was told (``cut_rule`` values of :mod:`collapse_doctor.core.series`)."""

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
        completion_codes=_stacked_codes(chunk),
        completion_lengths=_stacked_floats([b.completion_lengths for b in chunk], sizes),
        completion_cut=_stacked_floats([b.completion_cut for b in chunk], sizes),
        completion_cut_rule=chunk[0].completion_cut_rule,  # one reader, one rule for every step
        completion_tokens=all(b.completion_tokens for b in chunk),
    )


def _stacked_codes(chunk: list[RolloutBatch]) -> np.ndarray | None:
    """The batches' completion codes, shifted so that no two batches share a code (a null text stays -1); None
    unless every batch has codes."""
    codes = [b.completion_codes for b in chunk]
    if not codes or any(c is None for c in codes):
        return None
    out, offset = [], 0
    for c in codes:
        assert c is not None
        out.append(np.where(c >= 0, c + offset, -1))
        offset += int(c.max()) + 1 if len(c) else 0
    return np.concatenate(out).astype(np.int64, copy=False)


def _stacked_floats(parts: list[np.ndarray | None], sizes: list[int]) -> np.ndarray | None:
    """The batches' per-row values (completion lengths, cut flags; NaN for a batch without); None when no batch
    has them."""
    if all(p is None for p in parts):
        return None
    return np.concatenate(
        [p if p is not None else np.full(n, np.nan) for p, n in zip(parts, sizes, strict=True)]
    ).astype(np.float64, copy=False)
