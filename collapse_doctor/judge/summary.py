"""Summarise a reduced run: its :class:`RunSummary` and its channel table, for rollouts or a scalar log only.

The channel table is computed here, once, from the series smoothed the way the detectors smooth them, so
every renderer shows the same numbers and none computes a statistic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.config import Config
from collapse_doctor.core.estimators import budget_note, family_of
from collapse_doctor.core.numbers import nanmedian
from collapse_doctor.core.reduction import RunReduction
from collapse_doctor.core.result import RunSummary
from collapse_doctor.core.scalars import ScalarSeries
from collapse_doctor.core.series import MAX_PAIRED_CHANNELS, PAIRS_CAPPED, RunSeries
from collapse_doctor.core.smoothing import finite_peak, rolling
from collapse_doctor.judge.budget import applies_share, channel_extreme_shares, signal_budget
from collapse_doctor.judge.counterfactuals import counterfactual_table


def _pairs_capped(channels: Sequence[str]) -> tuple[str, ...]:
    """The warning of a run with too many channels for pairwise statistics (CD401, weight inference)."""
    if len(channels) <= MAX_PAIRED_CHANNELS:
        return ()
    return (f"{len(channels)} channels: no collinearity check (CD401) and no weight inference: {PAIRS_CAPPED}",)


def rollout_summary(reduction: RunReduction, *, algorithm: tuple[str, str]) -> RunSummary:
    """What a run's rollouts reduced to (sizes, channels, weights, notes) and the aggregation the run used."""
    sizes = reduction.notes.group_sizes
    series = reduction.series
    return RunSummary(
        sources=reduction.sources,
        steps=series.num_steps,
        rollouts=reduction.rollouts,
        groups=reduction.groups,
        group_size_min=int(min(sizes)) if sizes else 0,
        group_size_max=int(max(sizes)) if sizes else 0,
        first_step=int(series.steps[0]) if series.num_steps else None,
        last_step=int(series.steps[-1]) if series.num_steps else None,
        channels=reduction.channels,
        weights=dict(reduction.weights),
        weights_source=reduction.weights_source,
        algorithm=algorithm[0],
        algorithm_source=algorithm[1],
        logged_advantage=reduction.logged_advantage,
        device=reduction.device,
        warnings=tuple(reduction.notes.warnings()) + _pairs_capped(reduction.channels),
        ground_truth=reduction.ground_truth,
        dynamic_weight_channels=tuple(reduction.dynamic_weight_channels),
    )


def scalar_only_summary(
    files: Sequence[Path],
    scalars: ScalarSeries | None,
    weights: Mapping[str, float],
    *,
    algorithm: str,
    device: str,
) -> RunSummary:
    """The summary of a run that logged scalars only: its channels come from the per-channel reward series."""
    steps, first, last = scalars.step_span() if scalars is not None else (0, None, None)
    return RunSummary(
        sources=tuple(str(f) for f in files),
        steps=steps,
        rollouts=0,
        groups=0,
        group_size_min=0,
        group_size_max=0,
        first_step=first,
        last_step=last,
        channels=scalars.channels if scalars is not None else (),
        weights=dict(weights),
        algorithm=algorithm,
        algorithm_source="no rollouts (scalar log only)",
        logged_advantage=False,
        device=device,
    )


def with_scalar_log(
    summary: RunSummary, scalars: ScalarSeries | None, *, name: str | None, has_rollouts: bool
) -> RunSummary:
    """The summary with the run's name and the scalar log's share: points, framework, sources, notes."""
    changes: dict[str, Any] = {"name": name}
    if scalars is not None:
        warnings = list(summary.warnings) + scalars.notes
        if scalars.framework is None:
            shown = ", ".join(scalars.raw_tags[:8]) + (" ..." if len(scalars.raw_tags) > 8 else "")
            warnings.append(
                f"scalar log: no TRL, verl, OpenRLHF or NeMo-RL tags recognised (tags: {shown}); "
                "the CD5xx detectors had nothing to read"
            )
        changes |= {"scalar_points": scalars.points, "scalar_framework": scalars.framework, "warnings": tuple(warnings)}
        if has_rollouts:
            known = set(summary.sources)
            changes["sources"] = summary.sources + tuple(str(p) for p in scalars.sources if str(p) not in known)
    return replace(summary, **changes)


def with_signal(summary: RunSummary, series: RunSeries) -> RunSummary:
    """The summary with its signal budget under the run's algorithm (an unknown one is judged as GRPO)."""
    algorithm = family_of(summary.algorithm)
    budget = signal_budget(series, algorithm) if summary.rollouts else None
    if budget is None:
        return replace(summary, signal=None, counterfactuals=None)
    signal = budget.to_dict()
    if summary.algorithm not in ("grpo", "gdpo", "unknown"):
        # the run's own estimator (RLOO, pass@k, ...), judged with its family's group rule
        note = budget_note(summary.algorithm)
        signal |= {"estimator": summary.algorithm} | ({"note": note} if note else {})
    return replace(summary, signal=signal, counterfactuals=counterfactual_table(series, summary.algorithm))


STATE_SHARE = 0.5
"""A channel is at its ceiling (floor) when it is constant at its run-wide maximum (minimum) in this share of the
groups where it has two or more values, over the last 10% of steps; sparse when it applies to fewer rollouts."""


def _states(series: RunSeries, tail: slice) -> list[dict[str, Any]]:
    ceiling, floor, _ = channel_extreme_shares(series, tail)
    applies = applies_share(series)
    varies = 1.0 - series["channel_zero_var_share"]
    out = []
    for k in range(len(series.channels)):
        state = "ranking"
        if applies[k] < STATE_SHARE:
            state = "sparse"
        elif ceiling[k] >= STATE_SHARE:
            state = "ceiling"
        elif floor[k] >= STATE_SHARE:
            state = "floor"
        finite = varies[:, k][np.isfinite(varies[:, k])]
        out.append(
            {
                "state": state,
                "ceiling_share": float(ceiling[k]),
                "floor_share": float(floor[k]),
                "applies_share": float(applies[k]),
                "never_ranked": bool(float(np.max(finite, initial=0.0)) < STATE_SHARE),
            }
        )
    return out


def channel_table(
    summary: RunSummary, series: RunSeries, scalars: ScalarSeries | None, config: Config
) -> tuple[dict[str, Any], ...]:
    """Per channel: weight, rel_gain peak -> now, variance share, constant-group share, reward mean.

    The peak is taken on rel_gain smoothed the way the detectors smooth it (a rolling median over
    half the persistence window), so it matches CD101's message; "now" is the median of the last
    10% of steps. A scalar-only run fills the rows from its per-channel reward series.
    """
    if "rel_gain" not in series:
        return _scalar_channel_table(summary, scalars)
    rows = _channel_rows(summary, series, config)
    if series.from_callback_scalars:  # the scalar log's own columns too (reward std at its peak and now)
        logged = _scalar_channel_table(summary, scalars)
        rows = tuple(
            row | {k: v for k, v in more.items() if k not in row} for row, more in zip(rows, logged, strict=True)
        )
    return rows


def _channel_rows(summary: RunSummary, series: RunSeries, config: Config) -> tuple[dict[str, Any], ...]:
    """The channel table's rows from per-step series (the rollouts', or those rebuilt from the callback's)."""
    rows = []
    n = series.num_steps
    tail = slice(max(0, n - max(1, n // 10)), n)
    smoothing = max(1, config.persistence_steps(n) // 2) | 1  # as the detectors see it (CD101)
    states = _states(series, tail)
    for k, channel in enumerate(series.channels):
        raw = series["rel_gain"][:, k]
        peak, peak_step = finite_peak(rolling(raw, smoothing), series.steps)
        rows.append(
            {
                "channel": channel,
                "weight": summary.weights.get(channel, 1.0),
                "rel_gain_peak": peak,
                "rel_gain_peak_step": peak_step,
                "rel_gain_now": nanmedian(raw[tail]),
                "signal_share_grpo": nanmedian(series["signal_share_grpo"][tail, k]),
                "signal_share_gdpo": nanmedian(series["signal_share_gdpo"][tail, k]),
                "zero_variance_share": nanmedian(series["channel_zero_var_share"][tail, k]),
                "reward_mean": nanmedian(series["reward_mean"][tail, k]),
            }
            | states[k]
        )
    return tuple(rows)


def _tail_median(values: np.ndarray) -> float | None:
    if not len(values):
        return None
    tail = values[len(values) - max(1, len(values) // 10) :]
    finite = tail[np.isfinite(tail)]
    return float(np.median(finite)) if len(finite) else None


def _peak(points: Any) -> tuple[float | None, int | None]:
    if points is None or not np.isfinite(points.values).any():
        return None, None
    at = int(np.nanargmax(points.values))
    return float(points.values[at]), int(points.steps[at])


def _scalar_channel_table(summary: RunSummary, scalars: ScalarSeries | None) -> tuple[dict[str, Any], ...]:
    """Channel rows of a scalar-only run: reward mean now and reward std at its peak and now.

    A collapse-doctor retrain log adds rel_gain at its peak and now and the share of constant groups.
    """
    rows = []
    for channel in summary.channels:
        mean = scalars.get(S.CHANNEL_MEAN + channel) if scalars is not None else None
        std = scalars.get(S.CHANNEL_STD + channel) if scalars is not None else None
        rel = scalars.get(S.CHANNEL_REL_GAIN + channel) if scalars is not None else None
        constant = scalars.get(S.CHANNEL_ZERO_VAR_SHARE + channel) if scalars is not None else None
        peak, peak_step = _peak(std)
        rel_peak, rel_peak_step = _peak(rel)
        rows.append(
            {
                "channel": channel,
                "weight": summary.weights.get(channel, 1.0),
                "rel_gain_peak": rel_peak,
                "rel_gain_peak_step": rel_peak_step,
                "rel_gain_now": _tail_median(rel.values) if rel is not None else None,
                "signal_share_grpo": None,
                "signal_share_gdpo": None,
                "zero_variance_share": _tail_median(constant.values) if constant is not None else None,
                "reward_mean": _tail_median(mean.values) if mean is not None else None,
                "reward_std_peak": peak,
                "reward_std_peak_step": peak_step,
                "reward_std_now": _tail_median(std.values) if std is not None else None,
            }
        )
    return tuple(rows)
