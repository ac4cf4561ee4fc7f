"""The per-channel series of a run read from its scalar log only, rebuilt from the TRL callback's scalars.

``CollapseDoctorCallback`` logs, with every trainer log, each reward channel's statistics from the rollouts it
reduced: rel_gain, the share of constant groups, the variance share and the share of advantage signs it decides
under the run's aggregation, the shares of its groups constant at its maximum and minimum so far, its support
(groups with two or more values, the share of rollouts it scored) and its range (``collapse_doctor/<stat>/<channel>``,
the mean over the steps since the previous log). A tracker's files of that run (W&B, Trackio, MLflow, TensorBoard)
hold them, so the per-group channel checks (CD101, CD402) judge a tracker-only scan from the same statistics the
rollout path computes, one point per log instead of one per step. What cannot be rebuilt: the other aggregation's
numbers (nothing was recomputed, so a finding's counterfactual is "not computed"), channel pairs and completions.
"""

from __future__ import annotations

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.scalars import ScalarSeries
from collapse_doctor.core.series import CALLBACK_SCALARS, RunSeries

__all__ = ["NEEDED", "callback_channel_series", "logged_aggregation", "logged_weights"]

NEEDED: dict[str, str] = {
    S.CHANNEL_REL_GAIN: "rel_gain",
    S.CHANNEL_ZERO_VAR_SHARE: "channel_zero_var_share",
    S.CHANNEL_SIGNAL_SHARE: "signal_share",
    S.CHANNEL_DOMINANCE: "dominance",
    S.CHANNEL_GROUPS: "channel_groups",
    S.CHANNEL_SCORED_SHARE: "channel_rows",
    S.CHANNEL_CEILING_SHARE: "channel_ceiling_share",
    S.CHANNEL_FLOOR_SHARE: "channel_floor_share",
}
"""The callback's per-channel series the rebuilt series need (canonical prefix -> what it becomes)."""
_OPTIONAL: dict[str, str] = {
    S.CHANNEL_MEAN: "reward_mean",
    S.CHANNEL_MIN: "reward_min",
    S.CHANNEL_MAX: "reward_max",
    S.CHANNEL_GROUP_STD: "reward_std",
}
"""Series read where logged (TRL logs the mean itself; a series missing is NaN: evidence that says less)."""


def logged_aggregation(scalars: ScalarSeries | None) -> str | None:
    """``"gdpo"`` or ``"grpo"``: the aggregation the callback's run used (its ``aggregation_gdpo`` scalar), or
    ``None`` where it is not logged or changed during the run.

    >>> from collapse_doctor.core.scalars import TagPoints
    >>> points = {S.AGGREGATION_GDPO: TagPoints(np.arange(3), np.ones(3))}
    >>> logged_aggregation(ScalarSeries(framework="trl", series=points, tags={}, points=3))
    'gdpo'
    """
    points = scalars.get(S.AGGREGATION_GDPO) if scalars is not None else None
    if points is None:
        return None
    values = points.values[np.isfinite(points.values)]
    if not len(values):
        return None
    if (values >= 0.5).all():
        return "gdpo"
    return "grpo" if (values < 0.5).all() else None


def logged_weights(scalars: ScalarSeries | None) -> dict[str, float]:
    """``{channel: weight}`` from the callback's ``weight/<channel>`` series: each channel's last finite value."""
    out: dict[str, float] = {}
    if scalars is None:
        return out
    for channel in scalars.channels:
        points = scalars.get(S.CHANNEL_WEIGHT + channel)
        finite = points.values[np.isfinite(points.values)] if points is not None else np.zeros(0)
        if len(finite):
            out[channel] = float(finite[-1])
    return out


def callback_channel_series(scalars: ScalarSeries | None, algorithm: str) -> RunSeries | None:
    """The run's per-channel series from the callback's scalars, or ``None`` where the log lacks them (no callback,
    or one that logged fewer series), or holds them for only some of its channels.

    ``algorithm`` (``"grpo"`` or ``"gdpo"``) is the aggregation the logged variance shares and sign dominance were
    computed under; the other aggregation's are NaN. Counts become per-point values: ``channel_groups`` is the
    logged mean of groups per step, ``channel_rows`` the share of rollouts scored over ``valid_rows`` of 1, and the
    groups at the ceiling (floor) are that share of ``channel_groups``.
    """
    if scalars is None:
        return None
    channels = tuple(c for c in scalars.channels if all(prefix + c in scalars for prefix in NEEDED))
    if not channels or set(scalars.channels) - set(channels):
        return None
    names = [prefix + c for prefix in NEEDED for c in channels]
    steps = np.unique(np.concatenate([scalars.series[n].steps for n in names])).astype(np.int64)
    values: dict[str, np.ndarray] = {}
    for prefix, target in (*NEEDED.items(), *_OPTIONAL.items()):
        values[target] = np.stack([_on_steps(scalars, prefix + c, steps) for c in channels], axis=1)
    other = "grpo" if algorithm == "gdpo" else "gdpo"
    nan = np.full_like(values["signal_share"], np.nan)
    values[f"signal_share_{algorithm}"] = values.pop("signal_share")
    values[f"dominance_{algorithm}"] = values.pop("dominance")
    values[f"signal_share_{other}"] = nan
    values[f"dominance_{other}"] = nan.copy()
    groups = values["channel_groups"]
    values["channel_at_max_groups"] = values.pop("channel_ceiling_share") * groups
    values["channel_at_min_groups"] = values.pop("channel_floor_share") * groups
    values["valid_rows"] = np.ones(len(steps))
    return RunSeries(steps=steps, channels=channels, pairs=[], values=values, derived_from=CALLBACK_SCALARS)


def _on_steps(scalars: ScalarSeries, name: str, steps: np.ndarray) -> np.ndarray:
    """``name``'s values on the callback's logged ``steps``: at each, the mean of its points after the previous
    logged step up to this one (what the callback's own values average: the steps since its previous log), NaN
    where it has none there or no series at all.

    >>> from collapse_doctor.core.scalars import TagPoints
    >>> points = {"m": TagPoints(np.arange(1, 7), np.arange(1.0, 7))}
    >>> _on_steps(ScalarSeries(framework="trl", series=points, tags={}, points=6), "m", np.array([2, 4, 6])).tolist()
    [1.5, 3.5, 5.5]
    """
    out = np.full(len(steps), np.nan)
    points = scalars.get(name)
    if points is None or not len(points.steps) or not len(steps):
        return out
    at = np.searchsorted(steps, points.steps)  # the logged step each point belongs to (the first at or after it)
    keep = (at < len(steps)) & np.isfinite(points.values)
    sums = np.bincount(at[keep], weights=points.values[keep], minlength=len(steps))
    counts = np.bincount(at[keep], minlength=len(steps))
    np.divide(sums, counts, out=out, where=counts > 0)
    return out
