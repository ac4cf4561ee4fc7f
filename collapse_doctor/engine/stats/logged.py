"""The advantage the trainer logged, against the group z-score bound and against each recomputation.

Over the valid rows with a logged value: how many (``logged_rows``), the largest ``|logged|``, the share
beyond the bound ``(n-1)/sqrt(n)`` of a z-score in a group of n (plus ``1e-3``), the largest bound, and the
mean absolute difference to the recomputed GRPO and GDPO advantages and to GRPO scaled by the step's std
(``grpo_batch``) or not scaled (``grpo_none``); in a chunk that matches none of those, also to every other
estimator of :mod:`collapse_doctor.engine.estimators` (RLOO, REINFORCE++, pass@k, ...; NaN where a column it needs
is missing, and in the chunks that matched). Nothing when no advantage was logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.core.estimators import MATCH_MAE
from collapse_doctor.core.series import RECOMPUTATIONS, SERIES
from collapse_doctor.engine.advantages import grpo_advantages
from collapse_doctor.engine.estimators import SHAPES, EstimatorRows, recompute, shape_residual
from collapse_doctor.engine.stats.chunk import ChunkInput, GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import ratio, segment_extreme, segment_sum, to_host

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

CANDIDATES = tuple(name.removeprefix("logged_mae_") for name in SERIES if name.startswith("logged_mae_"))
"""The recomputations a logged advantage is compared with, in the catalogue's (JSON) order."""
SHAPE_CANDIDATES = tuple(
    name.removeprefix("logged_shape_mae_") for name in SERIES if name.startswith("logged_shape_mae_")
)
"""The token-weighted estimators also fitted up to their token counts where the run has none."""
NAMES = (
    "logged_rows",
    "logged_abs_max",
    "logged_beyond_bound_share",
    "logged_bound",
    *(f"logged_mae_{name}" for name in CANDIDATES),
    *(f"logged_shape_mae_{name}" for name in SHAPE_CANDIDATES),
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
    sums = {}
    for name, adv in candidates.items():
        err = np.where(has, np.abs(logged - adv), 0).astype(np.float64)
        sums[name] = c.steps_sum(err.sum(axis=0))
        out[f"logged_mae_{name}"] = dense_np.ratio(sums[name], count)
    if _main_matches({name: float(total.sum()) for name, total in sums.items()}, float(count.sum())):
        out.update(_not_compared(c.num_steps))
        return out
    rows = c.num_rows
    lengths = None if c.completions is None else c.completions.token_lengths
    out.update(
        _estimator_mae(
            c.rewards, c.weights, np.arange(rows) // c.g, c.step_index, lengths, c.logged, c.num_steps, block=c.g
        )
    )
    return out


EXACT_MAE = MATCH_MAE / 10
"""A chunk whose logged advantages are this close to GRPO or GDPO is that (float32 logs sit near 1e-5): no other
estimator can come closer by more than rounding, so none is compared there."""


def _main_matches(error_sums: dict[str, float], rows: float) -> bool:
    """Whether the chunk's logged advantages equal GRPO or GDPO (the engine's own recomputations) within
    :data:`EXACT_MAE` over all its rows: then the catalogue's other estimators are not compared there (their series
    NaN: not compared), which keeps a TRL run's scan as cheap as before. Only within the tighter bound: RLOO's
    n/(n-1) can sit within :data:`~collapse_doctor.core.estimators.MATCH_MAE` of GRPO scaled by the batch std, and
    then the closer of the two must win."""
    return rows > 0 and min(error_sums.values()) / rows <= EXACT_MAE


def _not_compared(num_steps: int) -> dict[str, np.ndarray]:
    keys = [f"logged_mae_{k}" for k in CANDIDATES if k not in RECOMPUTATIONS]
    keys += [f"logged_shape_mae_{k}" for k in SHAPE_CANDIDATES]
    return {name: np.full(num_steps, np.nan) for name in keys}


def _estimator_mae(
    rewards: np.ndarray,
    weights: np.ndarray | list[float],
    group: np.ndarray,
    step: np.ndarray,
    lengths: np.ndarray | None,
    logged: np.ndarray,
    num_steps: int,
    *,
    block: int | None = None,
) -> dict[str, np.ndarray]:
    """Per step, the mean |logged - estimator| of every estimator of :mod:`collapse_doctor.engine.estimators` over
    the valid rows with a logged value (NaN where the estimator cannot be computed: a column it needs is missing)."""
    valid = ~np.isnan(rewards).all(axis=1)
    if not valid.any():
        return _not_compared(num_steps)
    every = bool(valid.all())  # a dense chunk keeps its blocks only when no row is dropped
    rows = EstimatorRows(
        rewards[valid],
        np.asarray(weights),
        group[valid],
        step[valid],
        None if lengths is None else lengths[valid],
        block=block if every else None,
    )
    values = logged[valid].astype(np.float64)
    has = ~np.isnan(values)
    steps = step[valid].astype(np.int64)
    count = np.bincount(steps, weights=has.astype(np.float64), minlength=num_steps)
    out = {}

    def per_step(err: np.ndarray) -> np.ndarray:
        return dense_np.ratio(np.bincount(steps, weights=np.where(has, err, 0.0), minlength=num_steps), count)

    for name, adv in recompute(rows).items():
        out[f"logged_mae_{name}"] = np.full(num_steps, np.nan) if adv is None else per_step(np.abs(values - adv))
        if name in SHAPES:
            # without the lengths, how close the logged values come to the estimator up to what they decide
            shape = np.full(num_steps, np.nan) if adv is not None else per_step(shape_residual(rows, values, name))
            out[f"logged_shape_mae_{name}"] = shape
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
    sums = {}
    for name, adv in candidates.items():
        err = torch.where(has, (logged - adv).abs(), torch.zeros_like(logged)).double()
        sums[name] = float(err.sum())
        out[f"logged_mae_{name}"] = ratio(segment_sum(err, si, S), count)
    if _main_matches(sums, float(count.sum())):
        out.update({name: torch.as_tensor(v, device=count.device) for name, v in _not_compared(S).items()})
        return out
    lengths = None if chunk.completions is None else chunk.completions.token_lengths
    others = _estimator_mae(
        to_host(chunk.rewards),
        to_host(chunk.weights),
        to_host(gi),
        to_host(si),
        lengths,
        to_host(logged),
        S,
    )
    out.update({name: torch.as_tensor(values, device=count.device) for name, values in others.items()})
    return out
