"""GRPO and GDPO advantages as pure functions on torch tensors.

Rows are sampled completions; ``rewards`` is ``[N, C]`` (one column per reward channel, NaN where a
reward does not apply); ``group_index`` is ``[N]`` with dense integer group ids ``0..G-1``; the
optional ``step_index`` is ``[N]`` with dense step ids and delimits the "batch" of batch-level
normalisation (one training step). Rows may come in any order and groups may have any size: every
group statistic is a segment reduction (``scatter_add``) over ``group_index``, never a Python loop
over groups and never a ``view(-1, G)`` reshape.

Conventions (see docs/input-formats.md, "Advantage conventions"):

``trl``
    TRL's ``GRPOTrainer``: ``std`` with ddof=1, ``+1e-4`` on the std, NaN rewards ignored
    (``nansum`` over channels, ``nanmean``/``nanstd`` per channel), groups of one give 0.
``verl``
    verl's ``compute_grpo_outcome_advantage``: ``+1e-6``; a group of one has mean 0 and std 1.
``paper``
    No epsilon; a group (or batch) whose std is 0 gives advantage 0.

In every convention a row whose rewards are all NaN gets advantage 0 and is left out of the group
and batch baselines, and a group whose values are all equal gets advantages of exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from collapse_doctor.errors import DeviceError, UsageError

Convention = Literal["trl", "verl", "paper"]
Scale = Literal["group", "batch", "none"]
CONVENTIONS: tuple[str, ...] = get_args(Convention)
SCALES: tuple[str, ...] = get_args(Scale)

_EPS: dict[str, float] = {"trl": 1e-4, "verl": 1e-6, "paper": 0.0}


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages of one batch of rows, all ``[N]`` except ``zscores`` (``[N, C]``)."""

    grpo: Tensor
    """GRPO (``sum_then_normalize``) advantages."""
    gdpo: Tensor
    """GDPO (``normalize_then_sum``) advantages."""
    zscores: Tensor
    """Per-channel group z-scores (NaN where the reward is NaN)."""


def resolve_device(device: str = "auto") -> torch.device:
    """Turn ``auto``/``cpu``/``cuda``/``cuda:N`` into a device, checking that it exists.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {device}: CUDA is not available on this machine", hint="use --device cpu or auto"
            )
        return torch.device(name)
    raise UsageError(f"--device {device!r} is not one of auto, cpu, cuda", hint="use --device auto")


def _check_option(value: str, allowed: tuple[str, ...], option: str) -> None:
    if value not in allowed:
        raise UsageError(f"{option} {value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class Segments:
    """A dense segment index (groups or steps) with what every reduction over it reuses.

    Built once per call and shared by all channels: the row count of each segment and the row that
    opens it (the per-segment shift, see :func:`centered_segments`).
    """

    index: Tensor
    size: int
    rows: Tensor
    """``[size]`` number of rows in each segment."""
    first: Tensor
    """``[size]`` position of one row of each segment (its first), clamped to a valid row."""
    block: int | None = None
    """When segments are consecutive blocks of equal size (row i is in segment i // block), that size."""

    @classmethod
    def build(cls, index: Tensor, size: int | None = None) -> Segments:
        index = index.to(torch.int64)
        n = index.numel()
        size = int(index.max()) + 1 if size is None and n else int(size or 0)
        rows = torch.bincount(index, minlength=size)
        block = None
        if n and bool((index[1:] >= index[:-1]).all()):
            first = torch.cumsum(rows, 0) - rows  # sorted rows: segments are contiguous blocks
            if size and n % size == 0 and bool((rows == n // size).all()):
                block = n // size  # sorted, dense ids, equal sizes: row i is in segment i // block
        else:
            positions = torch.arange(n, device=index.device)
            first = torch.full((size,), n, dtype=torch.int64, device=index.device)
            first = first.scatter_reduce(0, index, positions, reduce="amin", include_self=True)
        return cls(index=index, size=size, rows=rows, first=first.clamp(max=max(n - 1, 0)), block=block)

    def per_row(self, values: Tensor) -> Tensor:
        """Broadcast one value per segment to its rows."""
        if self.block is not None:
            return values.repeat_interleave(self.block)
        return values[self.index]


def centered_segments(
    values: Tensor,
    index: Tensor | Segments,
    num_segments: int | None = None,
    *,
    accumulate: torch.dtype | None = None,
    nan_free: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Deviation of each value from its segment's mean, plus each segment's count and std (ddof=1).

    NaN values are ignored (their deviation is NaN). Each segment is first shifted by one of its own
    values, so a segment of equal values has deviations and std of exactly 0, and large offsets do
    not eat float32 precision. ``std`` is NaN for segments with fewer than two values. ``nan_free``
    promises that ``values`` hold no NaN and skips looking for them.

    >>> dev, count, std = centered_segments(torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1]), 2)
    >>> dev.tolist(), count.tolist(), std.tolist()
    ([-1.0, 1.0, 0.0, 0.0], [2.0, 2.0], [1.4142135381698608, 0.0])
    """
    seg = index if isinstance(index, Segments) else Segments.build(index, num_segments)
    idx = seg.index
    dtype = accumulate or values.dtype
    zeros = torch.zeros(seg.size, dtype=dtype, device=values.device)
    nan = None if nan_free else torch.isnan(values)
    has_nan = nan is not None and bool(nan.any())
    if not has_nan and seg.block is not None:
        # Consecutive equal-size blocks without NaN: plain reductions over a [size, block] view.
        blocks = values.view(seg.size, seg.block)
        shifted_b = (blocks - blocks[:, :1]).to(dtype)
        deviation_b = shifted_b - shifted_b.mean(dim=1, keepdim=True)
        count = seg.rows.to(dtype)
        squares = (deviation_b * deviation_b).sum(dim=1)
        deviation = deviation_b.reshape(-1)
    elif not has_nan:
        # No NaN: shift by the segment's first value, counts are the row counts.
        shifted = (values - values[seg.first][idx]).to(dtype)
        count = seg.rows.to(dtype)
        mean = zeros.scatter_add(0, idx, shifted) / count
        deviation = shifted - mean[idx]
        squares = zeros.scatter_add(0, idx, deviation * deviation)
    else:
        assert nan is not None
        valid = ~nan
        neg_inf = torch.full((seg.size,), float("-inf"), dtype=values.dtype, device=values.device)
        shift = neg_inf.scatter_reduce(0, idx, torch.where(valid, values, float("-inf")), reduce="amax")
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        shifted = torch.where(valid, values - shift[idx], torch.zeros_like(values)).to(dtype)
        count = zeros.scatter_add(0, idx, valid.to(dtype))
        mean = zeros.scatter_add(0, idx, shifted) / count
        deviation = torch.where(valid, shifted - mean[idx], torch.full_like(shifted, float("nan")))
        squares = zeros.scatter_add(0, idx, torch.where(valid, deviation * deviation, torch.zeros_like(shifted)))
    std = torch.where(count >= 2, (squares / (count - 1)).sqrt(), torch.full_like(count, float("nan")))
    return deviation.to(values.dtype), count, std.to(values.dtype)


def _inverse_denominator(std: Tensor, convention: str) -> Tensor:
    """Per segment 1 / (std + eps), or 0 where that is undefined or zero (no ranking signal)."""
    denominator = torch.nan_to_num(std, nan=0.0) + _EPS[convention]
    return torch.where(denominator > 0, 1.0 / denominator.clamp_min(1e-30), torch.zeros_like(denominator))


def _normalize(
    values: Tensor,
    seg: Segments,
    convention: str,
    *,
    scale_by: tuple[Segments, Tensor] | None = None,
    divide: bool = True,
    accumulate: torch.dtype | None = None,
    nan_free: bool = False,
) -> Tensor:
    """Z-score ``values`` within segments under ``convention``; NaN values map to NaN.

    ``scale_by`` = (segments, std per segment) replaces the segment's own std (GRPO's batch scaling).
    """
    deviation, count, std = centered_segments(values, seg, accumulate=accumulate, nan_free=nan_free)
    single = count == 1
    verl_singles = convention == "verl" and bool(single.any())
    if verl_singles:
        # verl: a segment of one has mean 0 and std 1, so it keeps its raw value.
        deviation = torch.where(seg.per_row(single), values, deviation)
        std = torch.where(single, torch.ones_like(std), std)
    if not divide:
        return deviation
    if scale_by is None:
        factor = seg.per_row(_inverse_denominator(std, convention))
    else:
        scale_seg, scale_std = scale_by
        factor = scale_seg.per_row(_inverse_denominator(scale_std, convention))
    # NaN * 0 stays NaN: per-channel z-scores keep reporting "not applicable" where the reward was NaN.
    return deviation * factor.to(deviation.dtype)


def _prepare(
    rewards: Tensor, group_index: Tensor | Segments, weights: Tensor | None, step_index: Tensor | Segments | None
) -> tuple[Tensor, Segments, Tensor, Segments]:
    if rewards.ndim == 1:
        rewards = rewards[:, None]
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [N, C], got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    device = rewards.device
    n, c = rewards.shape
    groups = group_index if isinstance(group_index, Segments) else Segments.build(group_index.to(device))
    if weights is None:
        weights = torch.ones(c, dtype=rewards.dtype, device=device)
    weights = torch.as_tensor(weights, dtype=rewards.dtype, device=device).reshape(-1)
    if weights.numel() != c:
        raise ValueError(f"{weights.numel()} weights for {c} reward channels")
    if step_index is None:
        step_index = torch.zeros(n, dtype=torch.int64, device=device)
    steps = step_index if isinstance(step_index, Segments) else Segments.build(step_index.to(device))
    return rewards, groups, weights, steps


def _weighted_nansum(values: Tensor, weights: Tensor) -> Tensor:
    """Row sums of ``weights * values`` ignoring NaN; NaN where the whole row is NaN."""
    all_nan = torch.isnan(values).all(dim=1)
    total = (values * weights).nansum(dim=1)
    return torch.where(all_nan, torch.full_like(total, float("nan")), total)


def grpo_advantages(
    rewards: Tensor,
    group_index: Tensor | Segments,
    *,
    weights: Tensor | None = None,
    step_index: Tensor | Segments | None = None,
    scale: Scale = "group",
    convention: Convention = "trl",
) -> Tensor:
    """GRPO (``sum_then_normalize``): weighted sum of channels, then a z-score within each group.

    ``scale="batch"`` divides by the std of the summed rewards over the step instead of the group's,
    ``scale="none"`` only subtracts the group mean.

    >>> r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> [round(a, 4) for a in grpo_advantages(r, torch.tensor([0, 0, 0, 0])).tolist()]
    [0.0, 0.0, 1.2246, -1.2246]
    """
    _check_option(scale, SCALES, "--scale")
    _check_option(convention, CONVENTIONS, "--convention")
    rewards, groups, weights, steps = _prepare(rewards, group_index, weights, step_index)
    total = _weighted_nansum(rewards, weights)
    if scale == "group":
        adv = _normalize(total, groups, convention)
    elif scale == "none":
        adv = _normalize(total, groups, convention, divide=False)
    else:
        _, _, step_std = centered_segments(total, steps, accumulate=torch.float64)
        adv = _normalize(total, groups, convention, scale_by=(steps, step_std))
    return torch.nan_to_num(adv, nan=0.0)


def group_zscores(rewards: Tensor, group_index: Tensor | Segments, *, convention: Convention = "trl") -> Tensor:
    """Per-channel z-scores within each group, ``[N, C]``; NaN where the reward is NaN.

    A channel that is constant within a group scores exactly 0 there.

    >>> z = group_zscores(torch.tensor([[1.0, 5.0], [0.0, 5.0]]), torch.tensor([0, 0]))
    >>> z.double().round(decimals=4).tolist()
    [[0.707, 0.0], [-0.707, 0.0]]
    """
    _check_option(convention, CONVENTIONS, "--convention")
    rewards, groups, _, _ = _prepare(rewards, group_index, None, None)
    # Column by column: 1-D scatters stay fast when rows are shuffled, a [N, C] scatter does not.
    columns = [_normalize(rewards[:, k].contiguous(), groups, convention) for k in range(rewards.shape[1])]
    return torch.stack(columns, dim=1) if columns else rewards.clone()


def gdpo_advantages(
    rewards: Tensor,
    group_index: Tensor | Segments,
    *,
    weights: Tensor | None = None,
    step_index: Tensor | Segments | None = None,
    convention: Convention = "trl",
    zscores: Tensor | None = None,
) -> Tensor:
    """GDPO (``normalize_then_sum``): per-channel group z-scores, weighted sum, batch z-score per step.

    Pass ``zscores`` (from :func:`group_zscores`) to avoid computing them twice.

    >>> r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> [round(a, 4) for a in gdpo_advantages(r, torch.tensor([0, 0, 0, 0])).tolist()]
    [0.0, 0.0, 1.2247, -1.2247]
    """
    _check_option(convention, CONVENTIONS, "--convention")
    rewards, groups, weights, steps = _prepare(rewards, group_index, weights, step_index)
    if zscores is None:
        zscores = group_zscores(rewards, groups, convention=convention)
    all_nan = torch.isnan(rewards).all(dim=1)
    fused = (zscores * weights).nansum(dim=1)
    fused = torch.where(all_nan, torch.full_like(fused, float("nan")), fused)
    adv = _normalize(fused, steps, convention, accumulate=torch.float64)
    return torch.nan_to_num(adv, nan=0.0)


def compute_advantages(
    rewards: Tensor,
    group_index: Tensor | Segments,
    *,
    weights: Tensor | None = None,
    step_index: Tensor | Segments | None = None,
    scale: Scale = "group",
    convention: Convention = "trl",
) -> AdvantageResult:
    """GRPO and GDPO advantages and per-channel z-scores in one call.

    >>> res = compute_advantages(torch.tensor([[1.0], [0.0], [3.0], [3.0]]), torch.tensor([0, 0, 1, 1]))
    >>> res.grpo.double().round(decimals=4).tolist(), res.gdpo.double().round(decimals=4).tolist()
    ([0.707, -0.707, 0.0, 0.0], [1.2245, -1.2245, 0.0, 0.0])
    """
    _check_option(scale, SCALES, "--scale")
    _check_option(convention, CONVENTIONS, "--convention")
    rewards, groups, weights, steps = _prepare(rewards, group_index, weights, step_index)
    if not bool(torch.isnan(rewards).any()):
        return _nan_free_advantages(rewards, groups, weights, steps, scale, convention)
    zscores = group_zscores(rewards, groups, convention=convention)
    grpo = grpo_advantages(rewards, groups, weights=weights, step_index=steps, scale=scale, convention=convention)
    gdpo = gdpo_advantages(rewards, groups, weights=weights, step_index=steps, convention=convention, zscores=zscores)
    return AdvantageResult(grpo=grpo, gdpo=gdpo, zscores=zscores)


def _nan_free_advantages(
    rewards: Tensor, groups: Segments, weights: Tensor, steps: Segments, scale: str, convention: str
) -> AdvantageResult:
    """:func:`compute_advantages` for rewards without NaN, channel by channel on a ``[C, N]`` copy.

    Weighted sums run over contiguous channel rows instead of ``nansum`` over a short last dimension
    (several times slower on CPU), and ``zscores`` is a transposed view of the ``[C, N]`` result.
    """
    columns = rewards.t().contiguous()
    w = weights.tolist()

    def weighted_sum(parts: Tensor) -> Tensor:
        total = parts[0] * w[0]
        for k in range(1, parts.shape[0]):
            total = total + parts[k] * w[k]
        return total

    zscores = torch.stack([_normalize(column, groups, convention, nan_free=True) for column in columns])
    total = weighted_sum(columns)
    if scale == "group":
        grpo = _normalize(total, groups, convention, nan_free=True)
    elif scale == "none":
        grpo = _normalize(total, groups, convention, divide=False, nan_free=True)
    else:
        _, _, step_std = centered_segments(total, steps, accumulate=torch.float64, nan_free=True)
        grpo = _normalize(total, groups, convention, scale_by=(steps, step_std), nan_free=True)
    fused = weighted_sum(zscores)
    gdpo = _normalize(fused, steps, convention, accumulate=torch.float64, nan_free=True)
    return AdvantageResult(grpo=grpo, gdpo=gdpo, zscores=zscores.t())


def group_zscore_bound(group_size: int) -> float:
    """Largest |z| a group z-score (ddof=1) can reach in a group of ``group_size``: (n-1)/sqrt(n).

    >>> round(group_zscore_bound(8), 4)
    2.4749
    """
    return (group_size - 1) / group_size**0.5 if group_size > 0 else 0.0
