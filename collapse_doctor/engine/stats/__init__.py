"""Per-step statistics of a chunk of rollouts, as pure functions on arrays (torch, or NumPy for the dense path).

Input is a chunk of rows from one or more training steps (:class:`ChunkInput`): ``rewards`` ``[N, C]``, a
dense ``group_index`` (unique across the chunk), a dense ``step_index`` and the advantages recomputed by
:mod:`collapse_doctor.engine.advantages`. Every statistic is reduced to one value per step (``[S]``), per step and
channel (``[S, C]``) or per step and channel pair (``[S, P]``); the detectors only ever see these small
series, catalogued in :data:`collapse_doctor.core.series.SERIES`.

One module per family of statistics, each with its general implementation (any layout, torch on any device:
scatters over the group index, :class:`~collapse_doctor.engine.stats.chunk.GeneralChunk`) and its dense one
(consecutive equal-size groups without NaN on CPU, NumPy on member-major views, with the advantages computed
from the same deviations: :class:`~collapse_doctor.engine.stats.dense.DenseChunk`) side by side, and the names it
produces in ``NAMES``. A test checks that both paths agree. Results are NumPy float64 arrays either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collapse_doctor.core.series import in_catalogue_order
from collapse_doctor.engine.stats import (
    channels,
    completions,
    correlation,
    counterfactuals,
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
from collapse_doctor.engine.stats.chunk import ChunkInput, GeneralChunk, dense_group_size
from collapse_doctor.engine.stats.dense import MAX_DENSE_GROUP, CompletionRows, DenseChunk, dense_layout
from collapse_doctor.engine.stats.kernels import to_host
from collapse_doctor.engine.stats.outliers import OUTLIER_GAP, OUTLIER_SCALE
from collapse_doctor.engine.stats.silence import SILENT_SPAN
from collapse_doctor.engine.stats.ties import ADV_TIE_QUANTUM, DISTINCT_QUANTUM, TIE_QUANTUM

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
    "CompletionRows",
    "DenseChunk",
    "dense_group_size",
    "dense_layout",
    "step_statistics",
]

FAMILIES = (
    sizes,
    channels,
    signal,
    silence,
    completions,
    dominance,
    shape,
    outliers,
    ties,
    correlation,
    logged,
    weightfit,
    counterfactuals,
)
"""The statistic families; each has ``NAMES``, ``general(GeneralChunk)`` and ``dense(DenseChunk)``."""
LOGGED_FAMILIES = (logged, weightfit)
"""The families that produce their series only when the chunk has a logged advantage."""


def step_statistics(chunk: ChunkInput | DenseChunk, *, allow_dense: bool = True) -> dict[str, np.ndarray]:
    """Reduce a chunk to per-step statistics (float64 arrays ``[S]``, ``[S, C]`` or ``[S, P]``).

    A :class:`DenseChunk` (the NumPy engine) goes through the dense path; a torch :class:`ChunkInput` too
    when it is on CPU in the dense layout (and ``allow_dense``), else through the general path. Keys in
    :data:`collapse_doctor.core.series.SERIES` order; the pair-shaped series need two channels, ``logged_*`` and
    ``wfit_*`` a logged advantage.

    >>> import torch
    >>> from collapse_doctor.engine.advantages import compute_advantages
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
    if isinstance(chunk, ChunkInput):
        g = dense_group_size(chunk) if allow_dense else None
        if g is None:
            general = GeneralChunk(chunk)
            out = {}
            for family in FAMILIES:
                out.update(
                    {k: to_host(v) if not isinstance(v, np.ndarray) else v for k, v in family.general(general).items()}
                )
            return in_catalogue_order({k: np.asarray(v, dtype=np.float64) for k, v in out.items()})
        chunk = DenseChunk.from_input(chunk, g)
    dense: dict[str, np.ndarray] = {}
    for family in FAMILIES:
        dense.update({k: _on_host(v) for k, v in family.dense(chunk).items()})
    return in_catalogue_order(dense)


def _on_host(values: Any) -> np.ndarray:
    """A family's result (a torch tensor on any device, or a NumPy array) as a float64 NumPy array."""
    return np.asarray(to_host(values), dtype=np.float64)
