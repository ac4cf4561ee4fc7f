"""Shape of the advantage distribution per step, over the rows of groups that carry signal.

Under GRPO and GDPO: std (ddof=1), skewness, excess kurtosis (population moments), Sarle's bimodality
coefficient ``(skew^2 + 1) / (kurtosis + 3 (n-1)^2 / ((n-2)(n-3)))`` and the largest ``|advantage|``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from collapse_doctor.advantages import Segments, centered_segments
from collapse_doctor.stats.chunk import DenseChunk, GeneralChunk
from collapse_doctor.stats.kernels import ratio, segment_extreme, segment_sum

MOMENTS = ("std", "skew", "kurtosis", "bimodality", "abs_max")
NAMES = tuple(f"adv_{key}_{name}" for name in ("grpo", "gdpo") for key in MOMENTS)


def _shape(count: Tensor, s2: Tensor, s3: Tensor, s4: Tensor, abs_max: Tensor) -> dict[str, Tensor]:
    """Shape statistics from per-step counts and sums of centred powers."""
    m2, m3, m4 = ratio(s2, count), ratio(s3, count), ratio(s4, count)
    skew = ratio(m3, m2**1.5)
    kurt = ratio(m4, m2**2) - 3.0
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
    abs_max = segment_extreme(values.abs(), step_index, num_steps, "amax")
    return _shape(
        count,
        segment_sum(d**2, step_index, num_steps),
        segment_sum(d**3, step_index, num_steps),
        segment_sum(d**4, step_index, num_steps),
        abs_max,
    )


def general(c: GeneralChunk) -> dict[str, Tensor]:
    adv = c.input.advantages
    out: dict[str, Tensor] = {}
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        for key, value in _moments(x, c.signal_rows, c.steps).items():
            out[f"adv_{key}_{name}"] = value
    return out


def dense(c: DenseChunk) -> dict[str, Tensor]:
    signal = c.signal
    count = c.num_signal * c.g
    out: dict[str, Tensor] = {}
    for name, x in c.advantages.items():
        x2 = x * x
        powers = torch.stack([x.sum(dim=0), x2.sum(dim=0), (x2 * x).sum(dim=0), (x2 * x2).sum(dim=0)])
        p1, p2, p3, p4 = c.steps_sum(powers * c.signal_float).unbind(dim=1)
        m = torch.nan_to_num(ratio(p1, count))
        s2 = p2 - count * m**2
        s3 = p3 - 3 * m * p2 + 2 * count * m**3
        s4 = p4 - 4 * m * p3 + 6 * m**2 * p2 - 3 * count * m**4
        abs_max = segment_extreme(
            torch.where(signal, x.abs().amax(dim=0), torch.nan), c.group_step, c.num_steps, "amax"
        )
        for key, value in _shape(count, s2.clamp_min(0), s3, s4.clamp_min(0), abs_max).items():
            out[f"adv_{key}_{name}"] = value
    return out
