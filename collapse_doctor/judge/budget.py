"""The signal budget of a run: how much of it carried no gradient under an algorithm, and why.

Reads the per-step counts of :mod:`collapse_doctor.engine.stats.signal` (silent groups, zero-advantage rows, silent
groups at every channel's step maximum or minimum) and the per-channel floor/ceiling counts. "All-pass" means
every channel at its RUN-wide maximum, which a step can only contribute when its own maximum of every channel
equals the run's; summing the per-step counts of those steps is exact. Pure numpy on a RunSeries, no I/O.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from collapse_doctor.core.series import RunSeries

_STEPS = slice(None)


def run_extreme(series: RunSeries, name: str, how: str) -> np.ndarray:
    """``[C]`` each channel's largest (``how="max"``) or smallest value of series ``name`` over the run (NaN: none)."""
    values = series[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmax(values, axis=0) if how == "max" else np.nanmin(values, axis=0))


def steps_at_extreme(series: RunSeries, how: str) -> np.ndarray:
    """``[S, C]`` whether the step's maximum (``how="max"``) or minimum of each channel is the run's.

    A channel that never varies over the whole run (its maximum is its minimum) is at its floor when that
    value is 0 or less (a reward never earned) and at its ceiling otherwise.
    """
    name = f"reward_{how}"
    at = series[name] == run_extreme(series, name, how)[None, :]
    top, bottom = run_extreme(series, "reward_max", "max"), run_extreme(series, "reward_min", "min")
    constant = top == bottom
    wrong_side = constant & ((top <= 0) if how == "max" else (top > 0))
    return np.asarray(at & ~wrong_side[None, :])


@dataclass(frozen=True)
class SignalBudget:
    """Shares of a stretch of a run (all of it by default) under one algorithm, with their support.

    The silent groups are split by cause, exclusively, in this order: one completion repeated (a collapsed
    policy; known only where the rollouts carry completion text), all-pass, all-fail, equal reward vectors from
    different completions (the reward cannot tell them apart), and channels that cancel (some channel varies, the
    advantage does not).
    """

    algorithm: str
    zero_advantage_rollout_share: float
    """Rollouts whose advantage is 0 over all rollouts: the valid ones of silent groups and groups of one, and every
    rollout without any reward (all channels None: its advantage is 0, it is left out of the baselines)."""
    silent_group_share: float
    all_pass_group_share: float
    """Silent groups with every channel at its run-wide maximum, over groups with 2+ rollouts."""
    all_fail_group_share: float
    rollouts: int
    groups: int
    identical_group_share: float | None = None
    """Silent groups whose members all wrote the same completion (``None``: the rollouts carry no text)."""
    identical_pass_group_share: float = 0.0
    """Of those, the all-pass ones (so that the causes are exclusive)."""
    identical_fail_group_share: float = 0.0
    exact_cancel_group_share: float | None = None
    """Silent groups where some channel varies within the group (``None``: series of an older reduction)."""

    @property
    def cancel_group_share(self) -> float:
        """Silent groups whose channels vary but whose advantages cancel."""
        if self.exact_cancel_group_share is not None:
            return self.exact_cancel_group_share
        return max(0.0, self.silent_group_share - self.all_pass_group_share - self.all_fail_group_share)

    @property
    def repeated_group_share(self) -> float:
        """Silent groups of one completion repeated (0 when the rollouts carry no text)."""
        return self.identical_group_share or 0.0

    @property
    def pass_group_share(self) -> float:
        """All-pass silent groups of different completions (the all-pass cause, exclusive of a collapse)."""
        return max(0.0, self.all_pass_group_share - self.identical_pass_group_share)

    @property
    def fail_group_share(self) -> float:
        """All-fail silent groups of different completions."""
        return max(0.0, self.all_fail_group_share - self.identical_fail_group_share)

    @property
    def equal_group_share(self) -> float:
        """Silent groups of equal reward vectors that are neither one completion, all-pass nor all-fail."""
        rest = self.silent_group_share - self.repeated_group_share - self.pass_group_share - self.fail_group_share
        return max(0.0, rest - self.cancel_group_share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "zero_advantage_rollout_share": self.zero_advantage_rollout_share,
            "all_pass_group_share": self.all_pass_group_share,
            "all_fail_group_share": self.all_fail_group_share,
            "silent_group_share": self.silent_group_share,
            "silent_causes": {
                "identical_completions": self.identical_group_share,
                "all_pass": self.pass_group_share,
                "all_fail": self.fail_group_share,
                "equal_rewards": self.equal_group_share,
                "cancelling": self.cancel_group_share,
            },
            "rollouts": self.rollouts,
            "groups": self.groups,
        }


def _share(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def _known_sum(series: RunSeries, name: str, window: slice, mask: np.ndarray | None = None) -> float | None:
    """The sum of a count series over ``window`` (``mask``: the steps that count), ``None`` where it is unknown:
    absent, or NaN on every step (the rollouts carry no completion text)."""
    if name not in series:
        return None
    values = series[name][window]
    if mask is not None:
        values = np.where(mask, values, 0.0)
    return float(np.nansum(values)) if np.isfinite(values).any() else None


def signal_budget(series: RunSeries, algorithm: str, window: slice = _STEPS) -> SignalBudget | None:
    """The budget of ``window`` (steps of the series) under ``algorithm`` ("grpo" or "gdpo"); None without it."""
    if series.num_steps == 0:
        return None
    at_max = steps_at_extreme(series, "max")
    at_min = steps_at_extreme(series, "min")
    has = np.isfinite(series["reward_max"])
    pass_ok = (at_max | ~has).all(axis=1)[window]
    fail_ok = (at_min | ~has).all(axis=1)[window]
    rows = float(np.nansum(series["valid_rows"][window]))
    # A rollout without any reward gets advantage 0 (DESIGN.md, advantage conventions): no gradient either
    unscored = float(np.nansum(series["rollouts"][window])) - rows if "rollouts" in series else 0.0
    groups = float(np.nansum(series["eligible_groups"][window]))
    all_pass = float(np.nansum(np.where(pass_ok, series[f"all_pass_groups_{algorithm}"][window], 0.0)))
    all_fail = float(np.nansum(np.where(fail_ok, series[f"all_fail_groups_{algorithm}"][window], 0.0)))
    identical = _known_sum(series, f"silent_identical_groups_{algorithm}", window)
    identical_pass = _known_sum(series, f"identical_pass_groups_{algorithm}", window, pass_ok) or 0.0
    identical_fail = _known_sum(series, f"identical_fail_groups_{algorithm}", window, fail_ok) or 0.0
    cancel = _known_sum(series, f"silent_cancel_groups_{algorithm}", window)
    return SignalBudget(
        algorithm=algorithm,
        zero_advantage_rollout_share=_share(
            float(np.nansum(series[f"zero_adv_rows_{algorithm}"][window])) + unscored, rows + unscored
        ),
        silent_group_share=_share(np.nansum(series[f"silent_groups_{algorithm}"][window]), groups),
        all_pass_group_share=_share(all_pass, groups),
        all_fail_group_share=_share(all_fail, groups),
        rollouts=int(rows + unscored),
        groups=int(groups),
        identical_group_share=_share(identical, groups) if identical is not None else None,
        identical_pass_group_share=_share(identical_pass, groups) if groups > 0 else 0.0,
        identical_fail_group_share=_share(identical_fail, groups) if groups > 0 else 0.0,
        exact_cancel_group_share=_share(cancel, groups) if cancel is not None and groups > 0 else None,
    )


def channel_extreme_shares(series: RunSeries, window: slice = _STEPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per channel over ``window``: (ceiling share, floor share, groups) of the groups where it has 2+ values.

    Ceiling: constant at the channel's run-wide maximum; floor: at its run-wide minimum. Series rebuilt from the
    TRL callback's scalars carry the counts at the extremes already (against the extremes so far, which the
    callback knows when it logs a step), so no step is set aside here.
    """
    if series.from_callback_scalars:
        at_max = at_min = np.ones_like(series["channel_groups"][window], dtype=bool)
    else:
        at_max = steps_at_extreme(series, "max")[window]
        at_min = steps_at_extreme(series, "min")[window]
    groups = np.nansum(series["channel_groups"][window], axis=0)
    ceiling = np.nansum(np.where(at_max, series["channel_at_max_groups"][window], 0.0), axis=0)
    floor = np.nansum(np.where(at_min, series["channel_at_min_groups"][window], 0.0), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (
            np.where(groups > 0, ceiling / np.maximum(groups, 1), np.nan),
            np.where(groups > 0, floor / np.maximum(groups, 1), np.nan),
            groups,
        )


def applies_share(series: RunSeries, window: slice = _STEPS) -> np.ndarray:
    """Per channel: the share of valid rollouts on which it has a value (TRL's None is no value)."""
    rows = float(np.nansum(series["valid_rows"][window]))
    return (
        np.nansum(series["channel_rows"][window], axis=0) / rows if rows > 0 else np.full(len(series.channels), np.nan)
    )
