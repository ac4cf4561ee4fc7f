"""Trainer key maps beyond TRL: verl's per-reward GDPO series and filter_groups counts, NeMo-RL's reward components
and dynamic sampling, OpenRLHF's pass rate (in percent), read into the canonical channel and share series."""

from __future__ import annotations

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.io.logs.tags import detect_framework, map_tags, scalar_series


def points(steps: list[int], values: list[float]) -> TagPoints:
    return TagPoints(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))


def test_verl_gdpo_per_reward_keys_become_channels() -> None:
    tags = ["gdpo/format/mean", "gdpo/format/std", "gdpo/format/max", "gdpo/format/min", "critic/score/mean"]
    assert detect_framework(tags) == "verl"
    assert map_tags(tags, "verl") == {
        S.CHANNEL_MAX + "format": "gdpo/format/max",
        S.CHANNEL_MEAN + "format": "gdpo/format/mean",
        S.CHANNEL_MIN + "format": "gdpo/format/min",
        S.CHANNEL_STD + "format": "gdpo/format/std",
        S.REWARD: "critic/score/mean",
    }


def test_verl_filter_groups_counts_are_zero_where_verl_logged_none_and_give_the_filtered_share() -> None:
    steps = [1, 2, 3, 4]
    raw = {
        "critic/score/mean": points(steps, [0.5] * 4),
        # replay_buffer.py writes the keys only at steps where some group was dropped
        "training/filter_groups/evicted_samples": points([1, 3], [24.0, 8.0]),
        "training/filter_groups/discarded_surplus_samples": points([3], [4.0]),
        "collapse_doctor/trained_groups": points(steps, [16.0] * 4),
    }
    scalars = scalar_series(raw, points=11)
    assert scalars.framework == "verl"
    np.testing.assert_array_equal(scalars.series[S.FILTERED_GROUPS].values, [24, 0, 8, 0])
    np.testing.assert_array_equal(scalars.series[S.SURPLUS_GROUPS].values, [0, 0, 4, 0])
    np.testing.assert_allclose(scalars.series[S.ZERO_STD_SHARE].values, [24 / 40, 0, 8 / 28, 0])
    assert scalars.tags[S.ZERO_STD_SHARE].startswith("training/filter_groups/evicted_samples / (")
    (note,) = scalars.notes
    assert "32 groups dropped as constant over 4 steps (8.0 per step)" in note
    assert "4 more generated beyond the batch and discarded" in note
    assert f"{36 / (36 + 64):.0%} of the generated groups never trained" in note


def test_verl_filter_groups_without_the_trained_batch_size_report_counts_only() -> None:
    raw = {
        "critic/score/mean": points([1, 2], [0.5, 0.5]),
        "training/filter_groups/evicted_samples": points([2], [6.0]),
    }
    scalars = scalar_series(raw, points=3)
    assert S.ZERO_STD_SHARE not in scalars
    (note,) = scalars.notes
    assert "6 groups dropped as constant over 2 steps" in note and "never trained" not in note


def test_openrlhf_pass_rate_is_in_percent() -> None:
    """OpenRLHF filter_hooks.py: ``valid_groups / total_groups * 100``."""
    raw = {"train/dynamic_filtering_pass_rate": points([1, 2], [80.0, 40.0]), "train/policy_loss": points([1], [0.1])}
    scalars = scalar_series(raw, points=3)
    assert scalars.framework == "openrlhf"
    np.testing.assert_allclose(scalars.series[S.ZERO_STD_SHARE].values, [0.2, 0.6])
    assert scalars.tags[S.ZERO_STD_SHARE] == "1 - train/dynamic_filtering_pass_rate / 100"
    (note,) = scalars.notes
    assert "40% of the generated groups were dropped by the filter" in note


def test_a_pass_rate_logged_as_a_fraction_still_reads() -> None:
    raw = {"train/dynamic_filtering_pass_rate": points([1, 2], [0.8, 0.4]), "train/policy_loss": points([1], [0.1])}
    scalars = scalar_series(raw, points=3)
    np.testing.assert_allclose(scalars.series[S.ZERO_STD_SHARE].values, [0.2, 0.6])
    assert scalars.tags[S.ZERO_STD_SHARE] == "1 - train/dynamic_filtering_pass_rate"


def test_nemo_rl_reward_components_and_dynamic_sampling() -> None:
    raw = {
        "train/reward": points([1, 2], [1.0, 1.2]),
        "train/reward/correctness": points([1, 2], [0.4, 0.5]),
        "train/baseline_reward/pct_0": points([1, 2], [10.0, 10.0]),
        "train/dynamic_sampling_num_gen_batches": points([1, 2], [2.0, 4.0]),
    }
    scalars = scalar_series(raw, points=8)
    assert scalars.framework == "nemo_rl"
    assert scalars.channels == ("correctness",)
    assert scalars.tags[S.GEN_BATCHES] == "train/dynamic_sampling_num_gen_batches"
    (note,) = scalars.notes
    assert "3.00 generation batches per trained batch" in note  # 1 - 1/2 and 1 - 1/4: 62% never trained
    assert "62% of the generated groups never trained" in note


def test_a_run_without_dynamic_sampling_has_no_note() -> None:
    raw = {"critic/score/mean": points([1, 2], [0.5, 0.6]), "actor/entropy": points([1, 2], [1.0, 1.0])}
    assert scalar_series(raw, points=4).notes == []
