"""Per-step statistics of a chunk of rollouts, as pure functions on torch tensors.

Input is a chunk of rows from one or more training steps (:class:`ChunkInput`): ``rewards`` ``[N, C]``, a
dense ``group_index`` (unique across the chunk), a dense ``step_index`` and the advantages recomputed by
:mod:`collapse_doctor.advantages`. Every statistic is reduced to one value per step (``[S]``), per step and
channel (``[S, C]``) or per step and channel pair (``[S, P]``); the detectors only ever see these small
series, catalogued in :data:`collapse_doctor.series.SERIES`.

One module per family of statistics, each with its general implementation (any layout: scatters over the
group index, :class:`~collapse_doctor.stats.chunk.GeneralChunk`) and its dense one (consecutive equal-size
groups without NaN, member-major views, :class:`~collapse_doctor.stats.chunk.DenseChunk`) side by side, and
the names it produces in ``NAMES``. A test checks that both paths agree.
"""

from __future__ import annotations

from torch import Tensor

from collapse_doctor.series import in_catalogue_order
from collapse_doctor.stats import (
    channels,
    correlation,
    dominance,
    logged,
    outliers,
    shape,
    signal,
    silence,
    sizes,
    ties,
    weightfit,
)
from collapse_doctor.stats.chunk import MAX_DENSE_GROUP, ChunkInput, DenseChunk, GeneralChunk, dense_group_size
from collapse_doctor.stats.outliers import OUTLIER_GAP, OUTLIER_SCALE
from collapse_doctor.stats.silence import SILENT_SPAN
from collapse_doctor.stats.ties import ADV_TIE_QUANTUM, DISTINCT_QUANTUM, TIE_QUANTUM

__all__ = [
    "ADV_TIE_QUANTUM",
    "DISTINCT_QUANTUM",
    "FAMILIES",
    "LOGGED_FAMILIES",
    "MAX_DENSE_GROUP",
    "OUTLIER_GAP",
    "OUTLIER_SCALE",
    "SILENT_SPAN",
    "TIE_QUANTUM",
    "ChunkInput",
    "dense_group_size",
    "step_statistics",
]

FAMILIES = (sizes, channels, signal, silence, dominance, shape, outliers, ties, correlation, logged, weightfit)
"""The statistic families; each has ``NAMES``, ``general(GeneralChunk)`` and ``dense(DenseChunk)``."""
LOGGED_FAMILIES = (logged, weightfit)
"""The families that produce their series only when the chunk has a logged advantage."""


def step_statistics(chunk: ChunkInput, *, allow_dense: bool = True) -> dict[str, Tensor]:
    """Reduce a chunk to per-step statistics (float64 tensors ``[S]``, ``[S, C]`` or ``[S, P]``).

    Keys in :data:`collapse_doctor.series.SERIES` order; the pair-shaped series need two channels,
    ``logged_*`` and ``wfit_*`` a logged advantage.

    >>> import torch
    >>> from collapse_doctor.advantages import compute_advantages
    >>> r = torch.tensor([[1.0, 0.2], [1.0, 0.8], [0.0, 0.5], [1.0, 0.5]])
    >>> g, s = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 0, 0])
    >>> w = torch.ones(2)
    >>> adv = compute_advantages(r, g, weights=w, step_index=s)
    >>> st = step_statistics(ChunkInput(r, g, s, w, adv, num_groups=2, num_steps=1))
    >>> st["rel_gain"].tolist()
    [[0.5, 0.30000001192092896]]
    >>> st["zero_var_share"].tolist(), st["tied_pair_share"].tolist()
    ([0.0], [0.0])
    """
    out: dict[str, Tensor] = {}
    g = dense_group_size(chunk) if allow_dense else None
    if g is not None:
        dense = DenseChunk(chunk, g)
        for family in FAMILIES:
            out.update(family.dense(dense))
    else:
        general = GeneralChunk(chunk)
        for family in FAMILIES:
            out.update(family.general(general))
    return in_catalogue_order(out)
