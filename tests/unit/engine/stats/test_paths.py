"""The dense fast path agrees with the general path, is only taken for its layout, and hand-checked values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import ChunkInput, dense_group_size, step_statistics
from tests.helpers.stats_cases import make_case

EXACT = (
    "valid_rows",
    "eligible_groups",
    "channel_rows",
    "channel_groups",
    "channel_at_max_groups",
    "channel_at_min_groups",
    "reward_max",
    "reward_min",
    *(f"{key}_{a}" for a in ("grpo", "gdpo") for key in ("silent_groups", "zero_adv_rows", "all_pass_groups")),
    "all_fail_groups_grpo",
    "all_fail_groups_gdpo",
    "outlier_group_share",
    "outlier_lone_share",
    "differing_pairs",
    "tied_pair_share",
    "tied_pair_share_gdpo",
    "corr_rows",
    "corr_groups",
    *(
        f"{key}_{a}"
        for a in ("grpo", "gdpo")
        for key in ("silent_identical_groups", "identical_pass_groups", "identical_fail_groups", "silent_cancel_groups")
    ),
    "completion_groups",
    "identical_completion_groups",
    "distinct_completion_share",
    "equal_reward_groups",
    "equal_reward_distinct_groups",
    "completion_length_mean",
    "completion_length_max",
)
"""Counts (and shares of counts) that both paths must give bit for bit."""


def _chunk(rewards: np.ndarray, group_size: int, groups_per_step: list[int], logged: bool = False) -> ChunkInput:
    n = rewards.shape[0]
    gi = torch.arange(n) // group_size
    si = torch.repeat_interleave(torch.arange(len(groups_per_step)), torch.tensor(groups_per_step) * group_size)
    r = torch.from_numpy(rewards.astype(np.float32))
    w = torch.tensor([1.0, 0.5, 2.0][: r.shape[1]])
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    log = adv.grpo * 1.5 if logged else None
    return ChunkInput(r, gi, si, w, adv, int(gi.max()) + 1, len(groups_per_step), log)


def _data(seed: int, n: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    columns = [rng.integers(0, 2, n).astype(float), rng.random(n), np.round(rng.normal(0, 1, n), 1)]
    data = np.stack(columns[:channels], axis=1)
    data[: 8 * 3] = 1.0  # some constant groups
    data[40:48, -1] = 0.25  # a constant channel in one group
    data[n // 2] += 25.0  # an outlier
    return data


@pytest.mark.parametrize(("group_size", "channels"), [(8, 3), (4, 2), (16, 1)])
def test_dense_path_matches_general_path(group_size: int, channels: int) -> None:
    steps = [5, 7, 4]
    rewards = _data(group_size, sum(steps) * group_size, channels)
    chunk = _chunk(rewards, group_size, steps, logged=True)
    assert dense_group_size(chunk) == group_size
    dense = step_statistics(chunk)
    general = step_statistics(chunk, allow_dense=False)
    assert list(dense) == list(general)
    for key in EXACT:
        if key in general:
            np.testing.assert_array_equal(dense[key], general[key], err_msg=key)
    for key in general:
        np.testing.assert_allclose(dense[key], general[key], rtol=2e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize(
    ("group_size", "channels", "weights"), [(8, 3, None), (5, 3, [1.0, 0.5, -1.0]), (2, 2, None), (64, 1, None)]
)
def test_the_scans_dense_engine_matches_the_torch_path(group_size: int, channels: int, weights: list | None) -> None:
    """What a scan runs (``DenseChunk.from_rows``: NumPy computes the advantages too) against the torch engine and
    the general statistics: the counts bit for bit, the rest to float32 rounding. With weights (1, 0.5, -1) the
    third channel is ``1 - first``: the two contribute mathematically equal magnitudes, which the engines round
    differently, so only the dominance tie tolerance lets the same (first) channel decide in both."""
    from collapse_doctor.engine.stats import DenseChunk

    steps = [5, 7, 4]
    rewards = _data(group_size + 100, sum(steps) * group_size, channels)
    if weights is not None:
        rewards[:, 0] = np.random.default_rng(3).random(rewards.shape[0]).astype(np.float32)
        rewards[:, 2] = 1 - rewards[:, 0]
    chunk = _chunk(rewards, group_size, steps, logged=True)
    if weights is not None:
        w = torch.tensor(weights)
        adv = compute_advantages(chunk.rewards, chunk.group_index, weights=w, step_index=chunk.step_index)
        chunk = ChunkInput(chunk.rewards, chunk.group_index, chunk.step_index, w, adv, *(chunk.num_groups, 3), adv.grpo)
    scan = DenseChunk.from_rows(
        chunk.rewards.numpy(),
        group_size,
        chunk.step_index.numpy(),
        chunk.weights.tolist(),
        chunk.num_steps,
        None if chunk.logged is None else chunk.logged.numpy(),
    )
    dense = step_statistics(scan)
    general = step_statistics(chunk, allow_dense=False)
    assert list(dense) == list(general)
    for key in [*EXACT, "dominance_grpo", "dominance_gdpo"]:
        if key in general:
            np.testing.assert_array_equal(dense[key], general[key], err_msg=key)
    for key in general:
        np.testing.assert_allclose(dense[key], general[key], rtol=2e-5, atol=1e-6, err_msg=key)
    rows = scan.row_advantages()
    for got, want in ((rows.grpo, chunk.advantages.grpo), (rows.gdpo, chunk.advantages.gdpo)):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)


def test_dense_path_matches_general_path_on_the_cases() -> None:
    # The statistics cases: lone and heavy outliers, groups at the step's extremes, a logged advantage with NaN.
    dense, general = make_case("dense", logged=True), make_case("dense-as-general", logged=True)
    assert list(dense.stats) == list(general.stats)
    for key in EXACT:
        np.testing.assert_array_equal(dense.stats[key], general.stats[key], err_msg=key)
    for key, value in general.stats.items():
        scale = np.nanmax(np.abs(value)) if key.startswith("wfit_") else 1.0
        np.testing.assert_allclose(dense.stats[key], value, rtol=2e-5, atol=1e-6 * scale, err_msg=key)


def test_dense_path_is_not_used_for_other_layouts() -> None:
    rewards = _data(0, 64, 2)
    chunk = _chunk(rewards, 8, [8])
    nan_rewards = rewards.copy()
    nan_rewards[3, 1] = np.nan
    assert dense_group_size(_chunk(nan_rewards, 8, [8])) is None
    shuffled = ChunkInput(
        chunk.rewards, chunk.group_index.flip(0), chunk.step_index, chunk.weights, chunk.advantages, 8, 1
    )
    assert dense_group_size(shuffled) is None


def test_known_values() -> None:
    # One step, two groups of 4: channel a is constant in group 0; totals tie in group 1.
    rewards = np.array(
        [[1, 0], [1, 1], [1, 0], [1, 1], [1, 0], [0, 1], [0, 0], [1, 1]],
        dtype=float,
    )
    r = torch.from_numpy(rewards.astype(np.float32))
    gi = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    si = torch.zeros(8, dtype=torch.int64)
    w = torch.ones(2)
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    for allow_dense in (True, False):
        st = step_statistics(ChunkInput(r, gi, si, w, adv, 2, 1), allow_dense=allow_dense)
        assert st["rel_gain"].tolist() == [[0.5, 1.0]]  # a: (0 + 1) / 2 groups, b: 1 in both
        assert st["channel_zero_var_share"].tolist() == [[0.5, 0.0]]
        # group 1 pairs: (1,0)-(0,1) tie with different vectors; 6 pairs per group, (1,1)/(1,1) identical
        # in group 0 twice ((1,0),(1,0) and (1,1),(1,1)); group 1 has no identical pair.
        assert st["differing_pairs"].tolist() == [4 + 6]
        assert st["tied_pair_share"].tolist() == [0.1]
        assert st["zero_var_share"].tolist() == [0.0]
