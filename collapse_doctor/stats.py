"""Per-step statistics of a chunk of rollouts, as pure functions on torch tensors.

Input is a chunk of rows from one or more training steps: ``rewards`` ``[N, C]``, a dense
``group_index`` (unique across the chunk), a dense ``step_index`` and the advantages recomputed by
:mod:`collapse_doctor.advantages`. Every statistic is reduced to one value per step (``[S]``), per
step and channel (``[S, C]``) or per step and channel pair (``[S, P]``) with segment reductions; the
detectors only ever see these small series.

Names used below: for a group g and channel c, ``dev_c`` is the reward minus the group mean, ``t``
is the weighted total reward (what GRPO normalises), ``s`` is GDPO's fused sum of channel z-scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import torch
from torch import Tensor

from collapse_doctor.advantages import AdvantageResult, Segments, centered_segments, grpo_advantages

OUTLIER_GAP = 8.0
"""A group is outlier-dominated when its most extreme total sits this many stds of the rest away."""
TIE_QUANTUM = 1e-5
"""Totals closer than this count as tied (float32 sums of equal rewards differ by rounding only)."""
DISTINCT_QUANTUM = 1e-4
"""Advantages closer than this count as one value."""
MAX_DENSE_GROUP = 64
"""Largest group size for the dense path (its pair comparisons are [G, g, g])."""
_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))


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


def _sum(values: Tensor, index: Tensor, size: int) -> Tensor:
    """Segment sums in float64; 1-D scatter_add is the fastest CPU kernel, index_add_ handles [N, C]."""
    values = values.to(torch.float64)
    out = torch.zeros((size, *values.shape[1:]), dtype=torch.float64, device=values.device)
    if values.ndim == 1:
        return out.scatter_add_(0, index, values)
    return out.index_add_(0, index, values)


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, NaN where den is 0."""
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))


def _segment_extreme(values: Tensor, index: Tensor, size: int, reduce: str) -> Tensor:
    fill = float("-inf") if reduce == "amax" else float("inf")
    base = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    clean = torch.where(torch.isnan(values), torch.full_like(values, fill), values)
    return base.scatter_reduce(0, index, clean, reduce=reduce, include_self=True)


def _hash_rows(columns: list[Tensor]) -> Tensor:
    """One int64 per row mixing several int64 columns (collisions are negligible at 64 bits)."""
    h = torch.zeros_like(columns[0])
    for k, column in enumerate(columns):
        h = (h ^ column) * _MIX[k % len(_MIX)]
        h = h ^ (h >> 31)
    return h


def _bucket_sizes(keys: Tensor) -> Tensor:
    """For each row, how many rows share its key."""
    _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    return counts[inverse]


def _quantize(values: Tensor, quantum: float, *, nan_free: bool = False) -> Tensor:
    """Integer bins of width ``quantum``; NaN gets a bin of its own (skip that pass with ``nan_free``)."""
    q = torch.round(values.to(torch.float64) / quantum)
    if nan_free:
        return q.to(torch.int64)
    return torch.where(torch.isnan(q), torch.full_like(q, -(2.0**62)), q).to(torch.int64)


def _shape(count: Tensor, s2: Tensor, s3: Tensor, s4: Tensor, abs_max: Tensor) -> dict[str, Tensor]:
    """Shape statistics from per-step counts and sums of centred powers."""
    m2, m3, m4 = _ratio(s2, count), _ratio(s3, count), _ratio(s4, count)
    skew = _ratio(m3, m2**1.5)
    kurt = _ratio(m4, m2**2) - 3.0
    n = count
    correction = torch.where(n > 3, 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3)).clamp_min(1.0), torch.nan)
    std = torch.where(n >= 2, (s2 / (n - 1).clamp_min(1)).sqrt(), torch.nan)
    return {
        "std": std,
        "skew": skew,
        "kurtosis": kurt,
        "bimodality": (skew**2 + 1.0) / (kurt + correction),
        "abs_max": torch.where(torch.isfinite(abs_max), abs_max, torch.nan).to(torch.float64),
    }


def _moments(x: Tensor, mask: Tensor, steps: Segments) -> dict[str, Tensor]:
    """std, skewness, excess kurtosis, Sarle's bimodality coefficient and max |x| per step."""
    step_index, num_steps = steps.index, steps.size
    values = torch.where(mask, x, torch.full_like(x, float("nan")))
    dev, count, _ = centered_segments(values, steps, accumulate=torch.float64)
    d = torch.nan_to_num(dev.to(torch.float64), nan=0.0)
    abs_max = _segment_extreme(values.abs(), step_index, num_steps, "amax")
    return _shape(
        count,
        _sum(d**2, step_index, num_steps),
        _sum(d**3, step_index, num_steps),
        _sum(d**4, step_index, num_steps),
        abs_max,
    )


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


def step_statistics(chunk: ChunkInput, *, allow_dense: bool = True) -> dict[str, Tensor]:
    """Reduce a chunk to per-step statistics (float64 tensors ``[S]``, ``[S, C]`` or ``[S, P]``).

    >>> from collapse_doctor.advantages import compute_advantages
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
    if allow_dense:
        g = dense_group_size(chunk)
        if g is not None:
            return _dense_statistics(chunk, g)
    r, gi, si = chunk.rewards, chunk.group_index, chunk.step_index
    G, S = chunk.num_groups, chunk.num_steps
    n_rows, n_ch = r.shape
    device = r.device
    w = chunk.weights.to(r.dtype)
    valid_row = ~torch.isnan(r).all(dim=1)
    groups = Segments.build(gi, G)
    steps = Segments.build(si, S)

    group_step = torch.zeros(G, dtype=torch.int64, device=device).scatter_(0, gi, si)
    group_rows = torch.bincount(gi[valid_row], minlength=G).to(torch.float64)
    out: dict[str, Tensor] = {
        "rollouts": _sum(torch.ones(n_rows, device=device), si, S),
        "groups": _sum((group_rows > 0).to(torch.float64), group_step, S),
        "group_size_min": _segment_extreme(torch.where(group_rows > 0, group_rows, torch.nan), group_step, S, "amin"),
        "group_size_max": _segment_extreme(group_rows, group_step, S, "amax"),
    }

    # Per channel: within-group range (rel_gain), std, constant share, mean; deviations for later.
    devs, rel_gain, spread, zero_var, means = [], [], [], [], []
    for c in range(n_ch):
        x = r[:, c].contiguous()
        dev, count, std = centered_segments(x, groups)
        eligible = (count >= 2).to(torch.float64)
        span = (_segment_extreme(x, gi, G, "amax") - _segment_extreme(x, gi, G, "amin")).to(torch.float64)
        span = torch.where(count >= 2, span, torch.zeros_like(span))
        n_eligible = _sum(eligible, group_step, S)
        rel_gain.append(_ratio(_sum(span, group_step, S), n_eligible))
        spread.append(_ratio(_sum(torch.nan_to_num(std.double()) * eligible, group_step, S), n_eligible))
        zero_var.append(_ratio(_sum(((std == 0) & (count >= 2)).double(), group_step, S), n_eligible))
        valid = ~torch.isnan(x)
        means.append(_ratio(_sum(torch.nan_to_num(x.double()), si, S), _sum(valid.double(), si, S)))
        devs.append(torch.nan_to_num(dev, nan=0.0))
    dev_r = torch.stack(devs, dim=1)  # [N, C], 0 where NaN
    out["rel_gain"] = torch.stack(rel_gain, dim=1)
    out["reward_std"] = torch.stack(spread, dim=1)
    out["channel_zero_var_share"] = torch.stack(zero_var, dim=1)
    out["reward_mean"] = torch.stack(means, dim=1)

    # Combined reward (GRPO's total) and GDPO's fused sum.
    total = torch.where(valid_row, (r * w).nansum(dim=1), torch.full((n_rows,), torch.nan, device=device))
    dev_t, count_t, std_t = centered_segments(total, groups)
    dev_t0 = torch.nan_to_num(dev_t, nan=0.0)
    eligible_t = count_t >= 2
    n_eligible_t = _sum(eligible_t.double(), group_step, S)
    out["zero_var_share"] = _ratio(_sum((eligible_t & (std_t == 0)).double(), group_step, S), n_eligible_t)
    z = torch.nan_to_num(chunk.advantages.zscores, nan=0.0)
    all_flat = (z == 0).all(dim=1).double()  # no channel varies within the row's group
    group_flat = _segment_extreme(all_flat, gi, G, "amin")
    out["gdpo_zero_var_share"] = _ratio(_sum((eligible_t & (group_flat == 1)).double(), group_step, S), n_eligible_t)
    fused = (z * w).sum(dim=1)

    # Signal share: each channel's part of the within-group variance of the combined reward.
    var_t = _sum(dev_t0**2, si, S)
    out["signal_share_grpo"] = _ratio(_sum(w * dev_r * dev_t0[:, None], si, S), var_t[:, None])
    var_s = _sum(fused**2, si, S)
    out["signal_share_gdpo"] = _ratio(_sum(w * z * fused[:, None], si, S), var_s[:, None])

    # Dominance: which channel's contribution decides the sign of the advantage, per sample.
    for name, contrib, adv in (
        ("dominance_grpo", w * dev_r, dev_t0),
        ("dominance_gdpo", w * z, fused),
    ):
        codes = _deciders(list(contrib.unbind(dim=1)), adv)
        hits = torch.nn.functional.one_hot(codes, n_ch + 2).double()
        out[name] = _ratio(_sum(hits[:, :n_ch], si, S), _sum(hits[:, : n_ch + 1].sum(dim=1), si, S)[:, None])

    # Advantage shape over rows of groups that carry signal.
    signal_rows = eligible_t[gi] & (std_t[gi] > 0) & valid_row
    for name, adv in (("grpo", chunk.advantages.grpo), ("gdpo", chunk.advantages.gdpo)):
        for key, value in _moments(adv, signal_rows, steps).items():
            out[f"adv_{key}_{name}"] = value
        keys = _hash_rows([gi, _quantize(adv, DISTINCT_QUANTUM)])
        distinct = _sum((1.0 / _bucket_sizes(keys)).double() * signal_rows.double(), gi, G)
        ratio = _ratio(distinct, group_rows)
        signal_groups = (eligible_t & (std_t > 0)).double()
        out[f"distinct_ratio_{name}"] = _ratio(
            _sum(torch.nan_to_num(ratio) * signal_groups, group_step, S), _sum(signal_groups, group_step, S)
        )

    # Outlier-dominated groups: the most extreme total far from the rest, which still vary.
    absdev = torch.where(valid_row, dev_t0.abs(), torch.full_like(dev_t0, -1.0))
    gmax = _segment_extreme(absdev, gi, G, "amax")
    is_max = (absdev == gmax[gi]) & valid_row
    row_id = torch.arange(n_rows, device=device)
    first = torch.full((G,), n_rows, dtype=torch.int64, device=device).scatter_reduce(
        0, gi, torch.where(is_max, row_id, n_rows), reduce="amin", include_self=True
    )
    chosen = torch.zeros(n_rows, dtype=torch.bool, device=device)
    has_first = first < n_rows
    chosen[first[has_first]] = True
    n_others = count_t.double() - 1
    big_groups = (count_t >= 4) & (std_t > 0)

    def others_std(x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and std (ddof=1) of each group's values without its extreme row."""
        x = torch.where(valid_row, x, torch.zeros_like(x)).double()
        s1 = _sum(torch.where(chosen, 0.0, x), gi, G)
        s2 = _sum(torch.where(chosen, 0.0, x * x), gi, G)
        mean_o = s1 / n_others.clamp_min(1)
        var_o = (s2 - n_others * mean_o**2) / (n_others - 1).clamp_min(1)
        return mean_o, var_o.clamp_min(0).sqrt()

    mean_o, std_o = others_std(dev_t0)
    extreme = _sum(torch.where(chosen, dev_t0.double(), 0.0), gi, G)
    spread_o = std_o.clamp_min(1e-12)
    gap = (extreme - mean_o).abs() / spread_o
    outlier = big_groups & (std_o > 1e-6 * std_t.double().clamp_min(1e-12)) & (gap > OUTLIER_GAP)
    n_big = _sum(big_groups.double(), group_step, S)
    out["outlier_group_share"] = _ratio(_sum(outlier.double(), group_step, S), n_big)
    for name, adv in (("grpo", chunk.advantages.grpo), ("gdpo", chunk.advantages.gdpo)):
        _, std_adv_o = others_std(adv)
        out[f"outlier_rest_std_{name}"] = _ratio(
            _sum(torch.where(outlier, std_adv_o, 0.0), group_step, S), _sum(outlier.double(), group_step, S)
        )

    # Tied sums: pairs with different reward vectors but equal totals.
    vq = [_quantize(r[:, c], TIE_QUANTUM) for c in range(n_ch)]
    same_vector = _bucket_sizes(_hash_rows([gi, *vq])).double()
    same_total = _bucket_sizes(_hash_rows([gi, _quantize(total, TIE_QUANTUM)])).double()
    vr = valid_row.double()
    pairs_all = _sum(vr * (group_rows[gi] - 1) / 2, si, S)
    pairs_identical = _sum(vr * (same_vector - 1) / 2, si, S)
    pairs_equal_total = _sum(vr * (same_total - 1) / 2, si, S)
    differing = pairs_all - pairs_identical
    out["differing_pairs"] = differing
    out["tied_pair_share"] = _ratio(pairs_equal_total - pairs_identical, differing)

    # Within-group (demeaned) correlation per channel pair, with its sufficient sums.
    pairs = list(combinations(range(n_ch), 2))
    if pairs:
        both = [(~torch.isnan(r[:, i]) & ~torch.isnan(r[:, j])).double() for i, j in pairs]
        sxy = torch.stack(
            [_sum(dev_r[:, i] * dev_r[:, j] * b, si, S) for (i, j), b in zip(pairs, both, strict=True)], 1
        )
        sxx = torch.stack([_sum(dev_r[:, i] ** 2 * b, si, S) for (i, _), b in zip(pairs, both, strict=True)], 1)
        syy = torch.stack([_sum(dev_r[:, j] ** 2 * b, si, S) for (_, j), b in zip(pairs, both, strict=True)], 1)
        out["corr_sxy"], out["corr_sxx"], out["corr_syy"] = sxy, sxx, syy
        out["within_corr"] = _ratio(sxy, (sxx * syy).sqrt())

    if chunk.logged is not None:
        out.update(_logged_statistics(chunk, group_rows, valid_row))
    return out


def _first_argmax(values: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Index of the largest of equally shaped tensors, the first on ties, and that largest value.

    The same as ``torch.stack(values).argmax(0)``, as a few arithmetic passes: on CPU, torch's argmax over
    a short dimension, ``torch.where`` and ``masked_fill`` cost many times a multiply.

    >>> index, best = _first_argmax([torch.tensor([1.0, 5.0]), torch.tensor([3.0, 5.0])])
    >>> index.tolist(), best.tolist()
    ([1, 0], [3.0, 5.0])
    """
    best, index = values[0], torch.zeros(values[0].shape, dtype=torch.int64, device=values[0].device)
    for k, value in enumerate(values[1:], start=1):
        better = (value > best).to(torch.int64)
        index = index + better * (k - index)
        best = torch.maximum(best, value)
    return index, best


def _deciders(parts: list[Tensor], adv: Tensor) -> Tensor:
    """Per row: the channel whose contribution is largest and agrees in sign with ``adv``.

    ``C`` (the number of channels) where the largest one disagrees, ``C + 1`` where ``adv`` carries no signal.
    """
    n_ch = len(parts)
    winner, _ = _first_argmax([p.abs() for p in parts])
    decisive = parts[0]
    for k in range(1, n_ch):
        take = (winner == k).to(parts[k].dtype)
        decisive = decisive + take * (parts[k] - decisive)
    agrees = (torch.sign(decisive) == torch.sign(adv)).to(torch.int64)
    code = n_ch + agrees * (winner - n_ch)
    silent = (adv.abs() <= 1e-6).to(torch.int64)
    return code + silent * (n_ch + 1 - code)


def _dense_statistics(chunk: ChunkInput, g: int) -> dict[str, Tensor]:
    """:func:`step_statistics` for consecutive equal-size groups without NaN, in member-major layout.

    Same statistics as the general path (a test checks they agree). Each tensor is laid out
    ``[..., g, G]`` (member of the group, then group), so a reduction over a group adds ``g`` contiguous
    rows of length ``G``: several times faster on CPU than reducing a short last dimension. Elementwise
    work stays in float32 and only per-group values go to float64.
    """
    r, si, S, G = chunk.rewards, chunk.step_index, chunk.num_steps, chunk.num_groups
    n_ch = r.shape[1]
    device = r.device
    w = chunk.weights.to(r.dtype).tolist()
    group_step = si.view(G, g)[:, 0]
    groups_per_step = torch.bincount(group_step, minlength=S)
    gps = groups_per_step.to(torch.float64)

    def steps_sum(x: Tensor) -> Tensor:
        """Per-group values ``[G]`` or ``[K, G]`` summed per step: ``[S]`` or ``[S, K]`` (steps are sorted)."""
        x = x.t() if x.ndim == 2 else x
        return torch.segment_reduce(x.to(torch.float64), "sum", lengths=groups_per_step, axis=0)

    def members(x: Tensor) -> Tensor:
        """Rows ``[N]`` or ``[N, K]`` as ``[g, G]`` or ``[K, g, G]``."""
        if x.ndim == 1:
            return x.view(G, g).t().contiguous()
        return x.view(G, g, x.shape[1]).permute(2, 1, 0).contiguous()

    def centred(x: Tensor) -> tuple[Tensor, Tensor]:
        """Deviation from the group mean (shifted by the group's first value) and the group std."""
        shifted = x - x[..., :1, :]
        dev = shifted - shifted.mean(dim=-2, keepdim=True)
        return dev, ((dev * dev).sum(dim=-2) / (g - 1)).sqrt()

    def weighted(parts: Tensor) -> list[Tensor]:
        return [parts[c] * w[c] for c in range(n_ch)]

    def channel_sum(parts: list[Tensor]) -> Tensor:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    out: dict[str, Tensor] = {
        "rollouts": gps * g,
        "groups": gps,
        "group_size_min": torch.where(gps > 0, float(g), torch.nan),
        "group_size_max": torch.where(gps > 0, float(g), torch.nan),
    }
    rewards = members(r)  # [C, g, G]
    dev, std = centred(rewards)  # [C, g, G], [C, G]
    out["rel_gain"] = steps_sum(rewards.amax(dim=-2) - rewards.amin(dim=-2)) / gps[:, None]
    out["reward_std"] = steps_sum(std) / gps[:, None]
    out["channel_zero_var_share"] = steps_sum(std == 0) / gps[:, None]
    out["reward_mean"] = steps_sum(rewards.sum(dim=-2)) / (gps * g)[:, None]

    total = channel_sum(weighted(rewards))  # [g, G]
    dev_t, std_t = centred(total)
    out["zero_var_share"] = steps_sum(std_t == 0) / gps
    z = members(chunk.advantages.zscores)  # [C, g, G]; no NaN: the rewards have none
    out["gdpo_zero_var_share"] = steps_sum((z == 0).all(dim=0).all(dim=0)) / gps
    fused = channel_sum(weighted(z))

    var_t = steps_sum((dev_t * dev_t).sum(dim=0))
    weight_col = torch.tensor(w, dtype=torch.float64, device=device)
    out["signal_share_grpo"] = _ratio(steps_sum((dev * dev_t).sum(dim=-2)) * weight_col, var_t[:, None])
    var_s = steps_sum((fused * fused).sum(dim=0))
    out["signal_share_gdpo"] = _ratio(steps_sum((z * fused).sum(dim=-2)) * weight_col, var_s[:, None])

    bins = n_ch + 2
    for name, parts, adv in (("dominance_grpo", weighted(dev), dev_t), ("dominance_gdpo", weighted(z), fused)):
        codes = _deciders(parts, adv) + group_step * bins
        counts = torch.bincount(codes.view(-1), minlength=S * bins).view(S, bins).to(torch.float64)
        out[name] = _ratio(counts[:, :n_ch], counts[:, : n_ch + 1].sum(dim=1, keepdim=True))

    signal = std_t > 0  # [G]
    signal_f = signal.to(r.dtype)
    n_signal = steps_sum(signal)
    count = n_signal * g
    advantages = {"grpo": members(chunk.advantages.grpo), "gdpo": members(chunk.advantages.gdpo)}
    for name, x in advantages.items():
        x2 = x * x
        powers = torch.stack([x.sum(dim=0), x2.sum(dim=0), (x2 * x).sum(dim=0), (x2 * x2).sum(dim=0)])
        p1, p2, p3, p4 = steps_sum(powers * signal_f).unbind(dim=1)
        m = torch.nan_to_num(_ratio(p1, count))
        s2 = p2 - count * m**2
        s3 = p3 - 3 * m * p2 + 2 * count * m**3
        s4 = p4 - 4 * m * p3 + 6 * m**2 * p2 - 3 * count * m**4
        abs_max = _segment_extreme(torch.where(signal, x.abs().amax(dim=0), torch.nan), group_step, S, "amax")
        for key, value in _shape(count, s2.clamp_min(0), s3, s4.clamp_min(0), abs_max).items():
            out[f"adv_{key}_{name}"] = value
        distinct = _distinct_counts(torch.round(x.double() / DISTINCT_QUANTUM))
        out[f"distinct_ratio_{name}"] = _ratio(steps_sum(distinct * signal_f / g), n_signal)

    abs_dev_t = dev_t.abs()
    extreme_row, _ = _first_argmax(list(abs_dev_t))
    others = (torch.arange(g, device=device)[:, None] != extreme_row).to(torch.float64)  # all but the extreme
    mean_o, std_o = _others_std(dev_t, others)
    extreme = dev_t.gather(0, extreme_row[None]).squeeze(0).double()
    gap = (extreme - mean_o).abs() / std_o.clamp_min(1e-12)
    big = signal & (g >= 4)
    outlier = big & (std_o > 1e-6 * std_t.double().clamp_min(1e-12)) & (gap > OUTLIER_GAP)
    out["outlier_group_share"] = _ratio(steps_sum(outlier), steps_sum(big))
    n_outlier = steps_sum(outlier)
    outliers = torch.nonzero(outlier).squeeze(1)  # few: the rest's advantage std is only needed there
    for name, x in advantages.items():
        _, std_adv_o = _others_std(x[:, outliers], others[:, outliers])
        rest_std = torch.zeros(G, dtype=torch.float64, device=device).index_copy_(0, outliers, std_adv_o)
        out[f"outlier_rest_std_{name}"] = _ratio(steps_sum(rest_std), n_outlier)

    vector = _hash_rows([_quantize(rewards[c], TIE_QUANTUM, nan_free=True) for c in range(n_ch)])
    identical = _equal_pairs(vector)
    equal_total = _equal_pairs(_quantize(total, TIE_QUANTUM, nan_free=True))
    differing = g * (g - 1) / 2 * gps - steps_sum(identical)
    out["differing_pairs"] = differing
    out["tied_pair_share"] = _ratio(steps_sum(equal_total - identical), differing)

    pairs = list(combinations(range(n_ch), 2))
    if pairs:
        squares = steps_sum((dev * dev).sum(dim=-2))  # [S, C]
        out["corr_sxy"] = torch.stack([steps_sum((dev[i] * dev[j]).sum(dim=0)) for i, j in pairs], 1)
        out["corr_sxx"] = torch.stack([squares[:, i] for i, _ in pairs], 1)
        out["corr_syy"] = torch.stack([squares[:, j] for _, j in pairs], 1)
        out["within_corr"] = _ratio(out["corr_sxy"], (out["corr_sxx"] * out["corr_syy"]).sqrt())

    if chunk.logged is not None:
        n_rows = r.shape[0]
        group_rows = torch.full((G,), float(g), dtype=torch.float64, device=device)
        out.update(_logged_statistics(chunk, group_rows, torch.ones(n_rows, dtype=torch.bool, device=device)))
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


def _distinct_counts(keys: Tensor) -> Tensor:
    """Per group (column of ``keys``, ``[g, G]``): how many distinct keys it holds.

    >>> _distinct_counts(torch.tensor([[1, 5], [2, 5], [1, 5], [3, 5]])).tolist()
    [3, 1]
    """
    g = keys.shape[0]
    repeated = torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)  # equals an earlier member
    for shift in range(1, g):
        repeated[shift:] |= keys[shift:] == keys[:-shift]
    return g - repeated.sum(dim=0)


def _equal_pairs(keys: Tensor) -> Tensor:
    """Per group (column of ``keys``, ``[g, G]``): how many pairs of its members have equal keys.

    >>> _equal_pairs(torch.tensor([[1, 5], [2, 5], [1, 5], [3, 5]])).tolist()
    [1, 6]
    """
    g = keys.shape[0]
    count = torch.zeros(keys.shape[1], dtype=torch.int64, device=keys.device)
    for shift in range(1, g):
        count += (keys[shift:] == keys[:-shift]).sum(dim=0)
    return count


def _logged_statistics(chunk: ChunkInput, group_rows: Tensor, valid_row: Tensor) -> dict[str, Tensor]:
    """Compare the advantage the trainer logged with the bound and with each recomputation."""
    assert chunk.logged is not None
    logged = chunk.logged.to(chunk.rewards.dtype)
    gi, si, S = chunk.group_index, chunk.step_index, chunk.num_steps
    has = ~torch.isnan(logged) & valid_row
    n = group_rows[gi]
    bound = (n - 1) / n.clamp_min(1).sqrt()
    beyond = has & (logged.abs().double() > bound + 1e-3)
    count = _sum(has.double(), si, S)
    out = {
        "logged_rows": count,
        "logged_abs_max": _segment_extreme(torch.where(has, logged.abs(), torch.nan), si, S, "amax").double(),
        "logged_beyond_bound_share": _ratio(_sum(beyond.double(), si, S), count),
        "logged_bound": _segment_extreme(torch.where(has, bound.float(), torch.nan), si, S, "amax").double(),
    }
    candidates = {
        "grpo": chunk.advantages.grpo,
        "gdpo": chunk.advantages.gdpo,
        "grpo_batch": grpo_advantages(chunk.rewards, gi, weights=chunk.weights, step_index=si, scale="batch"),
        "grpo_none": grpo_advantages(chunk.rewards, gi, weights=chunk.weights, step_index=si, scale="none"),
    }
    for name, adv in candidates.items():
        err = torch.where(has, (logged - adv).abs(), torch.zeros_like(logged)).double()
        out[f"logged_mae_{name}"] = _ratio(_sum(err, si, S), count)
    return out
