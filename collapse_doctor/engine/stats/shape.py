"""Shape of the advantage distribution per step, over the rows of groups that carry signal.

Under GRPO and GDPO: std (ddof=1), skewness, excess kurtosis (population moments), Sarle's bimodality
coefficient ``(skew^2 + 1) / (kurtosis + 3 (n-1)^2 / ((n-2)(n-3)))`` and the largest ``|advantage|``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.engine.advantages import Segments, centered_segments
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import segment_extreme, segment_sum, to_host

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

MOMENTS = ("std", "skew", "kurtosis", "bimodality", "abs_max")
NAMES = tuple(f"adv_{key}_{name}" for name in ("grpo", "gdpo") for key in MOMENTS)


def _shape(
    count: np.ndarray, s2: np.ndarray, s3: np.ndarray, s4: np.ndarray, abs_max: np.ndarray
) -> dict[str, np.ndarray]:
    """Shape statistics from per-step counts and sums of centred powers (``[S]`` each, on the host)."""
    ratio = dense_np.ratio
    m2, m3, m4 = ratio(s2, count), ratio(s3, count), ratio(s4, count)
    skew = ratio(m3, m2**1.5)
    kurt = ratio(m4, m2**2) - 3.0
    n = count
    with np.errstate(invalid="ignore", divide="ignore"):
        correction = np.where(n > 3, 3.0 * (n - 1) ** 2 / np.maximum((n - 2) * (n - 3), 1.0), np.nan)
        std = np.where(n >= 2, np.sqrt(s2 / np.maximum(n - 1, 1)), np.nan)
        bimodality = (skew**2 + 1.0) / (kurt + correction)
    return {
        "std": std,
        "skew": skew,
        "kurtosis": kurt,
        "bimodality": bimodality,
        "abs_max": dense_np.finite_or_nan(abs_max),
    }


def _moments(x: Tensor, mask: Tensor, steps: Segments) -> dict[str, np.ndarray]:
    """std, skewness, excess kurtosis, Sarle's bimodality coefficient and max |x| per step."""
    step_index, num_steps = steps.index, steps.size
    values = torch.where(mask, x, torch.full_like(x, float("nan")))
    dev, count, _ = centered_segments(values, steps, accumulate=torch.float64)
    d = torch.nan_to_num(dev.to(torch.float64), nan=0.0)
    abs_max = segment_extreme(values.abs(), step_index, num_steps, "amax")
    sums = (segment_sum(d**p, step_index, num_steps) for p in (2, 3, 4))
    return _shape(*(to_host(x) for x in (count, *sums, abs_max)))


def general(c: GeneralChunk) -> dict[str, np.ndarray]:
    adv = c.input.advantages
    out: dict[str, np.ndarray] = {}
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        for key, value in _moments(x, c.signal_rows, c.steps).items():
            out[f"adv_{key}_{name}"] = value
    return out


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    signal = c.signal
    count = c.num_signal * c.g
    out: dict[str, np.ndarray] = {}
    for name, x in c.advantages.items():
        x2 = x * x
        powers = np.stack([x.sum(axis=0), x2.sum(axis=0), (x2 * x).sum(axis=0), (x2 * x2).sum(axis=0)])
        p1, p2, p3, p4 = c.steps_sum(powers * c.signal_float).T
        m = np.nan_to_num(dense_np.ratio(p1, count))
        s2 = p2 - count * m**2
        s3 = p3 - 3 * m * p2 + 2 * count * m**3
        s4 = p4 - 4 * m * p3 + 6 * m**2 * p2 - 3 * count * m**4
        abs_max = c.steps_max(np.where(signal, np.abs(x).max(axis=0), -np.inf))
        for key, value in _shape(count, np.maximum(s2, 0), s3, np.maximum(s4, 0), abs_max).items():
            out[f"adv_{key}_{name}"] = value
    return out
