"""A chunk of rollouts, and its two prepared forms: what every statistic family reads.

:class:`ChunkInput` is what callers pass. :func:`~collapse_doctor.stats.step_statistics` wraps it once in
a :class:`GeneralChunk` (any layout: scatters over a dense group index) or, when :func:`dense_group_size`
finds consecutive equal-size groups without NaN, a :class:`DenseChunk` (member-major ``[..., g, G]`` views).
Both hold the intermediates several families share (deviations from the group mean, the weighted total,
GDPO's fused sum, the groups that carry signal), each computed once, on first use.

Names: for a group and channel c, ``dev_c`` is the reward minus the group mean, ``t`` is the weighted total
reward (what GRPO normalises), ``s`` (``fused``) is GDPO's weighted sum of channel z-scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from collapse_doctor.advantages import AdvantageResult, Segments, centered_segments
from collapse_doctor.stats.kernels import segment_extreme, segment_sum

MAX_DENSE_GROUP = 64
"""Largest group size for the dense path (its pair comparisons are [G, g, g])."""


@dataclass(frozen=True)
class ChunkInput:
    """One chunk of rollouts and its recomputed advantages (all on one device)."""

    rewards: Tensor
    group_index: Tensor
    step_index: Tensor
    weights: Tensor
    advantages: AdvantageResult
    num_groups: int
    num_steps: int
    logged: Tensor | None = None


def dense_group_size(chunk: ChunkInput) -> int | None:
    """The group size when rows come in consecutive equal-size groups and no reward is NaN, else None.

    That layout (TRL's, and most dumps) lets every group statistic be a reduction over a ``[G, g]`` view.
    """
    n = chunk.rewards.shape[0]
    groups = chunk.num_groups
    if groups == 0 or n % groups:
        return None
    g = n // groups
    if not 2 <= g <= MAX_DENSE_GROUP or bool(torch.isnan(chunk.rewards).any()):
        return None
    expected = torch.arange(n, device=chunk.group_index.device) // g
    return g if torch.equal(chunk.group_index, expected) else None


class GeneralChunk:
    """A chunk in any layout (shuffled rows, ragged groups, NaN rewards): rows ``[N]``, groups ``[G]``.

    Row values reduce per group with :meth:`group_sum`, per-group values per step with :meth:`steps_of_groups`,
    row values per step with :meth:`steps_sum` (all float64).
    """

    def __init__(self, chunk: ChunkInput) -> None:
        self.input = chunk
        self.rewards = r = chunk.rewards
        self.group_index = gi = chunk.group_index
        self.step_index = si = chunk.step_index
        self.num_groups = G = chunk.num_groups
        self.num_steps = chunk.num_steps
        self.num_rows, self.num_channels = r.shape
        self.device = r.device
        self.weights = chunk.weights.to(r.dtype)
        self.valid_row = ~torch.isnan(r).all(dim=1)
        """Rows with at least one reward (all-NaN rows are left out of every group)."""
        self.groups = Segments.build(gi, G)
        self.group_step = torch.zeros(G, dtype=torch.int64, device=self.device).scatter_(0, gi, si)
        """``[G]`` the step of each group."""
        self.group_rows = torch.bincount(gi[self.valid_row], minlength=G).to(torch.float64)
        """``[G]`` valid rows per group."""

    def group_sum(self, values: Tensor) -> Tensor:
        """Rows ``[N]`` summed per group: ``[G]``."""
        return segment_sum(values, self.group_index, self.num_groups)

    def steps_of_groups(self, values: Tensor) -> Tensor:
        """Per-group values ``[G]`` summed per step: ``[S]``."""
        return segment_sum(values, self.group_step, self.num_steps)

    def steps_sum(self, values: Tensor) -> Tensor:
        """Rows ``[N]`` or ``[N, K]`` summed per step: ``[S]`` or ``[S, K]``."""
        return segment_sum(values, self.step_index, self.num_steps)

    @cached_property
    def steps(self) -> Segments:
        return Segments.build(self.step_index, self.num_steps)

    @cached_property
    def columns(self) -> list[Tensor]:
        """Each channel's rewards as a contiguous ``[N]`` (1-D scatters are fast, ``[N, C]`` ones are not)."""
        return [self.rewards[:, c].contiguous() for c in range(self.num_channels)]

    @cached_property
    def channel_centred(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per channel: deviation from the group mean (NaN where the reward is), group count and std."""
        return [centered_segments(x, self.groups) for x in self.columns]

    @cached_property
    def dev(self) -> Tensor:
        """``[N, C]`` deviations ``dev_c``, 0 where the reward is NaN."""
        return torch.stack([torch.nan_to_num(dev, nan=0.0) for dev, _, _ in self.channel_centred], dim=1)

    @cached_property
    def total(self) -> Tensor:
        """``[N]`` weighted total reward ``t`` (NaN rewards skipped; NaN on all-NaN rows)."""
        r = self.rewards
        nan = torch.full((self.num_rows,), torch.nan, device=self.device)
        return torch.where(self.valid_row, (r * self.weights).nansum(dim=1), nan)

    @cached_property
    def total_centred(self) -> tuple[Tensor, Tensor, Tensor]:
        """The total's deviation from the group mean, group count and group std."""
        return centered_segments(self.total, self.groups)

    @cached_property
    def dev_t(self) -> Tensor:
        """``[N]`` deviation of the total from its group mean, 0 on all-NaN rows."""
        return torch.nan_to_num(self.total_centred[0], nan=0.0)

    @cached_property
    def eligible(self) -> Tensor:
        """``[G]`` groups with at least two valid rows."""
        return self.total_centred[1] >= 2

    @cached_property
    def signal_group(self) -> Tensor:
        """``[G]`` groups that carry signal: at least two valid rows whose totals differ."""
        return self.eligible & (self.total_centred[2] > 0)

    @cached_property
    def signal_rows(self) -> Tensor:
        """``[N]`` valid rows of the groups that carry signal."""
        return self.signal_group[self.group_index] & self.valid_row

    @cached_property
    def zscores(self) -> Tensor:
        """``[N, C]`` per-channel group z-scores, 0 where the reward is NaN."""
        return torch.nan_to_num(self.input.advantages.zscores, nan=0.0)

    @cached_property
    def fused(self) -> Tensor:
        """``[N]`` GDPO's weighted sum of channel z-scores ``s``."""
        return (self.zscores * self.weights).sum(dim=1)

    @cached_property
    def column_has_nan(self) -> list[bool]:
        """Per channel: whether any of its rewards is NaN (a column without NaN makes every row valid)."""
        return [bool(torch.isnan(x).any()) for x in self.columns]

    @cached_property
    def all_valid(self) -> bool:
        """Every row has at least one reward."""
        return bool(self.valid_row.all())

    @cached_property
    def channel_extremes(self) -> list[tuple[Tensor, Tensor]]:
        """Per channel: ``[G]`` group max and min over its non-NaN rewards (-inf / +inf for a group with none)."""
        gi, G = self.group_index, self.num_groups
        return [(segment_extreme(x, gi, G, "amax"), segment_extreme(x, gi, G, "amin")) for x in self.columns]

    @cached_property
    def step_extremes(self) -> tuple[Tensor, Tensor]:
        """``[S, C]`` each channel's max and min over the step's non-NaN rewards (-inf / +inf where none), in
        the rewards' dtype (so they compare exactly with the group extremes)."""
        si, S = self.group_step, self.num_steps
        high = [segment_extreme(hi, si, S, "amax") for hi, _ in self.channel_extremes]
        low = [segment_extreme(lo, si, S, "amin") for _, lo in self.channel_extremes]
        empty = torch.empty((S, 0), dtype=self.rewards.dtype, device=self.device)
        if not high:
            return empty, empty
        return torch.stack(high, dim=1), torch.stack(low, dim=1)

    @cached_property
    def constant_at(self) -> tuple[list[Tensor], list[Tensor]]:
        """Per channel: ``[G]`` whether its non-NaN values in the group are all equal to the step's maximum
        (first list) or minimum (second list) of the channel; False for a group without a value."""
        high, low = self.step_extremes
        at_max, at_min = [], []
        for k, (hi, lo) in enumerate(self.channel_extremes):
            constant = hi == lo
            at_max.append(constant & (hi == high[self.group_step, k]))
            at_min.append(constant & (lo == low[self.group_step, k]))
        return at_max, at_min

    @cached_property
    def total_ss(self) -> Tensor:
        """``[S]`` sum of ``dev_t^2`` over the step's rows."""
        return self.steps_sum(self.dev_t**2)

    @cached_property
    def pooled_total_std(self) -> Tensor:
        """``[S]`` pooled within-group std of the totals: ``sqrt(sum dev_t^2 / sum (n_g - 1))`` over the groups
        with 2+ valid rows (NaN for a step without such a group)."""
        dof = self.steps_of_groups(torch.where(self.eligible, self.group_rows - 1, 0.0))
        return torch.where(dof > 0, (self.total_ss / dof.clamp_min(1.0)).sqrt(), torch.nan)

    def trl_deviations(self) -> list[Tensor]:
        """Per channel: ``[N]`` float64 deviation of the reward, NaN read as 0 (as TRL's ``nansum`` of the
        weighted total does), from its group mean over the valid rows; 0 on rows without any reward.

        With these ``dev_t = sum_k w_k D_k`` holds exactly, NaN rewards or not. Not kept (one family reads
        them).
        """
        out = []
        for k, x in enumerate(self.columns):
            if not self.column_has_nan[k]:
                out.append(self.channel_centred[k][0].double())  # no NaN: every row is valid
                continue
            filled = torch.where(self.valid_row, torch.nan_to_num(x, nan=0.0), torch.nan)
            dev, _, _ = centered_segments(filled, self.groups)
            out.append(torch.nan_to_num(dev.double(), nan=0.0))
        return out


class DenseChunk:
    """A chunk of consecutive groups of ``g`` rows without NaN, in member-major layout.

    Each tensor is laid out ``[..., g, G]`` (member of the group, then group), so a reduction over a group
    adds ``g`` contiguous rows of length ``G``: several times faster on CPU than reducing a short last
    dimension. Elementwise work stays in float32 and only per-group values go to float64.
    """

    def __init__(self, chunk: ChunkInput, g: int) -> None:
        self.input = chunk
        self.g = g
        self.rewards = chunk.rewards
        self.step_index = si = chunk.step_index
        self.num_steps = S = chunk.num_steps
        self.num_groups = G = chunk.num_groups
        self.num_channels = self.rewards.shape[1]
        self.device = self.rewards.device
        self.weights = chunk.weights.to(self.rewards.dtype).tolist()
        self.group_step = si.view(G, g)[:, 0]
        """``[G]`` the step of each group (steps are sorted)."""
        self.groups_per_step = torch.bincount(self.group_step, minlength=S)
        self.gps = self.groups_per_step.to(torch.float64)
        """``[S]`` groups per step, float64."""

    def steps_sum(self, x: Tensor) -> Tensor:
        """Per-group values ``[G]`` or ``[K, G]`` summed per step: ``[S]`` or ``[S, K]`` (steps are sorted).

        Row by row: a 1-D segment reduction is several times faster than one over ``[G, K]``, with the same sums.
        """
        lengths = self.groups_per_step
        if x.ndim == 1:
            return torch.segment_reduce(x.to(torch.float64), "sum", lengths=lengths, axis=0)
        if x.shape[0] == 0:
            return torch.zeros((self.num_steps, 0), dtype=torch.float64, device=x.device)
        rows = [torch.segment_reduce(row.to(torch.float64).contiguous(), "sum", lengths=lengths) for row in x]
        return torch.stack(rows, dim=1)

    def members(self, x: Tensor) -> Tensor:
        """Rows ``[N]`` or ``[N, K]`` as ``[g, G]`` or ``[K, g, G]``."""
        G, g = self.num_groups, self.g
        if x.ndim == 1:
            return x.view(G, g).t().contiguous()
        return x.view(G, g, x.shape[1]).permute(2, 1, 0).contiguous()

    def centred(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Deviation from the group mean (shifted by the group's first value) and the group std."""
        shifted = x - x[..., :1, :]
        dev = shifted - shifted.mean(dim=-2, keepdim=True)
        return dev, ((dev * dev).sum(dim=-2) / (self.g - 1)).sqrt()

    def weighted(self, parts: Tensor) -> list[Tensor]:
        """Channel parts ``[C, ...]`` times their weights, one tensor per channel."""
        return [parts[c] * self.weights[c] for c in range(self.num_channels)]

    @staticmethod
    def channel_sum(parts: list[Tensor]) -> Tensor:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    @cached_property
    def weight_column(self) -> Tensor:
        """``[C]`` weights, float64."""
        return torch.tensor(self.weights, dtype=torch.float64, device=self.device)

    @cached_property
    def member_rewards(self) -> Tensor:
        """``[C, g, G]`` rewards."""
        return self.members(self.rewards)

    @cached_property
    def channel_centred(self) -> tuple[Tensor, Tensor]:
        """``[C, g, G]`` deviations ``dev_c`` and ``[C, G]`` group stds."""
        return self.centred(self.member_rewards)

    @property
    def dev(self) -> Tensor:
        return self.channel_centred[0]

    @cached_property
    def total(self) -> Tensor:
        """``[g, G]`` weighted total reward ``t``."""
        return self.channel_sum(self.weighted(self.member_rewards))

    @cached_property
    def total_centred(self) -> tuple[Tensor, Tensor]:
        """``[g, G]`` deviation of the total from its group mean and ``[G]`` its group std."""
        return self.centred(self.total)

    @property
    def dev_t(self) -> Tensor:
        return self.total_centred[0]

    @property
    def std_t(self) -> Tensor:
        return self.total_centred[1]

    @cached_property
    def zscores(self) -> Tensor:
        """``[C, g, G]`` per-channel group z-scores (no NaN: the rewards have none)."""
        return self.members(self.input.advantages.zscores)

    @cached_property
    def fused(self) -> Tensor:
        """``[g, G]`` GDPO's weighted sum of channel z-scores ``s``."""
        return self.channel_sum(self.weighted(self.zscores))

    @cached_property
    def signal(self) -> Tensor:
        """``[G]`` groups that carry signal (their totals differ)."""
        return self.std_t > 0

    @cached_property
    def signal_float(self) -> Tensor:
        """``[G]`` :attr:`signal` as 0/1 in the rewards' dtype."""
        return self.signal.to(self.rewards.dtype)

    @cached_property
    def num_signal(self) -> Tensor:
        """``[S]`` groups that carry signal, float64."""
        return self.steps_sum(self.signal)

    @cached_property
    def advantages(self) -> dict[str, Tensor]:
        """``{"grpo": [g, G], "gdpo": [g, G]}`` recomputed advantages."""
        adv = self.input.advantages
        return {"grpo": self.members(adv.grpo), "gdpo": self.members(adv.gdpo)}

    @cached_property
    def member_extremes(self) -> tuple[Tensor, Tensor]:
        """``[C, G]`` each channel's group max and min."""
        rewards = self.member_rewards
        return rewards.amax(dim=-2), rewards.amin(dim=-2)

    @cached_property
    def step_extremes(self) -> tuple[Tensor, Tensor]:
        """``[S, C]`` each channel's max and min over the step (-inf / +inf for a step without rows), in the
        rewards' dtype."""
        high, low = self.member_extremes
        lengths = self.groups_per_step  # 1-D segment reductions: several times faster than one over [G, C]
        return (
            torch.stack([torch.segment_reduce(x, "max", lengths=lengths) for x in high], dim=1),
            torch.stack([torch.segment_reduce(x, "min", lengths=lengths) for x in low], dim=1),
        )

    @cached_property
    def constant_at(self) -> tuple[Tensor, Tensor]:
        """``[C, G]`` whether the channel is constant in the group at the step's maximum (first) or minimum."""
        high, low = self.member_extremes
        step_high, step_low = self.step_extremes
        constant = high == low
        return (
            constant & (high == step_high.t()[:, self.group_step]),
            constant & (low == step_low.t()[:, self.group_step]),
        )

    @cached_property
    def total_ss(self) -> Tensor:
        """``[S]`` sum of ``dev_t^2`` over the step's rows."""
        dev_t = self.dev_t
        return self.steps_sum((dev_t * dev_t).sum(dim=0))

    @cached_property
    def pooled_total_std(self) -> Tensor:
        """``[S]`` pooled within-group std of the totals: ``sqrt(sum dev_t^2 / sum (n_g - 1))``."""
        dof = self.gps * (self.g - 1)
        return torch.where(dof > 0, (self.total_ss / dof.clamp_min(1.0)).sqrt(), torch.nan)
