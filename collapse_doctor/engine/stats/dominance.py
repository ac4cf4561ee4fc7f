"""Dominance: the share of samples whose advantage sign each channel decides.

Per row, the deciding channel is the one whose contribution to the advantage (``w_c dev_c`` under GRPO,
``w_c z_c`` under GDPO) is largest in absolute value, the first on ties, when its sign agrees with the
advantage's (``dev_t`` / the fused sum). ``dominance_*[c]`` is the share of rows channel c decides among
the rows whose advantage carries signal (``|adv| > 1e-6``); rows where the largest part disagrees count in
the denominator only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import ratio

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

NAMES = ("dominance_grpo", "dominance_gdpo")


TIE_TOLERANCE = 1e-6
"""Contributions within this share of the largest count as tied, and the first channel of a tie decides:
mathematically equal contributions (``|w_a z_a| = |w_b z_b|``) differ by float32 rounding, which torch and NumPy
round differently, and rounding must not pick the deciding channel."""


def deciders(parts: list[Tensor], adv: Tensor) -> Tensor:
    """Per row: the channel whose contribution is largest (the first within :data:`TIE_TOLERANCE` of the largest)
    and agrees in sign with ``adv``.

    ``C`` (the number of channels) where the largest one disagrees, ``C + 1`` where ``adv`` carries no signal.

    >>> deciders([torch.tensor([2.0, -3.0, 0.0]), torch.tensor([-1.0, 1.0, 0.0])], torch.tensor([1.0, 1.0, 0.0]))
    tensor([0, 2, 3])
    """
    n_ch = len(parts)
    sizes = [p.abs() for p in parts]
    best = sizes[0]
    for size in sizes[1:]:
        best = torch.maximum(best, size)
    near = best * (1 - TIE_TOLERANCE)
    winner = torch.zeros(best.shape, dtype=torch.int64, device=best.device)
    decisive = parts[0]
    for k in range(n_ch - 1, 0, -1):  # the last assignment is the first channel within the tolerance
        take = sizes[k] >= near
        winner = torch.where(take, k, winner)
        decisive = torch.where(take, parts[k], decisive)
    first = sizes[0] >= near
    winner = torch.where(first, 0, winner)
    decisive = torch.where(first, parts[0], decisive)
    agrees = (torch.sign(decisive) == torch.sign(adv)).to(torch.int64)
    code = n_ch + agrees * (winner - n_ch)
    silent = (adv.abs() <= 1e-6).to(torch.int64)
    return code + silent * (n_ch + 1 - code)


def general(c: GeneralChunk) -> dict[str, Tensor]:
    n_ch, w = c.num_channels, c.weights
    out: dict[str, Tensor] = {}
    for name, contrib, adv in (
        ("dominance_grpo", w * c.dev, c.dev_t),
        ("dominance_gdpo", w * c.zscores, c.fused),
    ):
        codes = deciders(list(contrib.unbind(dim=1)), adv)
        hits = torch.nn.functional.one_hot(codes, n_ch + 2).double()
        out[name] = ratio(c.steps_sum(hits[:, :n_ch]), c.steps_sum(hits[:, : n_ch + 1].sum(dim=1))[:, None])
    return out


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, parts, adv in (
        ("dominance_grpo", c.weighted(c.dev), c.dev_t),
        ("dominance_gdpo", c.weighted(c.zscores), c.fused),
    ):
        hits, decided = _dense_decisions(parts, adv)
        out[name] = dense_np.ratio(np.stack([c.steps_sum(h) for h in hits], axis=1), c.steps_sum(decided)[:, None])
    return out


def _dense_decisions(parts: list[np.ndarray], adv: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """:func:`deciders` counted per group on NumPy ``[g, G]`` arrays: for each channel, the rows it decides (its
    contribution is the largest, the first within :data:`TIE_TOLERANCE`, and agrees in sign with ``adv``), and
    the rows where ``adv``
    carries signal. Boolean passes, one per test and channel (8 times less memory traffic than int64 codes).

    >>> hits, decided = _dense_decisions([np.array([[2.0], [-3.0], [0.0]]), np.array([[-1.0], [1.0], [0.0]])],
    ...                                  np.array([[1.0], [1.0], [0.0]]))
    >>> [h.tolist() for h in hits], decided.tolist()
    ([[1], [0]], [2])
    """
    sizes = [np.abs(p) for p in parts]
    best = sizes[0]
    for size in sizes[1:]:
        best = np.maximum(best, size)
    near = best * (1 - TIE_TOLERANCE)
    signal = np.abs(adv) > 1e-6
    positive = adv > 0
    taken = np.zeros(adv.shape, dtype=bool)
    hits = []
    for part, size in zip(parts, sizes, strict=True):
        wins = (size >= near) & ~taken
        taken |= wins
        # sign(part) == sign(adv) where adv carries signal (its sign is +-1 there)
        agrees = (part != 0) & ((part > 0) == positive)
        hits.append((wins & agrees & signal).sum(axis=0))
    return hits, signal.sum(axis=0)
