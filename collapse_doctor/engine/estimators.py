"""The advantage estimators of :mod:`collapse_doctor.core.estimators`, one pure NumPy function each.

Each takes :class:`EstimatorRows` (the valid rows of whole steps: at least one reward that is not NaN) and returns
the advantage of each row ``[N]`` (float64), as the trainer named in its spec computes it from the same rewards:
the total ``t = sum_c w_c r_c`` (NaN rewards skipped), per-channel rewards for GDPO, the completion lengths for
token-weighted estimators (None without them: those estimators return None, "cannot check"). Outcome rewards with
gamma 1: a row's advantage is the same on each of its tokens, so a token-weighted statistic weights a row by its
token count.

Group and step statistics are segment sums (``np.bincount``) shared through the cached properties of
:class:`EstimatorRows`, never a loop over groups. The GRPO and GDPO recomputations of the engine's main path
(:mod:`collapse_doctor.engine.advantages`, torch and the dense NumPy path) stay where they are; this module holds
the others.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from collapse_doctor.core.estimators import ESTIMATOR_OF


class EstimatorRows:
    """The valid rows of whole steps and the group and step statistics every estimator reuses."""

    def __init__(
        self,
        rewards: np.ndarray,
        weights: np.ndarray,
        group: np.ndarray,
        step: np.ndarray,
        lengths: np.ndarray | None = None,
        *,
        block: int | None = None,
    ) -> None:
        rewards = np.asarray(rewards)
        self.rewards = rewards if rewards.ndim == 2 else rewards.reshape(len(group), 1)
        """``[N, C]`` rewards as given (float32 or float64), NaN where a channel does not apply (no row is all NaN);
        :meth:`column` gives one as float64."""
        self.weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        self.block = block if block and len(group) % block == 0 else None
        """Groups are consecutive blocks of this many rows (the dense layout: row i in group i // block), or None;
        then group sums are reshapes, not scatters."""
        if self.block is not None:
            self.group = np.arange(len(group)) // self.block
        else:
            _, self.group = np.unique(np.asarray(group), return_inverse=True)
        """``[N]`` dense group ids."""
        step = np.asarray(step)
        if len(step) and bool((step[1:] >= step[:-1]).all()):
            self.step = np.cumsum(np.r_[0, step[1:] != step[:-1]])
        else:
            _, self.step = np.unique(step, return_inverse=True)
        """``[N]`` dense step ids."""
        self.num_groups = int(self.group.max()) + 1 if len(self.group) else 0
        self.num_steps = int(self.step.max()) + 1 if len(self.step) else 0
        lengths = None if lengths is None else np.asarray(lengths, dtype=np.float64)
        self.lengths = lengths if lengths is not None and bool(np.isfinite(lengths).all()) else None
        """``[N]`` response tokens per row, or None where any is unknown."""

    def column(self, c: int) -> np.ndarray:
        """``[N]`` channel ``c``'s rewards as float64 (NaN where it does not apply)."""
        return self.rewards[:, c].astype(np.float64)

    @cached_property
    def total(self) -> np.ndarray:
        """``[N]`` weighted total reward (NaN rewards skipped), summed column by column (a ``nansum`` over a short
        last axis is several times slower)."""
        total = np.zeros(len(self.group))
        for c in range(self.rewards.shape[1]):
            column = self.column(c)
            total += self.weights[c] * (np.nan_to_num(column, nan=0.0) if np.isnan(column).any() else column)
        return total

    def group_sum(self, values: np.ndarray) -> np.ndarray:
        """``[G]`` the sum of ``values`` over each group."""
        if self.block is not None:
            return values.reshape(-1, self.block).sum(axis=1)
        return np.bincount(self.group, weights=values, minlength=self.num_groups)

    def in_group(self, values: np.ndarray) -> np.ndarray:
        """``[N]`` the sum of ``values`` over each row's group."""
        sums = self.group_sum(values)
        return np.repeat(sums, self.block) if self.block is not None else sums[self.group]

    def fused(self, per_channel: Callable[[EstimatorRows, np.ndarray], np.ndarray]) -> np.ndarray:
        """``[N]`` sum over channels of ``w_c * per_channel(rows, r_c)``: a NaN reward is absent from its channel
        (computed on that channel's rows alone) and adds 0 to the row's sum (NeMo-RL and verl have none)."""
        fused = np.zeros(len(self.group))
        for c in range(self.rewards.shape[1]):
            r = self.column(c)
            known = ~np.isnan(r)
            if known.all():
                fused += self.weights[c] * per_channel(self, r)
            else:
                sub = EstimatorRows(r[known][:, None], np.ones(1), self.group[known], self.step[known])
                fused[known] += self.weights[c] * per_channel(sub, sub.total)
        return fused

    def step_sum(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.step, weights=values, minlength=self.num_steps)

    @cached_property
    def count(self) -> np.ndarray:
        """``[N]`` rows in each row's group."""
        if self.block is not None:
            return np.full(len(self.group), float(self.block))
        return np.bincount(self.group, minlength=self.num_groups).astype(np.float64)[self.group]

    def deviation(self, values: np.ndarray) -> np.ndarray:
        """``values`` minus their group mean, after a shift by the group's first value (exact for equal values)."""
        if self.block is not None:
            shifted = values - np.repeat(values[:: self.block], self.block)
        else:
            first = np.full(self.num_groups, np.nan)
            first[self.group[::-1]] = values[::-1]
            shifted = values - first[self.group]
        return shifted - self.in_group(shifted) / self.count

    def group_std(self, deviation: np.ndarray, ddof: int) -> np.ndarray:
        """``[N]`` the std of each row's group from the deviations (NaN for groups too small for ``ddof``)."""
        squares = self.in_group(deviation * deviation)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > ddof, np.sqrt(squares / (self.count - ddof)), np.nan)

    @cached_property
    def centred(self) -> np.ndarray:
        """``[N]`` the total minus its group mean."""
        return self.deviation(self.total)

    @cached_property
    def single(self) -> np.ndarray:
        """``[N]`` rows alone in their group."""
        return self.count == 1

    def token_whiten(self, values: np.ndarray) -> np.ndarray | None:
        """verl's ``masked_whiten`` over each step's response tokens: a row counts once per token; None without
        lengths. ``(x - m) / sqrt(v * L / (L - 1) + 1e-8)``, ``m`` and ``v`` token means with ``+1e-8`` on the
        token count ``L``."""
        if self.lengths is None:
            return None
        w = self.lengths
        tokens = self.step_sum(w)
        mean = self.step_sum(w * values) / (tokens + 1e-8)
        centred = values - mean[self.step]
        variance = self.step_sum(w * centred * centred) / (tokens + 1e-8)
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = np.where(tokens > 1, variance * tokens / (tokens - 1), np.nan)
        return centred / np.sqrt(variance + 1e-8)[self.step]


Estimator = Callable[[EstimatorRows], "np.ndarray | None"]


def grpo_population(x: EstimatorRows) -> np.ndarray:
    """TRL's asynchronous GRPO: population std (ddof 0), ``+1e-8``; a group of one gets 0."""
    std = np.nan_to_num(x.group_std(x.centred, ddof=0), nan=0.0)
    return np.where(x.single, 0.0, x.centred / (std + 1e-8))


def grpo_loo(x: EstimatorRows) -> np.ndarray:
    """NeMo-RL's default GRPO: the mean and population std of the *other* rows of the group; divided only where
    that std is > 0 (``+1e-6``); a group of one valid row gets 0 (its baseline is its own reward)."""
    return _loo(x, x.total)


def gdpo_nemo(x: EstimatorRows) -> np.ndarray:
    """NeMo-RL's GDPO: each reward's leave-one-out GRPO advantage (:func:`grpo_loo`), weighted and summed, then a
    z-score over the step (std ddof 1, no epsilon; only the mean taken off where that std is 0). A NaN reward
    counts as absent in its channel (NeMo-RL has none)."""
    fused = x.fused(_loo)
    rows = x.step_sum(np.ones_like(fused))
    mean = (x.step_sum(fused) / rows)[x.step]
    centred = fused - mean
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(x.step_sum(centred * centred) / (rows - 1))[x.step]
    return np.where(std > 0, centred / np.where(std > 0, std, 1.0), centred)


def _loo(x: EstimatorRows, t: np.ndarray) -> np.ndarray:
    n = x.count
    others = np.maximum(n - 1, 1)
    baseline = (x.in_group(t) - t) / others
    squares = (x.in_group(t * t) - t * t) / others
    std = np.sqrt(np.clip(squares - baseline * baseline, 0.0, None))
    # sum-of-squares cancels badly: a std within rounding of 0 is 0 (the trainer's float32 sees exact 0 there too)
    std = np.where(std <= 1e-7 * np.maximum(np.abs(baseline), 1.0), 0.0, std)
    advantage = t - baseline
    advantage = np.where(std > 0, advantage / (std + 1e-6), advantage)
    return np.where(x.single, 0.0, advantage)


def rloo(x: EstimatorRows) -> np.ndarray:
    """verl's loop RLOO: ``n / (n - 1) * (t - mean)``; a group of one keeps its raw total."""
    n = x.count
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x.single, x.total, x.centred * n / (n - 1))


def rloo_vectorized(x: EstimatorRows) -> np.ndarray:
    """verl's vectorised RLOO: as :func:`rloo`, but a group of one gets 0."""
    return np.where(x.single, 0.0, rloo(x))


def rloo_normalized(x: EstimatorRows) -> np.ndarray:
    """TRL's ``RLOOTrainer(normalize_advantages=True)``: the leave-one-out advantage ``t - mean of the others``,
    then ``(a - mean) / (std + 1e-4)`` over the step (std ddof 1). A row alone among the scorable rows of its group
    has no baseline (NaN in TRL): left out of the mean and std, and 0."""
    a = rloo_vectorized(x)
    used = (~x.single).astype(np.float64)
    rows = x.step_sum(used)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (x.step_sum(a * used) / rows)[x.step]
        centred = a - mean
        std = np.sqrt(x.step_sum(centred * centred * used) / (rows - 1))[x.step]
    # a step with one usable row has no std (NaN in TRL, then 0)
    return np.where(x.single | np.isnan(std), 0.0, centred / (np.nan_to_num(std, nan=0.0) + 1e-4))


def opo(x: EstimatorRows) -> np.ndarray | None:
    """verl's OPO: the group baseline weighted by response length; a group of one has baseline 0."""
    if x.lengths is None:
        return None
    w = x.lengths
    with np.errstate(invalid="ignore", divide="ignore"):
        baseline = x.in_group(w * x.total) / x.in_group(w)
    return np.where(x.single, x.total, x.total - baseline)


def gpg(x: EstimatorRows) -> np.ndarray:
    """verl's GPG (``f_norm`` 1): ``alpha * (t - mean)``, alpha = the step's rows / its rows with a non-zero total;
    a group of one has mean 0."""
    rows = x.step_sum(np.ones_like(x.total))
    nonzero = x.step_sum((x.total != 0).astype(np.float64))
    alpha = (rows / np.maximum(nonzero, 1.0))[x.step]
    return alpha * np.where(x.single, x.total, x.centred)


def grpo_passk(x: EstimatorRows) -> np.ndarray:
    """verl's pass@k GRPO: the group's best row gets ``(t_max - t_second) / (std + 1e-6)`` (std ddof 1), every
    other row 0 (and so does every row of a group of one, which verl refuses)."""
    t = x.total
    order = np.lexsort((-t, x.group))  # by group, best first
    groups = x.group[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    has_second = np.r_[starts[1:], len(order)] - starts >= 2
    best, second = order[starts[has_second]], order[starts[has_second] + 1]
    std = x.group_std(x.centred, ddof=1)
    out = np.zeros_like(t)
    out[best] = (t[best] - t[second]) / (std[best] + 1e-6)
    return out


def reinforce_plus_plus(x: EstimatorRows) -> np.ndarray | None:
    """verl's REINFORCE++ on an outcome reward (gamma 1): every token's return is the row's total, whitened over
    the step's tokens."""
    return x.token_whiten(x.total)


def reinforce_plus_plus_baseline(x: EstimatorRows) -> np.ndarray | None:
    """verl's REINFORCE++ with a group baseline: ``t - mean`` (a group of one keeps ``t``), whitened over the step's
    tokens."""
    return x.token_whiten(np.where(x.single, x.total, x.centred))


def gdpo_verl(x: EstimatorRows) -> np.ndarray | None:
    """verl's GDPO: each channel's verl GRPO advantage (``(r - mean) / (std + 1e-6)``; a group of one: mean 0,
    std 1), weighted and summed, then whitened over the step's tokens. A NaN reward counts as absent in its channel
    (verl has none)."""
    if x.lengths is None:
        return None
    return x.token_whiten(x.fused(_verl_group_zscore))


def _verl_group_zscore(x: EstimatorRows, values: np.ndarray) -> np.ndarray:
    deviation = x.deviation(values)
    std = x.group_std(deviation, ddof=1)
    single = x.count == 1
    return np.where(single, values / (1.0 + 1e-6), deviation / (np.nan_to_num(std, nan=0.0) + 1e-6))


RECOMPUTE: dict[str, Estimator] = {
    "grpo_population": grpo_population,
    "grpo_loo": grpo_loo,
    "gdpo_nemo": gdpo_nemo,
    "rloo": rloo,
    "rloo_vectorized": rloo_vectorized,
    "rloo_normalized": rloo_normalized,
    "opo": opo,
    "gpg": gpg,
    "grpo_passk": grpo_passk,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "gdpo_verl": gdpo_verl,
}
"""The estimators this module recomputes, by catalogue key (GRPO and GDPO are the engine's main path)."""

assert set(RECOMPUTE) <= set(ESTIMATOR_OF), "every function has its catalogue entry"


def _opo_shape(x: EstimatorRows) -> tuple[np.ndarray, str]:
    return x.total, "group"  # t minus a baseline of the group's own: any per-group shift


def _rpp_shape(x: EstimatorRows) -> tuple[np.ndarray, str]:
    return x.total, "step"  # whitened over the step's tokens: a per-step scale and shift of t


def _rpp_baseline_shape(x: EstimatorRows) -> tuple[np.ndarray, str]:
    return np.where(x.single, x.total, x.centred), "step"


def _gdpo_verl_shape(x: EstimatorRows) -> tuple[np.ndarray, str]:
    if np.isnan(x.rewards).any():
        return np.full(len(x.total), np.nan), "step"  # a channel with gaps: not checked up to shape either
    return x.fused(_verl_group_zscore), "step"


SHAPES: dict[str, Callable[[EstimatorRows], tuple[np.ndarray, str]]] = {
    "opo": _opo_shape,
    "reinforce_plus_plus": _rpp_shape,
    "reinforce_plus_plus_baseline": _rpp_baseline_shape,
    "gdpo_verl": _gdpo_verl_shape,
}
"""The token-weighted estimators without their lengths: what is left is ``x`` up to a per-group shift
(``"group"``) or a per-step scale and shift (``"step"``), the only places the token counts enter."""


def shape_residual(rows: EstimatorRows, logged: np.ndarray, key: str) -> np.ndarray:
    """``[N]`` |logged - the best fit of the estimator's shape| (:data:`SHAPES`), where a token-weighted estimator
    cannot be recomputed (no lengths): small when the logged advantages could be that estimator under some token
    counts. NaN where ``logged`` is NaN.

    >>> rows = EstimatorRows(np.array([[1.0], [0.0], [2.0], [0.0]]), np.ones(1), np.array([0, 0, 1, 1]), np.zeros(4))
    >>> [round(float(v), 6) for v in shape_residual(rows, np.array([0.7, -0.3, 1.2, -0.9]), "opo")]
    [0.0, 0.0, 0.05, 0.05]
    """
    x, per = SHAPES[key](rows)
    y = np.asarray(logged, dtype=np.float64)
    known = ~np.isnan(y) & ~np.isnan(x)
    seg, size = (rows.group, rows.num_groups) if per == "group" else (rows.step, rows.num_steps)
    w = known.astype(np.float64)
    xs, ys = np.where(known, x, 0.0), np.where(known, y, 0.0)
    count = np.bincount(seg, weights=w, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = (np.bincount(seg, weights=xs, minlength=size) / count)[seg]
        my = (np.bincount(seg, weights=ys, minlength=size) / count)[seg]
        if per == "group":
            slope = np.ones(len(y))
        else:
            cov = np.bincount(seg, weights=np.where(known, (x - mx) * (y - my), 0.0), minlength=size)
            var = np.bincount(seg, weights=np.where(known, (x - mx) ** 2, 0.0), minlength=size)
            slope = np.where(var > 0, cov / np.where(var > 0, var, 1.0), 0.0)[seg]
    fit = my + slope * (x - mx)
    return np.where(known, np.abs(y - fit), np.nan)


def recompute(rows: EstimatorRows) -> dict[str, np.ndarray | None]:
    """Every estimator of :data:`RECOMPUTE` on ``rows``: advantages ``[N]``, or None where a column it needs is
    missing.

    >>> rows = EstimatorRows(np.array([[1.0], [0.0], [1.0], [1.0]]), np.ones(1), np.array([0, 0, 0, 0]), np.zeros(4))
    >>> [round(float(v), 4) for v in recompute(rows)["rloo"]]
    [0.3333, -1.0, 0.3333, 0.3333]
    >>> recompute(rows)["opo"] is None
    True
    """
    return {key: fn(rows) for key, fn in RECOMPUTE.items()}
