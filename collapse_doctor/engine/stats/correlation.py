"""Within-group (demeaned) correlation of each channel pair, with its sufficient sums.

For the pair (i, j), over the rows where both rewards exist: ``corr_sxy = sum dev_i dev_j``,
``corr_sxx = sum dev_i^2``, ``corr_syy = sum dev_j^2`` (deviations from each channel's own group mean)
and ``within_corr = sxy / sqrt(sxx syy)``. Pairs in ``itertools.combinations`` order; none for one channel.

The support: ``corr_rows`` counts the rows with both rewards in groups that have 2+ such rows,
``corr_groups`` those groups (a group with a single such row adds no within-group co-variation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.core.series import pair_indices
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import ratio

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

NAMES = ("corr_sxy", "corr_sxx", "corr_syy", "within_corr", "corr_rows", "corr_groups")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    pairs = pair_indices(c.num_channels)
    if not pairs:
        return {}
    r, dev = c.rewards, c.dev
    both = [(~torch.isnan(r[:, i]) & ~torch.isnan(r[:, j])).double() for i, j in pairs]
    sxy = torch.stack([c.steps_sum(dev[:, i] * dev[:, j] * b) for (i, j), b in zip(pairs, both, strict=True)], 1)
    sxx = torch.stack([c.steps_sum(dev[:, i] ** 2 * b) for (i, _), b in zip(pairs, both, strict=True)], 1)
    syy = torch.stack([c.steps_sum(dev[:, j] ** 2 * b) for (_, j), b in zip(pairs, both, strict=True)], 1)
    rows, groups = [], []
    for (i, j), b in zip(pairs, both, strict=True):
        nan_free = not (c.column_has_nan[i] or c.column_has_nan[j])
        count = c.groups.rows.double() if nan_free else c.group_sum(b)
        enough = count >= 2
        rows.append(c.steps_of_groups(torch.where(enough, count, 0.0)))
        groups.append(c.steps_of_groups(enough.double()))
    return {
        "corr_sxy": sxy,
        "corr_sxx": sxx,
        "corr_syy": syy,
        "within_corr": ratio(sxy, (sxx * syy).sqrt()),
        "corr_rows": torch.stack(rows, 1),
        "corr_groups": torch.stack(groups, 1),
    }


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    pairs = pair_indices(c.num_channels)
    if not pairs:
        return {}
    dev = c.dev
    squares = c.steps_sum((dev * dev).sum(axis=-2))  # [S, C]
    sxy = np.stack([c.steps_sum((dev[i] * dev[j]).sum(axis=0)) for i, j in pairs], 1)
    sxx = np.stack([squares[:, i] for i, _ in pairs], 1)
    syy = np.stack([squares[:, j] for _, j in pairs], 1)
    groups = np.repeat(c.gps[:, None], len(pairs), axis=1)
    return {
        "corr_sxy": sxy,
        "corr_sxx": sxx,
        "corr_syy": syy,
        "within_corr": dense_np.ratio(sxy, np.sqrt(sxx * syy)),
        "corr_rows": groups * c.g,
        "corr_groups": groups,
    }
