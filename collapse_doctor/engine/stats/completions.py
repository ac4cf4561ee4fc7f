"""Completions: groups whose completions are all the same, groups whose rewards are, and completion lengths.

A policy that collapsed to one answer per prompt and channels that cancel both leave a group without an
advantage; the completions tell them apart. The reader hands each row's completion code (equal codes, equal
text; a null text is a value of its own) and length (tokens, else characters) in
:class:`~collapse_doctor.engine.stats.dense.CompletionRows`; both paths count on them with NumPy on the host.

Over the groups with 2+ valid rows (``eligible_groups``): ``completion_groups`` is that support where the chunk
has completion text (NaN without), ``identical_completion_groups`` the groups whose valid rows all have one
completion, ``equal_reward_groups`` those whose valid rows have equal reward vectors (every channel constant,
NaN in the same channels: from the rewards alone, so it exists without text) and
``equal_reward_distinct_groups`` those with equal reward vectors but 2+ distinct completions (the rewards do not
tell different answers apart). ``distinct_completion_share`` is the number of distinct completions among a step's
valid rows over its valid rows (1.0: all different). ``completion_length_mean`` and ``completion_length_max`` are
over the valid rows with a known length. Every series is NaN where what it needs is unknown.

Per channel, the within-group co-movement of the reward with the completion length (what tells a length-type
reward from one that judges content): over the rows of a group where both are known, ``length_reward_sxy`` sums
``(length - group mean) * (reward - group mean)``, ``length_sxx`` and ``length_reward_syy`` the squares, per step
over groups with 2+ such rows; ``length_groups`` counts the groups whose lengths vary. Their ratio
``sxy / sqrt(sxx syy)`` over a stretch is the pooled within-group correlation (a group of identical completions
adds nothing: its lengths do not vary). The silent groups'
split by cause (``silent_identical_groups_*``, ``silent_cancel_groups_*``) is in
:mod:`~collapse_doctor.engine.stats.silence`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collapse_doctor.core.series import CUT_AT_STEP_MAX
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import CompletionRows, DenseChunk, ratio
from collapse_doctor.engine.stats.kernels import to_host

NAMES = (
    "length_reward_sxy",
    "length_sxx",
    "length_reward_syy",
    "length_groups",
    "completion_groups",
    "identical_completion_groups",
    "distinct_completion_share",
    "equal_reward_groups",
    "equal_reward_distinct_groups",
    "completion_length_mean",
    "completion_length_max",
    "cut_rows",
    "cut_known_rows",
    "cut_rule",
    "cut_reward_diff_sum",
    "cut_reward_diff_sq",
    "cut_mixed_groups",
)


def general(c: GeneralChunk) -> dict[str, np.ndarray]:
    eligible, equal = to_host(c.eligible), to_host(c.equal_rewards)
    group_step = to_host(c.group_step)
    _, step, valid = c.host_rows

    def per_step(mask: np.ndarray) -> np.ndarray:
        return np.bincount(group_step, weights=mask, minlength=c.num_steps).astype(np.float64)

    rows = c.input.completions
    out = _series(
        per_step, eligible, equal, c.identical_completions, c.known_completions, rows, valid, step, c.num_steps
    )
    group = to_host(c.group_index)
    rewards = to_host(c.input.rewards).astype(np.float64)
    moments = length_moments(rewards, group, group_step, rows, valid, c.num_steps)
    return out | moments | cut_moments(rewards, group, group_step, rows, valid, step, c.num_steps)


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    eligible = np.ones(c.num_groups, dtype=bool)  # groups of g >= 2 rows without NaN
    valid = np.ones(c.num_rows, dtype=bool)
    out = _series(
        c.steps_sum,
        eligible,
        c.equal_rewards,
        c.identical_completions,
        c.known_completions,
        c.completions,
        valid,
        c.step_index,
        c.num_steps,
    )
    group = np.arange(c.num_rows, dtype=np.int64) // c.g
    rewards = np.asarray(c.rewards, dtype=np.float64)
    moments = length_moments(rewards, group, c.group_step, c.completions, valid, c.num_steps)
    return out | moments | cut_moments(rewards, group, c.group_step, c.completions, valid, c.step_index, c.num_steps)


def length_moments(
    rewards: np.ndarray,
    group: np.ndarray,
    group_step: np.ndarray,
    rows: CompletionRows | None,
    valid: np.ndarray,
    num_steps: int,
) -> dict[str, np.ndarray]:
    """``[S, C]`` within-group sums of the co-movement of each channel's reward with the completion length.

    >>> r = np.array([[0.0], [1.0], [2.0], [5.0], [5.0]])
    >>> rows = CompletionRows.of(None, np.array([10.0, 20.0, 30.0, 7.0, 9.0]))
    >>> m = length_moments(r, np.array([0, 0, 0, 1, 1]), np.array([0, 0]), rows, np.ones(5, bool), 1)
    >>> m["length_reward_sxy"].tolist(), m["length_sxx"].tolist(), m["length_groups"].tolist()
    ([[20.0]], [[202.0]], [[2.0]])
    """
    C = rewards.shape[1]
    names = ("length_reward_sxy", "length_sxx", "length_reward_syy", "length_groups")
    lengths = None if rows is None else rows.lengths
    if lengths is None:
        return {name: np.full((num_steps, C), np.nan) for name in names}
    G = len(group_step)
    out = {name: np.zeros((num_steps, C)) for name in names}
    for k in range(C):
        known = valid & np.isfinite(rewards[:, k]) & np.isfinite(lengths)
        g, x, y = group[known], lengths[known], rewards[known, k]
        n = np.bincount(g, minlength=G).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mx = np.bincount(g, weights=x, minlength=G) / n
            my = np.bincount(g, weights=y, minlength=G) / n
        dx, dy = x - mx[g], y - my[g]  # centred per group first: no cancellation in the sums
        sxy = np.bincount(g, weights=dx * dy, minlength=G)
        sxx = np.bincount(g, weights=dx * dx, minlength=G)
        syy = np.bincount(g, weights=dy * dy, minlength=G)
        use = n >= 2
        for name, values in (
            ("length_reward_sxy", sxy),
            ("length_sxx", sxx),
            ("length_reward_syy", syy),
            ("length_groups", (sxx > 0).astype(np.float64)),
        ):
            out[name][:, k] = np.bincount(group_step[use], weights=values[use], minlength=num_steps)
    return out


def step_longest(lengths: np.ndarray, valid: np.ndarray, step: np.ndarray, num_steps: int) -> np.ndarray:
    """``[S]`` the largest known length of each step's valid rows (-inf for a step without any).

    >>> step_longest(np.array([2.0, np.nan, 4.0, 1.0]), np.ones(4, bool), np.array([0, 0, 0, 1]), 3).tolist()
    [4.0, 1.0, -inf]
    """
    known = valid & np.isfinite(lengths)
    top = np.full(num_steps, -np.inf)
    np.maximum.at(top, np.asarray(step, dtype=np.int64)[known], lengths[known])
    return top


def cut_of(
    rows: CompletionRows | None, valid: np.ndarray, step: np.ndarray, longest: np.ndarray | None
) -> tuple[np.ndarray, float] | None:
    """``[N]`` 1.0 for a row cut at the length cap, 0.0 for one that ended on its own, NaN unknown, and the rule
    that said so (the rows' own: ``CUT_BY_FLAG`` or ``CUT_AT_CAP``; else :data:`CUT_AT_STEP_MAX`, a row at its
    step's ``longest`` length); None where neither cut flags nor lengths are known.

    >>> rows = CompletionRows.of(None, np.array([3.0, 5.0, 5.0, 2.0]))
    >>> cut, rule = cut_of(rows, np.ones(4, bool), np.array([0, 0, 0, 1]), np.array([5.0, 2.0]))
    >>> cut.tolist(), rule
    ([0.0, 1.0, 1.0, 1.0], 0.0)
    """
    if rows is None:
        return None
    if rows.cut is not None:
        return np.where(valid, rows.cut, np.nan), rows.cut_rule
    if rows.lengths is None or longest is None:
        return None
    known = valid & np.isfinite(rows.lengths)
    at_top = rows.lengths >= longest[np.asarray(step, dtype=np.int64)]
    return np.where(known, at_top.astype(np.float64), np.nan), CUT_AT_STEP_MAX


def cut_moments(
    rewards: np.ndarray,
    group: np.ndarray,
    group_step: np.ndarray,
    rows: CompletionRows | None,
    valid: np.ndarray,
    step: np.ndarray,
    num_steps: int,
) -> dict[str, np.ndarray]:
    """Per step the cut rows and the rows whose cut is known (``[S]``), and per channel (``[S, C]``) the sum over
    groups holding both cut and finished rows of (mean reward of the cut rows - mean of the finished ones), its sum of
    squares and the number of such groups: whether the cut itself changes a reward, inside a group. Where lengths are
    known, only finished rows at least half as long as the step's longest are compared.

    >>> r = np.array([[9.0], [1.0], [2.0], [4.0], [4.0]])
    >>> rows = CompletionRows.of(None, None, np.array([1.0, 0.0, 0.0, 1.0, 1.0]))
    >>> m = cut_moments(r, np.array([0, 0, 0, 1, 1]), np.array([0, 0]), rows, np.ones(5, bool), np.zeros(5, int), 1)
    >>> m["cut_rows"].tolist(), m["cut_reward_diff_sum"].tolist(), m["cut_mixed_groups"].tolist()
    ([3.0], [[7.5]], [[1.0]])
    """
    C = rewards.shape[1]
    step = np.asarray(step, dtype=np.int64)
    lengths = None if rows is None else rows.lengths
    longest = None if lengths is None else step_longest(lengths, valid, step, num_steps)
    found = cut_of(rows, valid, step, longest)
    if found is None:
        unknown = np.full(num_steps, np.nan)
        return {"cut_rows": unknown, "cut_known_rows": unknown, "cut_rule": unknown} | {
            name: np.full((num_steps, C), np.nan)
            for name in ("cut_reward_diff_sum", "cut_reward_diff_sq", "cut_mixed_groups")
        }
    cut, rule = found
    known = np.isfinite(cut)
    out = {
        "cut_rows": np.bincount(step[known], weights=cut[known], minlength=num_steps).astype(np.float64),
        "cut_known_rows": np.bincount(step[known], minlength=num_steps).astype(np.float64),
        "cut_rule": np.full(num_steps, rule),
    }
    G = len(group_step)
    # Finished rows at least half as long as the step's longest: a cut completion is compared with finished ones of
    # comparable length, so a reward that needs a few characters (0 for an empty completion) does not pass for one
    # that pays for reaching the cap.
    comparable = np.ones(len(cut), dtype=bool)
    if lengths is not None and longest is not None:
        comparable = (cut > 0) | (valid & np.isfinite(lengths) & (lengths >= 0.5 * longest[step]))
    diff_sum, diff_sq, mixed = (np.zeros((num_steps, C)) for _ in range(3))
    for k in range(C):
        use = known & comparable & np.isfinite(rewards[:, k])
        g, y, is_cut = group[use], rewards[use, k], cut[use] > 0
        n_cut = np.bincount(g[is_cut], minlength=G).astype(np.float64)
        n_fin = np.bincount(g[~is_cut], minlength=G).astype(np.float64)
        both = (n_cut > 0) & (n_fin > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = (
                np.bincount(g[is_cut], weights=y[is_cut], minlength=G) / n_cut
                - np.bincount(g[~is_cut], weights=y[~is_cut], minlength=G) / n_fin
            )
        at = group_step[both]
        diff_sum[:, k] = np.bincount(at, weights=diff[both], minlength=num_steps)
        diff_sq[:, k] = np.bincount(at, weights=diff[both] ** 2, minlength=num_steps)
        mixed[:, k] = np.bincount(at, minlength=num_steps)
    return out | {"cut_reward_diff_sum": diff_sum, "cut_reward_diff_sq": diff_sq, "cut_mixed_groups": mixed}


def _series(
    per_step: Callable[[np.ndarray], np.ndarray],
    eligible: np.ndarray,
    equal: np.ndarray,
    identical: np.ndarray | None,
    known: np.ndarray | None,
    rows: CompletionRows | None,
    valid: np.ndarray,
    step: np.ndarray,
    num_steps: int,
) -> dict[str, np.ndarray]:
    """Every series from ``[G]`` masks (summed per step by ``per_step``) and the rows' completions."""
    unknown = np.full(num_steps, np.nan)
    equal = eligible & equal
    out = {
        "completion_groups": unknown,
        "identical_completion_groups": unknown,
        "distinct_completion_share": unknown,
        "equal_reward_groups": per_step(equal),
        "equal_reward_distinct_groups": unknown,
        "completion_length_mean": unknown,
        "completion_length_max": unknown,
    }
    codes = None if rows is None else rows.codes
    if codes is not None and identical is not None and known is not None:
        out["completion_groups"] = per_step(eligible & known)  # groups whose every completion was logged
        out["identical_completion_groups"] = per_step(eligible & identical)
        out["equal_reward_distinct_groups"] = per_step(equal & known & ~identical)
        out["distinct_completion_share"] = distinct_share(codes, valid & (codes >= 0), step, num_steps)
    lengths = None if rows is None else rows.lengths
    if lengths is not None:
        out["completion_length_mean"], out["completion_length_max"] = length_stats(lengths, valid, step, num_steps)
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def distinct_share(codes: np.ndarray, valid: np.ndarray, step: np.ndarray, num_steps: int) -> np.ndarray:
    """``[S]`` distinct codes among each step's valid rows over its valid rows (NaN for a step without any).

    >>> distinct_share(np.array([3, 3, 5, 3, -1]), np.ones(5, bool), np.array([0, 0, 0, 1, 1]), 2).tolist()
    [0.6666666666666666, 1.0]
    """
    step, codes = np.asarray(step, dtype=np.int64)[valid], codes[valid]
    if len(codes) == 0:
        return np.full(num_steps, np.nan)
    span = int(codes.max()) + 2  # codes from -1 (a null text)
    keys = np.sort(step * span + (codes + 1))  # np.sort and a diff: several times faster than np.unique
    first = np.ones(len(keys) + 1, dtype=np.int64)
    first[0] = 0
    np.not_equal(keys[1:], keys[:-1], out=first[2:])  # 1 where a key differs from the previous one
    np.cumsum(first, out=first)
    ends = np.searchsorted(keys, np.arange(num_steps + 1, dtype=np.int64) * span)  # each step's keys, in order
    found = first[ends[1:]] - first[ends[:-1]]
    return ratio(found, np.bincount(step, minlength=num_steps))


def length_stats(
    lengths: np.ndarray, valid: np.ndarray, step: np.ndarray, num_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """``[S]`` mean and max of the known lengths of each step's valid rows (NaN for a step without any).

    >>> mean, top = length_stats(np.array([2.0, np.nan, 4.0, 1.0]), np.ones(4, bool), np.array([0, 0, 0, 1]), 2)
    >>> mean.tolist(), top.tolist()
    ([3.0, 1.0], [4.0, 1.0])
    """
    known = valid & ~np.isnan(lengths)
    at = np.asarray(step, dtype=np.int64)[known]
    count = np.bincount(at, minlength=num_steps)
    mean = ratio(np.bincount(at, weights=lengths[known], minlength=num_steps), count)
    return mean, np.where(count > 0, step_longest(lengths, valid, step, num_steps), np.nan)
