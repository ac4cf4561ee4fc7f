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
from typing import TYPE_CHECKING, Literal, get_args

from collapse_doctor.core.errors import DeviceError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

Convention = Literal["trl", "verl", "paper"]
Scale = Literal["group", "batch", "none"]
CONVENTIONS: tuple[str, ...] = get_args(Convention)
SCALES: tuple[str, ...] = get_args(Scale)

STD_EPS: dict[str, float] = {"trl": 1e-4, "verl": 1e-6, "paper": 0.0}
"""Added to the std before dividing, per convention (the NumPy dense path reads it too)."""


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


def device_name(device: str = "auto") -> str:
    """:func:`resolve_device` as a name (``cpu``, ``cuda``, ``cuda:1``), importing torch only where CUDA may exist.

    ``auto`` on a machine without an NVIDIA driver is ``cpu`` at once: a scan that runs on NumPy there (the dense
    layout) never imports torch.

    >>> device_name("cpu")
    'cpu'
    """
    name = device.strip().lower()
    if name == "cpu" or (name == "auto" and not _cuda_driver_present()):
        return "cpu"
    return str(resolve_device(device))


def _cuda_driver_present() -> bool:
    """Whether the NVIDIA driver's library loads (torch cannot see a GPU without it); milliseconds, no torch."""
    import ctypes

    for library in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(library)
        except OSError:
            continue
        return True
    return False


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
    denominator = torch.nan_to_num(std, nan=0.0) + STD_EPS[convention]
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


# Dynamic channel weights (``gdpo-dynamic``): the weights follow each channel's ranking signal.
#
# A channel whose group z-scores have a large spread still ranks samples; a channel that saturates
# (constant within its groups) has z-scores of 0 and a spread of 0. Each step, the spread of every
# channel's clipped z-scores updates an exponential moving average; a softmax of that average at a
# temperature gives the weights, which are then held within [lower, upper] and sum to 1. A channel
# losing its spread loses weight. (A softmax of the *inverse* spread, which circulates as a snippet
# for this, does the opposite: it hands a saturated channel the most weight.)

DYNAMIC_EMA_ALPHA = 0.05
"""EMA smoothing of each channel's advantage std: ``ema = (1 - alpha) * ema + alpha * std``."""
DYNAMIC_TEMPERATURE = 0.5
"""Softmax temperature turning the smoothed stds into weights (lower = sharper)."""
DYNAMIC_WEIGHT_MIN = 0.1
"""Lower bound of each dynamic weight (no channel is silenced entirely)."""
DYNAMIC_WEIGHT_MAX = 0.5
"""Upper bound of each dynamic weight (no channel takes over)."""
ADVANTAGE_CLIP = 2.0
"""Per-channel advantages are clipped to [-clip, clip] before they are fused."""


def clipped_channel_advantages(zscores: Tensor, clip: float = ADVANTAGE_CLIP) -> Tensor:
    """Per-channel advantages (group z-scores ``[N, C]``) clipped to ``[-clip, clip]``; NaN stays NaN.

    >>> clipped_channel_advantages(torch.tensor([[3.0, -0.5], [float("nan"), -2.5]])).tolist()
    [[2.0, -0.5], [nan, -2.0]]
    """
    if clip <= 0:
        raise UsageError(f"advantage_clip {clip!r} must be > 0")
    return zscores.clamp(-clip, clip)


def channel_advantage_std(channel_advantages: Tensor) -> Tensor:
    """Spread (std, ddof=1) of each channel's advantages over the rows of one step, ``[C]``.

    NaN rows are left out; a channel with fewer than two values has spread 0. A channel that is
    constant within every group has z-scores of 0 and so a spread of 0: it no longer ranks samples.

    >>> z = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    >>> [round(v, 4) for v in channel_advantage_std(z).tolist()]
    [1.1547, 0.0]
    """
    if channel_advantages.ndim == 1:
        channel_advantages = channel_advantages[:, None]
    values = channel_advantages.to(torch.float64)
    valid = ~torch.isnan(values)
    count = valid.sum(dim=0).to(torch.float64)
    clean = torch.where(valid, values, torch.zeros_like(values))
    mean = clean.sum(dim=0) / count.clamp_min(1.0)
    squares = torch.where(valid, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=0)
    std = (squares / (count - 1).clamp_min(1.0)).sqrt()
    return torch.where(count >= 2, std, torch.zeros_like(std)).to(channel_advantages.dtype)


def update_std_ema(previous: Tensor | None, current: Tensor, alpha: float = DYNAMIC_EMA_ALPHA) -> Tensor:
    """One EMA step of the per-channel spread; the first observation initialises it.

    A NaN observation (a channel with no value this step) keeps the previous value.

    >>> ema = update_std_ema(None, torch.tensor([1.0, 1.0]))
    >>> update_std_ema(ema, torch.tensor([1.0, 0.0]), alpha=0.5).tolist()
    [1.0, 0.5]
    """
    if not 0.0 < alpha <= 1.0:
        raise UsageError(f"reward_weights_ema_alpha {alpha!r} must be in (0, 1]")
    current = torch.nan_to_num(current.to(torch.float64), nan=float("nan"))
    if previous is None:
        return torch.nan_to_num(current, nan=0.0)
    previous = previous.to(torch.float64)
    updated = (1.0 - alpha) * previous + alpha * current
    return torch.where(torch.isnan(current), previous, updated)


def bounded_simplex(weights: Tensor, lower: float = DYNAMIC_WEIGHT_MIN, upper: float = DYNAMIC_WEIGHT_MAX) -> Tensor:
    """Weights that sum to 1 and lie within ``[lower, upper]``, closest in ratio to ``weights``.

    The result is ``clip(scale * weights, lower, upper)`` for the scale at which it sums to 1: entries
    past a bound sit on it, the others keep their ratios. When no such weights exist (``C * upper < 1``
    or ``C * lower > 1``; two channels with ``upper = 0.5`` are just feasible, one channel never is),
    the weights are clamped once and renormalised, the literal "bound, then renormalise" recipe.

    >>> [round(w, 4) for w in bounded_simplex(torch.tensor([0.9, 0.09, 0.01])).tolist()]
    [0.5, 0.4, 0.1]
    >>> [round(w, 4) for w in bounded_simplex(torch.tensor([0.9, 0.1]), 0.1, 0.5).tolist()]
    [0.5, 0.5]
    """
    if not 0.0 <= lower <= upper:
        raise UsageError(f"reward_weight_min {lower!r} and reward_weight_max {upper!r} need 0 <= min <= max")
    w = weights.to(torch.float64).clamp_min(0.0)
    c = w.numel()
    total = w.sum()
    w = w / total if total > 0 else torch.full_like(w, 1.0 / max(c, 1))
    if c == 0:
        return w.to(weights.dtype)
    if c * upper < 1.0 - 1e-12 or c * lower > 1.0 + 1e-12:
        clamped = w.clamp(lower, upper)
        return (clamped / clamped.sum()).to(weights.dtype)
    # The bounded weights are clip(scale * w, lower, upper) for the one scale at which they sum to 1.
    # Their sum is piecewise linear and nondecreasing in the scale, with breaks where an entry reaches
    # a bound: find the piece that crosses 1 and solve it (plain floats: C is a handful of channels).
    values = w.tolist()

    def bounded_sum(scale: float) -> float:
        return sum(min(upper, max(lower, scale * v)) for v in values)

    breaks = sorted({b / v for v in values if v > 0 for b in (lower, upper)} | {0.0})
    previous = 0.0
    scale = breaks[-1]
    for point in breaks:
        if bounded_sum(point) >= 1.0:
            lo_sum, hi_sum = bounded_sum(previous), bounded_sum(point)
            scale = previous + (point - previous) * (1.0 - lo_sum) / (hi_sum - lo_sum) if hi_sum > lo_sum else point
            break
        previous = point
    out = torch.tensor([min(upper, max(lower, scale * v)) for v in values], dtype=torch.float64, device=w.device)
    return (out / out.sum()).to(weights.dtype)


def dynamic_channel_weights(
    ema_std: Tensor,
    *,
    temperature: float = DYNAMIC_TEMPERATURE,
    lower: float = DYNAMIC_WEIGHT_MIN,
    upper: float = DYNAMIC_WEIGHT_MAX,
    base_weights: Tensor | None = None,
) -> Tensor:
    """Channel weights from the smoothed advantage spreads: softmax(ema_std / T), bounded, summing to 1.

    A larger spread (the channel still ranks samples) gives a larger weight. ``base_weights`` (the
    user's static weights) multiply the softmax before the bounds are applied.

    >>> [round(w, 3) for w in dynamic_channel_weights(torch.tensor([1.0, 1.0, 0.0])).tolist()]
    [0.45, 0.45, 0.1]
    """
    if temperature <= 0:
        raise UsageError(f"reward_weight_temperature {temperature!r} must be > 0")
    logits = ema_std.to(torch.float64) / temperature
    probs = torch.softmax(logits, dim=-1)
    if base_weights is not None:
        probs = probs * torch.as_tensor(base_weights, dtype=torch.float64, device=probs.device).clamp_min(0.0)
    return bounded_simplex(probs, lower, upper).to(ema_std.dtype)


def dynamic_weight_schedule(
    step_std: Tensor,
    *,
    alpha: float = DYNAMIC_EMA_ALPHA,
    temperature: float = DYNAMIC_TEMPERATURE,
    lower: float = DYNAMIC_WEIGHT_MIN,
    upper: float = DYNAMIC_WEIGHT_MAX,
    base_weights: Tensor | None = None,
) -> Tensor:
    """The weights used at each step ``[S, C]`` given each step's channel spreads ``[S, C]``.

    Step ``s`` is weighted with the EMA of steps ``0..s`` (the spread of the step being weighted is
    already in its EMA, as in training, where the weights are updated before the advantages of the
    generation batch are fused).

    >>> std = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    >>> [round(w, 3) for w in dynamic_weight_schedule(std, alpha=0.5, lower=0.0, upper=1.0)[:, 1].tolist()]
    [0.5, 0.269, 0.182]
    """
    ema: Tensor | None = None
    rows = []
    for s in range(step_std.shape[0]):
        ema = update_std_ema(ema, step_std[s], alpha)
        rows.append(
            dynamic_channel_weights(
                ema, temperature=temperature, lower=lower, upper=upper, base_weights=base_weights
            ).to(step_std.dtype)
        )
    if not rows:
        return step_std.clone()
    return torch.stack(rows)


def dynamic_gdpo_advantages(
    rewards: Tensor,
    group_index: Tensor | Segments,
    *,
    weights: Tensor,
    step_index: Tensor | Segments | None = None,
    clip: float = ADVANTAGE_CLIP,
    convention: Convention = "trl",
    zscores: Tensor | None = None,
) -> Tensor:
    """GDPO with clipped per-channel advantages: z-scores clipped to ``[-clip, clip]``, fused, batch z-score.

    ``weights`` are the step's dynamic weights (:func:`dynamic_channel_weights`). With a clip no
    z-score reaches, this is :func:`gdpo_advantages`.

    >>> r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> [round(a, 3) for a in dynamic_gdpo_advantages(r, torch.zeros(4), weights=torch.tensor([0.5, 0.5])).tolist()]
    [0.0, 0.0, 1.225, -1.225]
    """
    if zscores is None:
        zscores = group_zscores(rewards, group_index, convention=convention)
    clipped = clipped_channel_advantages(zscores, clip)
    return gdpo_advantages(
        rewards, group_index, weights=weights, step_index=step_index, convention=convention, zscores=clipped
    )
