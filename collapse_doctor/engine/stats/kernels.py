"""Reductions and row operations of the general (torch) path of the statistic families, no statistic of their own.

The dense path's NumPy counterparts are in :mod:`collapse_doctor.engine.stats.dense`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

HASH_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))
"""The signed 64-bit multipliers of :func:`hash_rows` (the NumPy dense path mixes with the same)."""


def segment_sum(values: Tensor, index: Tensor, size: int) -> Tensor:
    """Segment sums in float64; 1-D scatter_add is the fastest CPU kernel, index_add_ handles [N, C].

    >>> segment_sum(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 1, 0]), 2).tolist()
    [5.0, 2.0]
    """
    values = values.to(torch.float64)
    out = torch.zeros((size, *values.shape[1:]), dtype=torch.float64, device=values.device)
    if values.ndim == 1:
        return out.scatter_add_(0, index, values)
    return out.index_add_(0, index, values)


def ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, NaN where den is 0.

    >>> ratio(torch.tensor([1.0, 1.0]), torch.tensor([4.0, 0.0])).tolist()
    [0.25, nan]
    """
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))


def segment_extreme(values: Tensor, index: Tensor, size: int, reduce: str) -> Tensor:
    """Per segment ``amax`` or ``amin`` of ``values`` ignoring NaN (-inf / +inf for a segment with none).

    >>> segment_extreme(torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([0, 1, 0]), 2, "amax").tolist()
    [3.0, -inf]
    """
    fill = float("-inf") if reduce == "amax" else float("inf")
    base = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    clean = torch.where(torch.isnan(values), torch.full_like(values, fill), values)
    return base.scatter_reduce(0, index, clean, reduce=reduce, include_self=True)


def hash_rows(columns: list[Tensor]) -> Tensor:
    """One int64 per row mixing several int64 columns (collisions are negligible at 64 bits)."""
    h = torch.zeros_like(columns[0])
    for k, column in enumerate(columns):
        h = (h ^ column) * HASH_MIX[k % len(HASH_MIX)]
        h = h ^ (h >> 31)
    return h


def bucket_sizes(keys: Tensor) -> Tensor:
    """For each row, how many rows share its key.

    >>> bucket_sizes(torch.tensor([7, 3, 7, 7])).tolist()
    [3, 1, 3, 3]
    """
    _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    return counts[inverse]


def quantize(values: Tensor, quantum: float, *, nan_free: bool = False) -> Tensor:
    """Integer bins of width ``quantum``; NaN gets a bin of its own (skip that pass with ``nan_free``)."""
    q = torch.round(values.to(torch.float64) / quantum)
    if nan_free:
        return q.to(torch.int64)
    return torch.where(torch.isnan(q), torch.full_like(q, -(2.0**62)), q).to(torch.int64)


def first_argmax(values: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Index of the largest of equally shaped tensors, the first on ties, and that largest value.

    The same as ``torch.stack(values).argmax(0)``, as a few arithmetic passes: on CPU, torch's argmax over
    a short dimension, ``torch.where`` and ``masked_fill`` cost many times a multiply.

    >>> index, best = first_argmax([torch.tensor([1.0, 5.0]), torch.tensor([3.0, 5.0])])
    >>> index.tolist(), best.tolist()
    ([1, 0], [3.0, 5.0])
    """
    best, index = values[0], torch.zeros(values[0].shape, dtype=torch.int64, device=values[0].device)
    for k, value in enumerate(values[1:], start=1):
        better = (value > best).to(torch.int64)
        index = index + better * (k - index)
        best = torch.maximum(best, value)
    return index, best


def to_host(x: Tensor | np.ndarray) -> np.ndarray:
    """A tensor's values as a NumPy array (copied off the GPU; shared on CPU); a NumPy array as it is."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()
