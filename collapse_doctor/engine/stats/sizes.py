"""Rollouts, valid rows, groups, groups with a baseline (2+ valid rows) and group sizes per step.

A row is valid when at least one of its rewards is not NaN (rows without any reward are left out of every
group). ``eligible_groups`` counts the groups with at least two valid rows: the support of every share
"over groups" (a group of one has no within-group contrast; TRL gives it advantage 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import segment_extreme, segment_sum

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

NAMES = ("rollouts", "valid_rows", "groups", "eligible_groups", "group_size_min", "group_size_max")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    rows = c.group_rows
    S = c.num_steps
    return {
        "rollouts": segment_sum(torch.ones(c.num_rows, device=c.device), c.step_index, S),
        "valid_rows": c.steps_of_groups(rows),
        "groups": c.steps_of_groups((rows > 0).to(torch.float64)),
        "eligible_groups": c.steps_of_groups(c.eligible.to(torch.float64)),
        "group_size_min": segment_extreme(torch.where(rows > 0, rows, torch.nan), c.group_step, S, "amin"),
        "group_size_max": segment_extreme(rows, c.group_step, S, "amax"),
    }


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    gps, g = c.gps, c.g
    size = np.where(gps > 0, float(g), np.nan)
    return {
        "rollouts": gps * g,
        "valid_rows": gps * g,
        "groups": gps,
        "eligible_groups": gps.copy(),
        "group_size_min": size,
        "group_size_max": size.copy(),
    }
