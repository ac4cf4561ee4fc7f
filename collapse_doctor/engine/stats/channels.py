"""Per channel: within-group range (rel_gain), std, share of constant groups, mean, extremes and supports.

``channel_rows`` (non-NaN rows of the channel) and ``channel_groups`` (groups with 2+ non-NaN values of
it) are the supports: ``reward_mean`` rests on the first; ``rel_gain``, ``reward_std``,
``channel_zero_var_share`` and ``channel_at_max_groups`` / ``channel_at_min_groups`` on the second.
``reward_max`` / ``reward_min`` are the channel's max and min over the step's non-NaN rows (NaN when it has
none); a group is at the channel's ceiling (floor) when its values of the channel are all equal to the
step's ``reward_max`` (``reward_min``).
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

NAMES = (
    "rel_gain",
    "reward_std",
    "channel_zero_var_share",
    "reward_mean",
    "reward_max",
    "reward_min",
    "channel_rows",
    "channel_groups",
    "channel_at_max_groups",
    "channel_at_min_groups",
)


def _finite_or_nan(x: Tensor) -> Tensor:
    x = x.to(torch.float64)
    return torch.where(torch.isfinite(x), x, torch.nan)


def general(c: GeneralChunk) -> dict[str, Tensor]:
    rel_gain, spread, zero_var, means, rows, groups, at_max, at_min = [], [], [], [], [], [], [], []
    step_max, step_min = c.step_extremes
    top, bottom = c.constant_at
    for k, (x, (_, count, std)) in enumerate(zip(c.columns, c.channel_centred, strict=True)):
        eligible = (count >= 2).to(torch.float64)
        hi, lo = c.channel_extremes[k]
        span = (hi - lo).to(torch.float64)
        span = torch.where(count >= 2, span, torch.zeros_like(span))
        n_eligible = c.steps_of_groups(eligible)
        rel_gain.append(ratio(c.steps_of_groups(span), n_eligible))
        spread.append(ratio(c.steps_of_groups(torch.nan_to_num(std.double()) * eligible), n_eligible))
        zero_var.append(ratio(c.steps_of_groups(((std == 0) & (count >= 2)).double()), n_eligible))
        n_valid = c.steps_sum((~torch.isnan(x)).double())
        means.append(ratio(c.steps_sum(torch.nan_to_num(x.double())), n_valid))
        rows.append(n_valid)
        groups.append(n_eligible)
        at_max.append(c.steps_of_groups(top[k].double() * eligible))
        at_min.append(c.steps_of_groups(bottom[k].double() * eligible))
    return {
        "rel_gain": torch.stack(rel_gain, dim=1),
        "reward_std": torch.stack(spread, dim=1),
        "channel_zero_var_share": torch.stack(zero_var, dim=1),
        "reward_mean": torch.stack(means, dim=1),
        "reward_max": _finite_or_nan(step_max),
        "reward_min": _finite_or_nan(step_min),
        "channel_rows": torch.stack(rows, dim=1),
        "channel_groups": torch.stack(groups, dim=1),
        "channel_at_max_groups": torch.stack(at_max, dim=1),
        "channel_at_min_groups": torch.stack(at_min, dim=1),
    }


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    rewards, gps = c.member_rewards, c.gps[:, None]
    _, std = c.channel_centred
    high, low = c.member_extremes
    step_max, step_min = c.step_extremes
    top, bottom = c.constant_at
    support = np.repeat(gps, c.num_channels, axis=1)
    return {
        "rel_gain": c.steps_sum(high - low) / gps,
        "reward_std": c.steps_sum(std) / gps,
        "channel_zero_var_share": c.steps_sum(std == 0) / gps,
        "reward_mean": c.steps_sum(rewards.sum(axis=-2)) / (c.gps * c.g)[:, None],
        "reward_max": dense_np.finite_or_nan(step_max),
        "reward_min": dense_np.finite_or_nan(step_min),
        "channel_rows": support * c.g,
        "channel_groups": support,
        "channel_at_max_groups": c.steps_sum(top),
        "channel_at_min_groups": c.steps_sum(bottom),
    }
