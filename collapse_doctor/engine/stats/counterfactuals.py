"""Counterfactuals across estimators: the same run's rewards under every estimator of the catalogue's families.

For each estimator of :data:`KEYS` (GRPO and GDPO as the engine computed them, the others recomputed by
:mod:`collapse_doctor.engine.estimators` under their trainer's conventions), on the same sampled groups of each
step, per step:

- ``cf_zero_rows_<k>``: sampled valid rows whose advantage is within :data:`~collapse_doctor.engine.stats.silence.
  SILENT_SPAN` of 0 (no gradient: the signal budget's zero-advantage rollouts);
- ``cf_signal_rows_<k>``: sampled valid rows whose advantage carries a sign (``|A| > 1e-6``, as dominance counts);
- ``cf_tied_pairs_<k>``: pairs of rows of one group whose reward vectors differ (quantised to ``TIE_QUANTUM``)
  and whose advantages are equal (quantised to ``ADV_TIE_QUANTUM``): the estimator cannot rank them;
- ``cf_decided_<k>`` ``[S, C]``: the rows whose advantage sign channel c decides (its part of the advantage is the
  largest and agrees in sign, as :mod:`~collapse_doctor.engine.stats.dominance` decides for GRPO and GDPO).

and once for the sample: ``cf_groups``, ``cf_rows`` and ``cf_differing_pairs`` (the support).

**The sample.** Every step's groups when it has at most :data:`SAMPLE_GROUPS`, else that many, evenly spaced in
the step's group order (group ``floor(i G / K)``). The sample depends on the step's own rows only, so every entry
point (scan, watch, the callback, Ray) reduces the same groups. Estimators with a batch statistic (REINFORCE++'s
whitening, GPG's alpha) take it over the sampled groups; GRPO's and GDPO's advantages are the engine's (GDPO's batch
z-score over the whole step). Token-weighted estimators use the completion lengths where the rows carry them;
REINFORCE++ without them weights each row once (``cf_uniform`` says so), and OPO without them is GRPO without
scaling, so it is not computed (NaN series).

**Parts** (what decides a sign): every estimator here but GDPO is ``A_i = f_i * L(t)_i`` with ``f_i > 0`` and ``L``
linear in the total ``t = sum_c w_c r_c``, so channel c's part is ``L(w_c r_c)``: the group deviation (GRPO, RLOO,
leave-one-out GRPO, GPG: their leave-one-out numerators are ``n / (n - 1)`` times it), the length-weighted one (OPO),
the step deviation (REINFORCE++), the group then step deviation (REINFORCE++ with baseline), the best row's lead on
the second (pass@k). GDPO's parts are the weighted channel z-scores and its sign the fused sum's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.core.estimators import COUNTERFACTUAL_KEYS
from collapse_doctor.engine.estimators import RECOMPUTE, EstimatorRows
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.dominance import _dense_decisions
from collapse_doctor.engine.stats.kernels import to_host
from collapse_doctor.engine.stats.silence import SILENT_SPAN
from collapse_doctor.engine.stats.ties import ADV_TIE_QUANTUM, TIE_QUANTUM

if TYPE_CHECKING:
    from torch import Tensor

KEYS = COUNTERFACTUAL_KEYS
SAMPLE_GROUPS = 64
"""Groups of each step the counterfactuals are computed on (all of a step that has fewer): enough for run-wide
shares (a 100-step run gives 6,400 groups) at a bounded cost (an eighth of the rows of 512-group steps)."""
SIGNAL = 1e-6
"""An advantage beyond this carries a sign (dominance's test)."""

PER_ESTIMATOR = ("zero_rows", "signal_rows", "tied_pairs", "decided")
NAMES = (
    "cf_groups",
    "cf_rows",
    "cf_differing_pairs",
    "cf_uniform",
    *(f"cf_{stat}_{key}" for key in KEYS for stat in PER_ESTIMATOR),
)


def sampled_groups(group_step: np.ndarray, num_steps: int, limit: int = SAMPLE_GROUPS) -> np.ndarray:
    """Indices of the groups kept, given each group's step ``[G]`` (groups of a step in their order).

    >>> sampled_groups(np.array([0, 0, 0, 1, 1, 1, 1, 1]), 2, limit=2).tolist()
    [0, 1, 3, 5]
    """
    order = np.argsort(group_step, kind="stable")
    counts = np.bincount(group_step, minlength=num_steps)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(len(order)) - np.repeat(starts, counts)  # each group's place in its step
    size = np.repeat(counts, counts)
    keep = size <= limit
    # evenly spaced: the group at position floor(i * size / limit) for i < limit
    big = ~keep
    i = (position[big] * limit + size[big] - 1) // size[big]  # the smallest i that maps to this position or beyond
    keep[big] = (i < limit) & ((i * size[big]) // limit == position[big])
    return np.sort(order[keep])


class Sample:
    """The sampled rows of a chunk: flat arrays, and the engine's GRPO and GDPO advantages there."""

    def __init__(
        self,
        rows: EstimatorRows,
        grpo: np.ndarray,
        gdpo: np.ndarray,
        num_steps: int,
        step: np.ndarray,
        uniform: bool,
    ) -> None:
        self.rows, self.grpo, self.gdpo, self.uniform = rows, grpo, gdpo, uniform
        self.num_steps, self.step = num_steps, step
        self._runs: tuple[np.ndarray, np.ndarray] | None = None
        if len(step) and bool((step[1:] >= step[:-1]).all()):  # sorted steps: sums by runs, not a scatter
            starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
            self._runs = (starts, step[starts])

    def per_step(self, values: np.ndarray) -> np.ndarray:
        """``[S]`` per-row ``values`` summed per step (float64)."""
        if self._runs is None:
            return np.bincount(self.step, weights=values.astype(np.float64), minlength=self.num_steps)
        starts, present = self._runs
        out = np.zeros(self.num_steps)
        out[present] = np.add.reduceat(values.astype(np.float64), starts)
        return out


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    keep = sampled_groups(c.group_step, c.num_steps)
    g = c.g
    rows_of = (keep[:, None] * g + np.arange(g)[None, :]).reshape(-1)
    adv = c.advantages
    lengths = None if c.completions is None else c.completions.token_lengths
    return _statistics(
        _sample(
            c.rewards[rows_of],
            c.weights,
            np.repeat(np.arange(len(keep)), g),
            c.step_index[rows_of],
            None if lengths is None else np.asarray(lengths)[rows_of],
            adv["grpo"][:, keep].T.reshape(-1),
            adv["gdpo"][:, keep].T.reshape(-1),
            c.num_steps,
            block=g,
        )
    )


def general(c: GeneralChunk) -> dict[str, Tensor]:
    group_step = to_host(c.group_step)
    keep = np.zeros(c.num_groups, dtype=bool)
    keep[sampled_groups(group_step, c.num_steps)] = True
    gi = to_host(c.group_index)
    valid = to_host(c.valid_row).astype(bool)
    rows_of = np.flatnonzero(keep[gi] & valid)
    rows_of = rows_of[np.argsort(gi[rows_of], kind="stable")]  # group by group, as the dense sample
    lengths = None if c.input.completions is None else c.input.completions.token_lengths
    adv = c.input.advantages
    out = _statistics(
        _sample(
            to_host(c.rewards)[rows_of],
            to_host(c.weights).tolist(),
            gi[rows_of],
            to_host(c.step_index)[rows_of],
            None if lengths is None else np.asarray(lengths)[rows_of],
            to_host(adv.grpo)[rows_of],
            to_host(adv.gdpo)[rows_of],
            c.num_steps,
        )
    )
    return out  # type: ignore[return-value]  # NumPy arrays: step_statistics takes either


def _sample(
    rewards: np.ndarray,
    weights: list[float],
    group: np.ndarray,
    step: np.ndarray,
    lengths: np.ndarray | None,
    grpo: np.ndarray,
    gdpo: np.ndarray,
    num_steps: int,
    *,
    block: int | None = None,
) -> Sample:
    known = lengths is not None and bool(np.isfinite(lengths).all())
    uniform = not known
    rows = EstimatorRows(
        rewards, np.asarray(weights), group, step, lengths if known else np.ones(len(group)), block=block
    )
    return Sample(
        rows, grpo.astype(np.float64), gdpo.astype(np.float64), num_steps, np.asarray(step, np.int64), uniform
    )


def _statistics(s: Sample) -> dict[str, np.ndarray]:
    x, S = s.rows, s.num_steps
    ones = np.ones(len(x.group))
    vector = dense_np.hash_rows(
        [dense_np.quantize(np.nan_to_num(x.column(k), nan=np.inf), TIE_QUANTUM) for k in range(x.rewards.shape[1])]
    )
    pairs = _Pairs(x, vector)
    out = {
        "cf_groups": s.per_step(np.r_[True, x.group[1:] != x.group[:-1]] if len(x.group) else ones),
        "cf_rows": s.per_step(ones),
        "cf_differing_pairs": s.per_step(pairs.differing),
        "cf_uniform": np.full(S, 1.0 if s.uniform else 0.0),
    }
    parts_of = _parts(x)
    for key in KEYS:
        adv = _advantage(s, key)
        if adv is None:
            for stat in PER_ESTIMATOR:
                out[f"cf_{stat}_{key}"] = np.full((S, x.rewards.shape[1]) if stat == "decided" else S, np.nan)
            continue
        out[f"cf_zero_rows_{key}"] = s.per_step(np.abs(adv) < SILENT_SPAN)
        out[f"cf_signal_rows_{key}"] = s.per_step(np.abs(adv) > SIGNAL)
        out[f"cf_tied_pairs_{key}"] = s.per_step(pairs.tied(dense_np.quantize(adv, ADV_TIE_QUANTUM)))
        parts, sign = parts_of(key, adv)
        hits, _ = _dense_decisions([p[None, :] for p in parts], sign[None, :])
        out[f"cf_decided_{key}"] = np.stack([s.per_step(h) for h in hits], axis=1)
    return out


def _advantage(s: Sample, key: str) -> np.ndarray | None:
    if key == "grpo":
        return s.grpo
    if key == "gdpo":
        return s.gdpo
    if key == "opo" and s.uniform:
        return None  # OPO with equal lengths is GRPO without scaling: nothing of its own to show
    return RECOMPUTE[key](s.rows)


class _Pairs:
    """The pairs of rows of one group: those whose reward ``vector`` differs (:attr:`differing`), and for any
    advantage bins those tied among them (:meth:`tied`); ``[N]`` per-row values whose sums over a step are the counts
    (a dense sample keeps each group's counts on its first row, exact integers; else half of each row's pairs)."""

    def __init__(self, x: EstimatorRows, vector: np.ndarray) -> None:
        self.x, self.vector = x, vector
        if x.block is not None:
            g = x.block
            members = vector.reshape(-1, g).T  # [g, G]
            self.same = [members[shift:] == members[:-shift] for shift in range(1, g)]
            identical = np.sum([same.sum(axis=0) for same in self.same], axis=0) if self.same else 0
            self.differing = self._on_first(g * (g - 1) / 2 - identical + np.zeros(members.shape[1]))
        else:
            self.same_vector = _bucket_sizes(dense_np.hash_rows([x.group, vector]))
            self.differing = (x.count - self.same_vector) / 2

    def _on_first(self, per_group: np.ndarray) -> np.ndarray:
        g = self.x.block
        assert g is not None
        out = np.zeros((len(per_group), g))
        out[:, 0] = per_group
        return out.reshape(-1)

    def tied(self, bins: np.ndarray) -> np.ndarray:
        x = self.x
        if x.block is not None:
            members = bins.reshape(-1, x.block).T
            tied = np.zeros(members.shape[1])
            for shift, same in enumerate(self.same, start=1):
                tied += ((members[shift:] == members[:-shift]) & ~same).sum(axis=0)
            return self._on_first(tied)
        same_bin = _bucket_sizes(dense_np.hash_rows([x.group, bins]))
        same_both = _bucket_sizes(dense_np.hash_rows([x.group, self.vector, bins]))
        return (same_bin - same_both) / 2


def _bucket_sizes(keys: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return counts[inverse].astype(np.float64)


Parts = Callable[[str, np.ndarray], tuple[list[np.ndarray], np.ndarray]]


def _parts(x: EstimatorRows) -> Parts:
    """For an estimator's key and advantages: each channel's part ``[N]`` and the values whose sign is decided."""
    columns = [x.weights[k] * np.nan_to_num(x.column(k), nan=0.0) for k in range(x.rewards.shape[1])]

    deviations: dict[int, np.ndarray] = {}

    def linear(centre: Callable[[np.ndarray], np.ndarray], adv: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        return [centre(col) for col in columns], adv

    def group(col: np.ndarray, *, single: str) -> np.ndarray:
        if id(col) not in deviations:  # the same columns for every estimator with a group baseline
            deviations[id(col)] = x.deviation(col)
        if not x.single.any():
            return deviations[id(col)]
        return np.where(x.single, col if single == "keep" else 0.0, deviations[id(col)])

    def step_dev(col: np.ndarray) -> np.ndarray:
        w = x.lengths if x.lengths is not None else np.ones(len(col))
        tokens = x.step_sum(w)
        return col - (x.step_sum(w * col) / (tokens + 1e-8))[x.step]

    def opo(col: np.ndarray) -> np.ndarray:
        w = x.lengths if x.lengths is not None else np.ones(len(col))
        with np.errstate(invalid="ignore", divide="ignore"):
            baseline = x.in_group(w * col) / x.in_group(w)
        return np.where(x.single, col, col - baseline)

    leaders: list[tuple[np.ndarray, np.ndarray]] = []

    def passk(col: np.ndarray) -> np.ndarray:
        if not leaders:  # each group's best and second row by total, as pass@k ranks them
            order = np.lexsort((-x.total, x.group))
            groups = x.group[order]
            starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if len(groups) else np.zeros(0, np.intp)
            has_second = np.r_[starts[1:], len(order)] - starts >= 2
            leaders.append((order[starts[has_second]], order[starts[has_second] + 1]))
        best, second = leaders[0]
        out = np.zeros_like(col)
        out[best] = col[best] - col[second]
        return out

    def parts(key: str, adv: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        if key == "gdpo":
            z = [x.weights[k] * _zscore(x, x.column(k)) for k in range(x.rewards.shape[1])]
            return z, np.sum(z, axis=0) if z else adv
        if key in ("grpo", "grpo_loo", "rloo", "gpg"):
            keep = "keep" if key in ("rloo", "gpg") else "zero"
            return linear(lambda col: group(col, single=keep), adv)
        if key == "opo":
            return linear(opo, adv)
        if key == "reinforce_plus_plus":
            return linear(step_dev, adv)
        if key == "reinforce_plus_plus_baseline":
            return linear(lambda col: step_dev(group(col, single="keep")), adv)
        if key == "grpo_passk":
            return linear(passk, adv)
        raise KeyError(key)

    return parts


def _zscore(x: EstimatorRows, r: np.ndarray) -> np.ndarray:
    """A channel's group z-score (std ddof 1, ``+1e-4``: TRL's GDPO), 0 where the reward is NaN or the row alone."""
    known = ~np.isnan(r)
    if known.all():
        dev = x.deviation(r)
        std = np.nan_to_num(x.group_std(dev, ddof=1), nan=0.0)
        return np.where(x.single, 0.0, dev / (std + 1e-4))
    out = np.zeros(len(r))
    sub = EstimatorRows(r[known][:, None], np.ones(1), x.group[known], x.step[known])
    dev = sub.deviation(sub.total)
    std = np.nan_to_num(sub.group_std(dev, ddof=1), nan=0.0)
    out[known] = np.where(sub.single, 0.0, dev / (std + 1e-4))
    return out
