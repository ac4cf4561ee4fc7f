"""The advantage the trainer logged, against the group z-score bound and against each recomputation.

Over the valid rows with a logged value: how many (``logged_rows``), the largest ``|logged|``, the share
beyond the bound ``(n-1)/sqrt(n)`` of a z-score in a group of n (plus ``1e-3``), the largest bound, and the
mean absolute difference to the recomputed GRPO and GDPO advantages and to GRPO scaled by the step's std
(``grpo_batch``) or not scaled (``grpo_none``). Nothing when no advantage was logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.core.series import SERIES
from collapse_doctor.engine.advantages import grpo_advantages
from collapse_doctor.engine.stats.chunk import ChunkInput, GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import ratio, segment_extreme, segment_sum

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

CANDIDATES = tuple(name.removeprefix("logged_mae_") for name in SERIES if name.startswith("logged_mae_"))
"""The recomputations a logged advantage is compared with, in the catalogue's (JSON) order."""
NAMES = (
    "logged_rows",
    "logged_abs_max",
    "logged_beyond_bound_share",
    "logged_bound",
    *(f"logged_mae_{name}" for name in CANDIDATES),
)


def general(c: GeneralChunk) -> dict[str, Tensor]:
    if c.input.logged is None:
        return {}
    return _compare(c.input, c.group_rows, c.valid_row)


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    if c.logged is None:
        return {}
    logged = c.members(c.logged)
    has = ~np.isnan(logged)
    bound = (c.g - 1) / c.g**0.5
    magnitude = np.abs(logged)
    count = c.steps_sum(has.sum(axis=0))
    beyond = has & (magnitude.astype(np.float64) > bound + 1e-3)
    out = {
        "logged_rows": count,
        "logged_abs_max": c.steps_max(np.where(has, magnitude, -np.inf).max(axis=0)).astype(np.float64),
        "logged_beyond_bound_share": dense_np.ratio(c.steps_sum(beyond.sum(axis=0)), count),
        "logged_bound": np.where(count > 0, float(np.float32(bound)), -np.inf),
    }
    candidates = {
        **c.advantages,
        "grpo_batch": c.grpo_scaled("batch"),
        "grpo_none": c.grpo_scaled("none"),
    }
    for name, adv in candidates.items():
        err = np.where(has, np.abs(logged - adv), 0).astype(np.float64)
        out[f"logged_mae_{name}"] = dense_np.ratio(c.steps_sum(err.sum(axis=0)), count)
    return out


def _compare(chunk: ChunkInput, group_rows: Tensor, valid_row: Tensor) -> dict[str, Tensor]:
    """The logged statistics, given the valid rows per group ``[G]`` and the valid rows ``[N]``."""
    assert chunk.logged is not None
    logged = chunk.logged.to(chunk.rewards.dtype)
    gi, si, S = chunk.group_index, chunk.step_index, chunk.num_steps
    has = ~torch.isnan(logged) & valid_row
    n = group_rows[gi]
    bound = (n - 1) / n.clamp_min(1).sqrt()
    beyond = has & (logged.abs().double() > bound + 1e-3)
    count = segment_sum(has.double(), si, S)
    out = {
        "logged_rows": count,
        "logged_abs_max": segment_extreme(torch.where(has, logged.abs(), torch.nan), si, S, "amax").double(),
        "logged_beyond_bound_share": ratio(segment_sum(beyond.double(), si, S), count),
        "logged_bound": segment_extreme(torch.where(has, bound.float(), torch.nan), si, S, "amax").double(),
    }
    candidates = {
        "grpo": chunk.advantages.grpo,
        "gdpo": chunk.advantages.gdpo,
        "grpo_batch": grpo_advantages(chunk.rewards, gi, weights=chunk.weights, step_index=si, scale="batch"),
        "grpo_none": grpo_advantages(chunk.rewards, gi, weights=chunk.weights, step_index=si, scale="none"),
    }
    for name, adv in candidates.items():
        err = torch.where(has, (logged - adv).abs(), torch.zeros_like(logged)).double()
        out[f"logged_mae_{name}"] = ratio(segment_sum(err, si, S), count)
    return out
