"""Per channel: within-group range (rel_gain), std, share of constant groups, mean reward."""

from __future__ import annotations

import torch
from torch import Tensor

from collapse_doctor.stats.chunk import DenseChunk, GeneralChunk
from collapse_doctor.stats.kernels import ratio, segment_extreme

NAMES = ("rel_gain", "reward_std", "channel_zero_var_share", "reward_mean")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    gi, G = c.group_index, c.num_groups
    rel_gain, spread, zero_var, means = [], [], [], []
    for x, (_, count, std) in zip(c.columns, c.channel_centred, strict=True):
        eligible = (count >= 2).to(torch.float64)
        span = (segment_extreme(x, gi, G, "amax") - segment_extreme(x, gi, G, "amin")).to(torch.float64)
        span = torch.where(count >= 2, span, torch.zeros_like(span))
        n_eligible = c.steps_of_groups(eligible)
        rel_gain.append(ratio(c.steps_of_groups(span), n_eligible))
        spread.append(ratio(c.steps_of_groups(torch.nan_to_num(std.double()) * eligible), n_eligible))
        zero_var.append(ratio(c.steps_of_groups(((std == 0) & (count >= 2)).double()), n_eligible))
        valid = ~torch.isnan(x)
        means.append(ratio(c.steps_sum(torch.nan_to_num(x.double())), c.steps_sum(valid.double())))
    return {
        "rel_gain": torch.stack(rel_gain, dim=1),
        "reward_std": torch.stack(spread, dim=1),
        "channel_zero_var_share": torch.stack(zero_var, dim=1),
        "reward_mean": torch.stack(means, dim=1),
    }


def dense(c: DenseChunk) -> dict[str, Tensor]:
    rewards, gps = c.member_rewards, c.gps[:, None]
    _, std = c.channel_centred
    return {
        "rel_gain": c.steps_sum(rewards.amax(dim=-2) - rewards.amin(dim=-2)) / gps,
        "reward_std": c.steps_sum(std) / gps,
        "channel_zero_var_share": c.steps_sum(std == 0) / gps,
        "reward_mean": c.steps_sum(rewards.sum(dim=-2)) / (c.gps * c.g)[:, None],
    }
