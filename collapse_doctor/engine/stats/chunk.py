"""A chunk of rollouts on torch, and its prepared form for the general path: what every statistic family reads.

:class:`ChunkInput` is what torch callers pass (tensors on one device, advantages from
:mod:`collapse_doctor.engine.advantages`). :func:`~collapse_doctor.engine.stats.step_statistics` wraps it once in a
:class:`GeneralChunk` (any layout: scatters over a dense group index) or, when it is on CPU and
:func:`dense_group_size` finds consecutive equal-size groups without NaN, hands it to the NumPy
:class:`~collapse_doctor.engine.stats.dense.DenseChunk` (member-major ``[..., g, G]`` views). Both hold the
intermediates several families share (deviations from the group mean, the weighted total, GDPO's fused sum,
the groups that carry signal), each computed once, on first use.

Names: for a group and channel c, ``dev_c`` is the reward minus the group mean, ``t`` is the weighted total
reward (what GRPO normalises), ``s`` (``fused``) is GDPO's weighted sum of channel z-scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from collapse_doctor.engine.advantages import AdvantageResult, Segments, centered_segments
from collapse_doctor.engine.stats.dense import CompletionRows, dense_layout
from collapse_doctor.engine.stats.kernels import segment_extreme, segment_sum, to_host

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch


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
    completions: CompletionRows | None = None
    """The rows' completion codes and lengths as NumPy arrays on the host (whatever the device), or None."""


def dense_group_size(chunk: ChunkInput) -> int | None:
    """The group size when the chunk can take the NumPy dense path: float32 on CPU (as the engine computes: a
    float64 chunk keeps its precision on torch) in the dense layout (:func:`~collapse_doctor.engine.stats.dense.
    dense_layout`); else None."""
    if chunk.rewards.device.type != "cpu" or chunk.rewards.dtype != torch.float32:
        return None
    return dense_layout(
        to_host(chunk.rewards), to_host(chunk.group_index), chunk.num_groups, to_host(chunk.step_index), chunk.num_steps
    )


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
        if not any(self.column_has_nan):  # channel after channel, as the advantage engine sums them
            total = self.columns[0] * self.weights[0]
            for k in range(1, self.num_channels):
                total = total + self.columns[k] * self.weights[k]
            return total
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
    def equal_rewards(self) -> Tensor:
        """``[G]`` groups whose valid rows have equal reward vectors: every channel either NaN on all of them or
        present on all and constant."""
        same = torch.ones(self.num_groups, dtype=torch.bool, device=self.device)
        for (_, count, _), (high, low) in zip(self.channel_centred, self.channel_extremes, strict=True):
            count = count.to(torch.float64)
            same &= (count == 0) | ((count == self.group_rows) & (high == low))
        return same

    @cached_property
    def host_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Group index, step index and valid-row mask ``[N]`` as NumPy arrays (what the completion counts read)."""
        return to_host(self.group_index), to_host(self.step_index), to_host(self.valid_row)

    @cached_property
    def identical_completions(self) -> np.ndarray | None:
        """``[G]`` groups whose valid rows all have the same logged completion (one code, not null; True for a group
        without valid rows), None without completion codes."""
        rows = self.input.completions
        if rows is None or rows.codes is None:
            return None
        group, _, valid = self.host_rows
        codes, group = rows.codes[valid], group[valid]
        high = np.full(self.num_groups, np.iinfo(np.int64).min)
        low = np.full(self.num_groups, np.iinfo(np.int64).max)
        np.maximum.at(high, group, codes)
        np.minimum.at(low, group, codes)
        return np.asarray((high <= low) & (low >= 0))  # max <= min: one code (or no valid row); no null text

    @cached_property
    def known_completions(self) -> np.ndarray | None:
        """``[G]`` groups whose valid rows all have a logged completion (no null text), None without codes."""
        rows = self.input.completions
        if rows is None or rows.codes is None:
            return None
        group, _, valid = self.host_rows
        low = np.full(self.num_groups, np.iinfo(np.int64).max)
        np.minimum.at(low, group[valid], rows.codes[valid])
        return np.asarray(low >= 0)

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
