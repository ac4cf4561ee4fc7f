"""Outlier groups: the most extreme total far from the rest of its group, split into lone and heavy-tailed.

A group of at least 4 valid rows whose totals differ (a "big" group) is an outlier group when its row with
the largest ``|dev_t|`` (the first on ties), the extreme member,

- lies more than :data:`OUTLIER_GAP` stds (ddof=1) of the other rows away from their mean, those others not
  being constant (std above ``1e-6`` times the group's std), and
- lies more than :data:`OUTLIER_SCALE` times the step's pooled within-group std of the totals away from the
  others' mean (``sqrt(sum dev_t^2 / sum (n_g - 1))`` over the groups with 2+ valid rows), so that three
  near-equal members in a group of 4 do not make an ordinary member look extreme.

The channel deciding the extreme member is the one with the largest ``|w_c dev_c|`` in its row (the first
on ties; a NaN reward counts 0). When that channel is constant on the other members (their non-NaN values
of it all equal) the group is a lone outlier (``outlier_lone_share``): a single success or failure on one
channel, which is how GRPO learns from rare successes, not a pathology. The other outlier groups are heavy
tails, an extreme value on a channel that also varies among the rest (``outlier_group_share``), and
``outlier_rest_std_*`` is the mean, over those groups, of the std of the other rows' advantages. Both shares
are over the big groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import first_argmax, ratio, segment_extreme

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

OUTLIER_GAP = 8.0
"""A group is outlier-dominated when its most extreme total sits this many stds of the rest away."""
OUTLIER_SCALE = 3.0
"""... and more than this many pooled within-group stds of the step's totals from the rest's mean. The gap
alone is relative to the rest's own spread: in a group of 4 whose other three members happen to be close
(a std far below the step's typical one) an ordinary fourth member passes it; with groups of 4 that fired
in 4-10% of the groups of healthy continuous runs. Three pooled stds is far out for a normal deviation
(beyond it with probability 0.3%). A lone success on a binary channel (weight w, one success in a group of
n, in a share f of the step's groups, the others constant) is w from the rest's mean while the pooled std
is about ``w sqrt(f / n)``: it passes while such successes are rare (``sqrt(n / f) > 3``)."""

NAMES = ("outlier_group_share", "outlier_lone_share", "outlier_rest_std_grpo", "outlier_rest_std_gdpo")


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
    distance = (extreme - mean_o).abs()
    gap = distance / std_o.clamp_min(1e-12)
    far = distance > OUTLIER_SCALE * c.pooled_total_std[c.group_step]
    outlier = big_groups & (std_o > 1e-6 * std_t.double().clamp_min(1e-12)) & (gap > OUTLIER_GAP) & far

    # The lone test, on the few outlier groups only: is the deciding channel constant on the others?
    ids = torch.nonzero(outlier).squeeze(1)
    k_of_group = torch.full((G,), -1, dtype=torch.int64, device=c.device)
    k_of_group[ids] = torch.arange(ids.numel(), device=c.device)
    extreme_rows = first[ids]
    contributions = (c.dev[extreme_rows] * c.weights).abs()
    decider, _ = first_argmax(list(contributions.unbind(dim=1)))
    k_row = k_of_group[gi]
    rest = torch.nonzero((k_row >= 0) & valid_row & ~chosen).squeeze(1)
    k_rest = k_row[rest]
    values = c.rewards[rest, decider[k_rest]]
    K = ids.numel()
    lone_k = segment_extreme(values, k_rest, K, "amax") == segment_extreme(values, k_rest, K, "amin")
    lone = torch.zeros(G, dtype=torch.bool, device=c.device)
    lone[ids] = lone_k
    heavy = outlier & ~lone

    n_big = c.steps_of_groups(big_groups.double())
    out = {
        "outlier_group_share": ratio(c.steps_of_groups(heavy.double()), n_big),
        "outlier_lone_share": ratio(c.steps_of_groups(lone.double()), n_big),
    }
    adv = c.input.advantages
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        _, std_adv_o = others_std(x)
        out[f"outlier_rest_std_{name}"] = ratio(
            c.steps_of_groups(torch.where(heavy, std_adv_o, 0.0)), c.steps_of_groups(heavy.double())
        )
    return out


def _others_std(x: np.ndarray, others: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (column of ``x``, ``[g, G]``): mean and std (ddof=1) of the members marked in ``others``.

    ``others`` marks all members but one. In float64, where float32 inputs square exactly: a rest of
    equal values has a std of exactly 0.
    """
    g = x.shape[0]
    rest = x.astype(np.float64) * others
    mean_o = rest.sum(axis=0) / (g - 1)
    var_o = ((rest * rest).sum(axis=0) - (g - 1) * mean_o**2) / max(g - 2, 1)
    return mean_o, np.sqrt(np.maximum(var_o, 0))


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    g, dev_t, std_t = c.g, c.dev_t, c.std_t
    ratio = dense_np.ratio
    extreme_row, _ = dense_np.first_argmax(list(np.abs(dev_t)))
    others = (np.arange(g)[:, None] != extreme_row).astype(np.float64)  # all but the extreme
    mean_o, std_o = _others_std(dev_t, others)
    extreme = np.take_along_axis(dev_t, extreme_row[None], 0)[0].astype(np.float64)
    distance = np.abs(extreme - mean_o)
    gap = distance / np.maximum(std_o, 1e-12)
    far = distance > OUTLIER_SCALE * c.pooled_total_std[c.group_step]
    big = c.signal & (g >= 4)
    outlier = big & (std_o > 1e-6 * np.maximum(std_t.astype(np.float64), 1e-12)) & (gap > OUTLIER_GAP) & far

    ids = np.flatnonzero(outlier)  # few: the lone test and the rest's std are only needed there
    extreme_sel = extreme_row[ids][None]  # [1, K]
    dev_sel = c.dev[:, :, ids]  # [C, g, K]
    contributions = [
        np.abs(np.take_along_axis(dev_sel[k], extreme_sel, 0)[0] * np.float32(w)) for k, w in enumerate(c.weights)
    ]
    decider, _ = dense_np.first_argmax(contributions)
    values = c.member_rewards[decider, :, ids].T  # [g, K]: the deciding channel's rewards in each outlier group
    others_sel = others[:, ids] > 0
    high = np.where(others_sel, values, -np.inf).max(axis=0, initial=-np.inf)
    low = np.where(others_sel, values, np.inf).min(axis=0, initial=np.inf)
    lone = np.zeros(c.num_groups, dtype=bool)
    lone[ids] = high == low
    heavy = outlier & ~lone

    n_big = c.steps_sum(big)
    n_heavy = c.steps_sum(heavy)
    out = {"outlier_group_share": ratio(n_heavy, n_big), "outlier_lone_share": ratio(c.steps_sum(lone), n_big)}
    heavy_ids = np.flatnonzero(heavy)
    for name, x in c.advantages.items():
        _, std_adv_o = _others_std(x[:, heavy_ids], others[:, heavy_ids])
        rest_std = np.zeros(c.num_groups)
        rest_std[heavy_ids] = std_adv_o
        out[f"outlier_rest_std_{name}"] = ratio(c.steps_sum(rest_std), n_heavy)
    return out
