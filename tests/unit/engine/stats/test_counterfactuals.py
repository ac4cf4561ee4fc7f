"""The counterfactual counts across estimators, against answers that follow from the estimators' definitions and
against loops written here."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_doctor.core.estimators import COUNTERFACTUAL_KEYS
from collapse_doctor.engine.estimators import RECOMPUTE, EstimatorRows
from collapse_doctor.engine.stats import step_statistics
from collapse_doctor.engine.stats.counterfactuals import SAMPLE_GROUPS, _parts, sampled_groups
from collapse_doctor.engine.stats.dense import CompletionRows, DenseChunk


def _chunk(rewards: np.ndarray, g: int, step: np.ndarray, weights: list[float], lengths: np.ndarray | None = None):
    completions = None if lengths is None else CompletionRows(lengths=lengths.astype(np.float64), tokens=True)
    return DenseChunk.from_rows(rewards, g, step, weights, int(step.max()) + 1, completions=completions)


def test_the_sample_is_every_group_of_a_small_step_and_evenly_spaced_groups_of_a_large_one() -> None:
    steps = np.repeat([0, 1], [10, 1000])
    kept = sampled_groups(steps, 2)
    assert kept[:10].tolist() == list(range(10))
    large = kept[10:] - 10
    assert len(large) == SAMPLE_GROUPS
    assert large.tolist() == [i * 1000 // SAMPLE_GROUPS for i in range(SAMPLE_GROUPS)]


def test_a_step_gives_the_same_counts_alone_or_in_a_chunk_with_others() -> None:
    # Every entry point reduces whole steps, in chunks of different sizes: the sample is the step's own.
    rng = np.random.default_rng(3)
    g, groups = 4, 100
    rewards = (rng.random((3 * groups * g, 2)) < 0.5).astype(np.float32)
    step = np.repeat(np.arange(3), groups * g)
    whole = step_statistics(_chunk(rewards, g, step, [1.0, 1.0]))
    for s in range(3):
        rows = step == s
        alone = step_statistics(_chunk(rewards[rows], g, np.zeros(rows.sum(), dtype=np.int64), [1.0, 1.0]))
        for name, values in alone.items():
            if name.startswith("cf_"):
                np.testing.assert_array_equal(values[0], whole[name][s], err_msg=name)


def test_complementary_channels_leave_every_estimator_silent() -> None:
    # B = 1 - A on every row with equal weights: every total is 1, so every estimator that centres the total (on
    # the group or on the step) gives 0; GDPO's z-scores cancel (z_B = -z_A); pass@k's best and second tie at 1.
    rng = np.random.default_rng(0)
    a = (rng.random(8 * 40) < 0.5).astype(np.float32)
    rewards = np.stack([a, 1 - a], axis=1)
    st = step_statistics(_chunk(rewards, 8, np.zeros(len(a), dtype=np.int64), [1.0, 1.0], np.full(len(a), 50)))
    for key in COUNTERFACTUAL_KEYS:
        assert st[f"cf_zero_rows_{key}"][0] == len(a), key
        assert st[f"cf_signal_rows_{key}"][0] == 0, key


def test_a_batch_baseline_gives_all_pass_groups_a_gradient_and_a_group_baseline_does_not() -> None:
    # Half the groups all-pass (every reward 1), half ranking (4 of 8 pass): under GRPO and every group-baseline
    # estimator the all-pass rows have advantage 0, the ranking rows +-; under REINFORCE++ (the step's mean, 0.75,
    # as baseline) every row differs from the baseline, so none is silent.
    g, groups = 8, 40
    ranking = np.tile([1, 1, 1, 1, 0, 0, 0, 0], groups // 2)
    rewards = np.concatenate([np.ones((groups // 2) * g), ranking]).astype(np.float32)[:, None]
    n = len(rewards)
    st = step_statistics(_chunk(rewards, g, np.zeros(n, dtype=np.int64), [1.0], np.full(n, 10)))
    for key in ("grpo", "gdpo", "rloo", "grpo_loo", "gpg", "opo"):
        assert st[f"cf_zero_rows_{key}"][0] == n / 2, key
    assert st["cf_zero_rows_reinforce_plus_plus"][0] == 0
    # pass@k: the best row of a ranking group ties with three others at 1 (lead 0): every row is silent
    assert st["cf_zero_rows_grpo_passk"][0] == n


def _loop_parts(rewards: np.ndarray, weights: np.ndarray, g: int, lengths: np.ndarray, key: str) -> np.ndarray:
    """``[N, C]`` each channel's part, group by group in plain loops (one step)."""
    n, channels = rewards.shape
    parts = np.zeros((n, channels))
    w_r = rewards * weights[None, :]
    for c in range(channels):
        col = w_r[:, c]
        if key in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            base = col.copy()
            if key == "reinforce_plus_plus_baseline":
                for start in range(0, n, g):
                    base[start : start + g] = col[start : start + g] - col[start : start + g].mean()
            parts[:, c] = base - (lengths * base).sum() / lengths.sum()
            continue
        for start in range(0, n, g):
            rows = slice(start, start + g)
            weight = lengths[rows] if key == "opo" else np.ones(g)  # OPO: a length-weighted mean
            baseline = (weight * col[rows]).sum() / weight.sum()
            parts[rows, c] = col[rows] - baseline
    return parts


@pytest.mark.parametrize(
    "key", ["grpo", "rloo", "grpo_loo", "gpg", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
def test_the_parts_are_the_loop_centring_and_sum_to_the_advantage_sign(key: str) -> None:
    rng = np.random.default_rng(7)
    g, groups = 6, 30
    rewards = rng.integers(0, 3, (g * groups, 3)).astype(np.float64) / 2
    weights = np.array([1.0, 0.5, 2.0])
    lengths = rng.integers(5, 60, g * groups).astype(np.float64)
    rows = EstimatorRows(rewards, weights, np.arange(g * groups) // g, np.zeros(g * groups), lengths, block=g)
    adv = RECOMPUTE[key](rows) if key != "grpo" else rows.centred
    parts, sign = _parts(rows)(key, adv)
    expected = _loop_parts(rewards, weights, g, lengths, key)
    np.testing.assert_allclose(np.stack(parts, axis=1), expected, atol=1e-9)
    # the estimator is a positive multiple of the summed parts on every row with a sign
    signed = np.abs(sign) > 1e-6
    np.testing.assert_array_equal(np.sign(np.sum(parts, axis=0))[signed], np.sign(sign)[signed])


def test_tied_pairs_are_counted_as_a_loop_counts_them() -> None:
    rng = np.random.default_rng(11)
    g, groups = 5, 60
    rewards = rng.integers(0, 2, (g * groups, 2)).astype(np.float32)
    n = len(rewards)
    st = step_statistics(_chunk(rewards, g, np.zeros(n, dtype=np.int64), [1.0, 1.0], np.full(n, 20)))
    rows = EstimatorRows(rewards, np.ones(2), np.arange(n) // g, np.zeros(n), np.full(n, 20.0), block=g)
    for key in ("rloo", "grpo_passk", "reinforce_plus_plus"):
        adv = RECOMPUTE[key](rows)
        differing = tied = 0
        for start in range(0, n, g):
            for i in range(start, start + g):
                for j in range(i + 1, start + g):
                    if (rewards[i] != rewards[j]).any():
                        differing += 1
                        tied += round(adv[i] / 1e-4) == round(adv[j] / 1e-4)
        assert st["cf_differing_pairs"][0] == differing
        assert st[f"cf_tied_pairs_{key}"][0] == tied, key


def test_opo_is_not_computed_without_lengths_and_reinforce_weights_rows_once() -> None:
    rewards = np.tile([[1.0], [0.0]], (40, 1)).astype(np.float32)
    st = step_statistics(_chunk(rewards, 2, np.zeros(80, dtype=np.int64), [1.0]))
    assert np.isnan(st["cf_zero_rows_opo"][0])
    assert st["cf_uniform"][0] == 1
    assert st["cf_signal_rows_reinforce_plus_plus"][0] == 80
