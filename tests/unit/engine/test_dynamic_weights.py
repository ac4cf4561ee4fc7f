"""gdpo-dynamic weights: EMA of each channel's advantage std -> softmax -> bounded simplex; clipped fusion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapse_doctor.core.errors import UsageError
from collapse_doctor.engine.advantages import (
    bounded_simplex,
    channel_advantage_std,
    clipped_channel_advantages,
    dynamic_channel_weights,
    dynamic_gdpo_advantages,
    dynamic_weight_schedule,
    gdpo_advantages,
    group_zscores,
    update_std_ema,
)
from collapse_doctor.retrain.dynamic import DynamicWeighting


def _saturating_run(steps: int = 60, groups: int = 16, size: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """Three channels; `format` is right for a growing share of samples until every sample gets it."""
    rng = np.random.default_rng(seed)
    batches = []
    for s in range(steps):
        p_format = min(1.0, 0.5 + s / 30)
        n = groups * size
        rewards = np.stack(
            [
                (rng.random(n) < p_format).astype(np.float32),
                (rng.random(n) < 0.4).astype(np.float32),
                rng.random(n).astype(np.float32),
            ],
            axis=1,
        )
        batches.append(torch.from_numpy(rewards))
    return batches


def test_saturating_channel_weight_falls_over_steps() -> None:
    dw = DynamicWeighting(("format", "correct", "judge"), base_weights=(1.0, 1.0, 1.0))
    weights = []
    for rewards in _saturating_run():
        _, w = dw.step(rewards, group_size=8)
        weights.append(w.tolist())
    w = np.array(weights)
    # format saturates from step 15 on: its weight falls and ends at the lower bound's neighbourhood
    assert w[-1, 0] < w[10, 0] < w[0, 0] + 1e-6
    assert w[-1, 0] == pytest.approx(0.1, abs=0.05)
    # over the saturated stretch it never rises
    assert np.all(np.diff(w[16:, 0]) <= 1e-6)
    # the channels that still rank samples keep (and gain) their say
    assert w[-1, 1] > w[0, 1] and w[-1, 2] > w[0, 2]
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-5)
    assert (w >= 0.1 - 1e-6).all() and (w <= 0.5 + 1e-6).all()


def test_inverse_std_snippet_would_do_the_opposite() -> None:
    """The circulated snippet (softmax of 1/std) gives the saturated channel the most weight; ours the least."""
    ema = torch.tensor([0.05, 1.0, 1.0])
    snippet = torch.softmax((1.0 / ema) / 0.5, dim=0)
    ours = dynamic_channel_weights(ema)
    assert snippet.argmax() == 0
    assert ours.argmin() == 0


def test_schedule_matches_stepwise_updates() -> None:
    batches = _saturating_run(steps=20)
    dw = DynamicWeighting(("a", "b", "c"), base_weights=(1.0, 1.0, 1.0))
    stepwise = torch.stack([dw.step(r, group_size=8)[1] for r in batches])
    stds = torch.stack(
        [
            channel_advantage_std(clipped_channel_advantages(group_zscores(r, torch.arange(len(r)) // 8)))
            for r in batches
        ]
    )
    schedule = dynamic_weight_schedule(stds)
    torch.testing.assert_close(stepwise, schedule.float(), atol=1e-6, rtol=0)


def test_ema_first_observation_and_nan() -> None:
    ema = update_std_ema(None, torch.tensor([0.8, 0.2]))
    assert ema.tolist() == pytest.approx([0.8, 0.2])
    ema = update_std_ema(ema, torch.tensor([0.0, float("nan")]), alpha=0.05)
    assert ema.tolist() == pytest.approx([0.76, 0.2])
    with pytest.raises(UsageError):
        update_std_ema(ema, ema, alpha=0.0)


@pytest.mark.parametrize("seed", range(20))
def test_bounded_simplex_respects_bounds(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    c = int(torch.randint(3, 8, (1,), generator=g))
    w = torch.rand(c, generator=g) ** 4
    out = bounded_simplex(w, 0.1, 0.5)
    assert float(out.sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(out.min()) >= 0.1 - 1e-6 and float(out.max()) <= 0.5 + 1e-6
    # order is kept: a larger input never gets a smaller weight
    order = torch.argsort(w)
    assert torch.all(out[order][1:] >= out[order][:-1] - 1e-6)


def test_bounded_simplex_infeasible_falls_back_to_clamp_and_renormalize() -> None:
    out = bounded_simplex(torch.tensor([1.0]), 0.1, 0.5)
    assert out.tolist() == pytest.approx([1.0])
    out = bounded_simplex(torch.tensor([0.9, 0.05, 0.05]), 0.1, 0.2)  # 3 * 0.2 < 1
    assert float(out.sum()) == pytest.approx(1.0)


def test_weights_follow_the_spread_and_temperature() -> None:
    ema = torch.tensor([1.0, 0.5, 0.0])
    sharp = dynamic_channel_weights(ema, temperature=0.1, lower=0.0, upper=1.0)
    soft = dynamic_channel_weights(ema, temperature=10.0, lower=0.0, upper=1.0)
    assert sharp[0] > sharp[1] > sharp[2]
    assert float(soft.max() - soft.min()) < float(sharp.max() - sharp.min())
    with pytest.raises(UsageError):
        dynamic_channel_weights(ema, temperature=0.0)


def test_base_weights_scale_the_softmax() -> None:
    ema = torch.tensor([1.0, 1.0, 1.0])
    w = dynamic_channel_weights(ema, base_weights=torch.tensor([2.0, 1.0, 1.0]), lower=0.0, upper=1.0)
    assert w.tolist() == pytest.approx([0.5, 0.25, 0.25])


def test_clip_limits_each_channel_before_fusion() -> None:
    # one outlier in a big group: its z-score exceeds 2 and is clipped
    rewards = torch.tensor([[0.0]] * 15 + [[10.0]])
    group = torch.zeros(16, dtype=torch.int64)
    z = group_zscores(rewards, group)
    assert float(z.max()) > 2.0
    assert float(clipped_channel_advantages(z).max()) == 2.0
    # a clip nothing reaches gives plain GDPO
    r = torch.rand(32, 3, generator=torch.Generator().manual_seed(1))
    g = torch.arange(32) // 8
    w = torch.tensor([0.5, 0.3, 0.2])
    torch.testing.assert_close(dynamic_gdpo_advantages(r, g, weights=w, clip=100.0), gdpo_advantages(r, g, weights=w))


def test_channel_std_ignores_nan_and_constant_channels_give_zero() -> None:
    z = torch.tensor([[1.0, 0.0, float("nan")], [-1.0, 0.0, 1.0], [1.0, 0.0, float("nan")]])
    std = channel_advantage_std(z)
    assert std[1] == 0.0 and std[2] == 0.0
    assert float(std[0]) == pytest.approx(float(torch.tensor([1.0, -1.0, 1.0]).std()))
