"""The per-channel series rebuilt from the TRL callback's scalars (judge.logged_channels), on hand-built logs.

Expected values follow from what each logged scalar means (docs/integrations.md), not from the builder."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_doctor.core import scalars as S
from collapse_doctor.core.scalars import ScalarSeries, TagPoints
from collapse_doctor.judge.budget import applies_share, channel_extreme_shares
from collapse_doctor.judge.logged_channels import (
    NEEDED,
    callback_channel_series,
    logged_aggregation,
    logged_weights,
)

STEPS = np.array([2, 4, 6])


def callback_log(channels: tuple[str, ...] = ("a", "b"), *, gdpo: float = 0.0, **extra: TagPoints) -> ScalarSeries:
    """What the callback logs every 2 steps for ``channels``: each needed series with values 0.1 * channel index +
    0.01 * point index, groups 4 (ceiling and floor shares as written), and TRL's own mean at every step."""
    series: dict[str, TagPoints] = {S.AGGREGATION_GDPO: TagPoints(STEPS, np.full(3, gdpo))}
    for k, channel in enumerate(channels):
        for prefix in NEEDED:
            series[prefix + channel] = TagPoints(STEPS, 0.1 * k + 0.01 * np.arange(3))
        series[S.CHANNEL_GROUPS + channel] = TagPoints(STEPS, np.full(3, 4.0))
        series[S.CHANNEL_WEIGHT + channel] = TagPoints(STEPS, np.array([1.0, 1.0, 0.5 + k]))
        series[S.CHANNEL_MEAN + channel] = TagPoints(np.arange(1, 7), np.arange(1.0, 7.0) + 10 * k)
    series.update(extra)
    return ScalarSeries(framework="trl", series=series, tags={}, points=sum(len(p.steps) for p in series.values()))


def test_the_series_sit_on_the_callbacks_steps_under_the_logged_aggregation() -> None:
    log = callback_log()
    series = callback_channel_series(log, "grpo")
    assert series is not None and series.from_callback_scalars
    assert series.steps.tolist() == [2, 4, 6] and series.channels == ("a", "b")
    np.testing.assert_allclose(series["signal_share_grpo"][:, 1], [0.1, 0.11, 0.12])
    np.testing.assert_allclose(series["dominance_grpo"][:, 0], [0.0, 0.01, 0.02])
    assert np.isnan(series["signal_share_gdpo"]).all() and np.isnan(series["dominance_gdpo"]).all()
    # TRL's per-step mean: the mean of the steps each logged point covers ((1+2)/2, (3+4)/2, (5+6)/2)
    np.testing.assert_allclose(series["reward_mean"][:, 0], [1.5, 3.5, 5.5])
    np.testing.assert_allclose(series["reward_mean"][:, 1], [11.5, 13.5, 15.5])
    assert np.isnan(series["reward_max"]).all()  # not logged: NaN, never a made-up value


def test_ceiling_floor_and_scored_shares_read_back_as_logged() -> None:
    """The groups at the ceiling are the logged share of the logged groups, and the shares over a window are the
    logged shares weighted by groups (the rollout path's pooled count)."""
    shares = TagPoints(STEPS, np.array([0.0, 0.5, 1.0]))
    log = callback_log(("a",), **{S.CHANNEL_CEILING_SHARE + "a": shares, S.CHANNEL_SCORED_SHARE + "a": shares})
    series = callback_channel_series(log, "gdpo")
    assert series is not None
    np.testing.assert_allclose(series["channel_at_max_groups"][:, 0], [0.0, 2.0, 4.0])
    ceiling, _, groups = channel_extreme_shares(series, slice(1, 3))
    assert ceiling[0] == pytest.approx(0.75) and groups[0] == 8  # (2 + 4) of 4 + 4 groups
    assert applies_share(series)[0] == pytest.approx(0.5)


def test_no_series_without_every_needed_scalar_for_every_channel() -> None:
    assert callback_channel_series(None, "grpo") is None
    full = callback_log()
    partial = dict(full.series)
    del partial[S.CHANNEL_DOMINANCE + "b"]  # a callback of an older version logged no dominance
    log = ScalarSeries(framework="trl", series=partial, tags={}, points=0)
    assert callback_channel_series(log, "grpo") is None
    trl_only = dict(full.series) | {S.CHANNEL_MEAN + "c": TagPoints(STEPS, np.ones(3))}  # a channel it did not see
    assert callback_channel_series(ScalarSeries(framework="trl", series=trl_only, tags={}, points=0), "grpo") is None


def test_the_logged_aggregation_and_weights() -> None:
    assert logged_aggregation(callback_log(gdpo=1.0)) == "gdpo"
    assert logged_aggregation(callback_log(gdpo=0.0)) == "grpo"
    switched = callback_log(**{S.AGGREGATION_GDPO: TagPoints(STEPS, np.array([0.0, 1.0, 1.0]))})
    assert logged_aggregation(switched) is None  # changed during the run: no single aggregation to judge under
    assert logged_aggregation(None) is None
    assert logged_weights(callback_log()) == {"a": 0.5, "b": 1.5}  # each channel's last value
