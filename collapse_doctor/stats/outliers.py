"""Outlier-dominated groups: the most extreme total far from the rest of its group, which still vary.

A group of at least 4 valid rows whose totals differ is outlier-dominated when its row with the largest
``|dev_t|`` (the first on ties) lies more than :data:`OUTLIER_GAP` stds (ddof=1) of the other rows away
from their mean, and those others are not constant (std above ``1e-6`` times the group's std).
``outlier_rest_std_*`` is the mean, over those groups, of the std of the other rows' advantages.
"""

from __future__ import annotations

import torch
from torch import Tensor

from collapse_doctor.stats.chunk import DenseChunk, GeneralChunk
from collapse_doctor.stats.kernels import first_argmax, ratio, segment_extreme

OUTLIER_GAP = 8.0
"""A group is outlier-dominated when its most extreme total sits this many stds of the rest away."""

NAMES = ("outlier_group_share", "outlier_rest_std_grpo", "outlier_rest_std_gdpo")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    gi, G, n_rows, valid_row, dev_t = c.group_index, c.num_groups, c.num_rows, c.valid_row, c.dev_t
    _, count_t, std_t = c.total_centred
    absdev = torch.where(valid_row, dev_t.abs(), torch.full_like(dev_t, -1.0))
    gmax = segment_extreme(absdev, gi, G, "amax")
    is_max = (absdev == gmax[gi]) & valid_row
    row_id = torch.arange(n_rows, device=c.device)
    first = torch.full((G,), n_rows, dtype=torch.int64, device=c.device).scatter_reduce(
        0, gi, torch.where(is_max, row_id, n_rows), reduce="amin", include_self=True
    )
    chosen = torch.zeros(n_rows, dtype=torch.bool, device=c.device)
    has_first = first < n_rows
    chosen[first[has_first]] = True
    n_others = count_t.double() - 1
    big_groups = (count_t >= 4) & (std_t > 0)

    def others_std(x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and std (ddof=1) of each group's values without its extreme row."""
        x = torch.where(valid_row, x, torch.zeros_like(x)).double()
        s1 = c.group_sum(torch.where(chosen, 0.0, x))
        s2 = c.group_sum(torch.where(chosen, 0.0, x * x))
        mean_o = s1 / n_others.clamp_min(1)
        var_o = (s2 - n_others * mean_o**2) / (n_others - 1).clamp_min(1)
        return mean_o, var_o.clamp_min(0).sqrt()

    mean_o, std_o = others_std(dev_t)
    extreme = c.group_sum(torch.where(chosen, dev_t.double(), 0.0))
    spread_o = std_o.clamp_min(1e-12)
    gap = (extreme - mean_o).abs() / spread_o
    outlier = big_groups & (std_o > 1e-6 * std_t.double().clamp_min(1e-12)) & (gap > OUTLIER_GAP)
    n_big = c.steps_of_groups(big_groups.double())
    out = {"outlier_group_share": ratio(c.steps_of_groups(outlier.double()), n_big)}
    adv = c.input.advantages
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        _, std_adv_o = others_std(x)
        out[f"outlier_rest_std_{name}"] = ratio(
            c.steps_of_groups(torch.where(outlier, std_adv_o, 0.0)), c.steps_of_groups(outlier.double())
        )
    return out


def _others_std(x: Tensor, others: Tensor) -> tuple[Tensor, Tensor]:
    """Per group (column of ``x``, ``[g, G]``): mean and std (ddof=1) of the members marked in ``others``.

    ``others`` marks all members but one. In float64, where float32 inputs square exactly: a rest of
    equal values has a std of exactly 0.
    """
    g = x.shape[0]
    rest = x.double() * others
    mean_o = rest.sum(dim=0) / (g - 1)
    var_o = ((rest * rest).sum(dim=0) - (g - 1) * mean_o**2) / max(g - 2, 1)
    return mean_o, var_o.clamp_min(0).sqrt()


def dense(c: DenseChunk) -> dict[str, Tensor]:
    g, dev_t, std_t = c.g, c.dev_t, c.std_t
    extreme_row, _ = first_argmax(list(dev_t.abs()))
    others = (torch.arange(g, device=c.device)[:, None] != extreme_row).to(torch.float64)  # all but the extreme
    mean_o, std_o = _others_std(dev_t, others)
    extreme = dev_t.gather(0, extreme_row[None]).squeeze(0).double()
    gap = (extreme - mean_o).abs() / std_o.clamp_min(1e-12)
    big = c.signal & (g >= 4)
    outlier = big & (std_o > 1e-6 * std_t.double().clamp_min(1e-12)) & (gap > OUTLIER_GAP)
    out = {"outlier_group_share": ratio(c.steps_sum(outlier), c.steps_sum(big))}
    n_outlier = c.steps_sum(outlier)
    outliers = torch.nonzero(outlier).squeeze(1)  # few: the rest's advantage std is only needed there
    for name, x in c.advantages.items():
        _, std_adv_o = _others_std(x[:, outliers], others[:, outliers])
        rest_std = torch.zeros(c.num_groups, dtype=torch.float64, device=c.device).index_copy_(0, outliers, std_adv_o)
        out[f"outlier_rest_std_{name}"] = ratio(c.steps_sum(rest_std), n_outlier)
    return out
