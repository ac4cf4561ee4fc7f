"""Tag maps: each framework's real tag names, written with SummaryWriter, become canonical series."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core import scalars as S
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.open import read_scalar_log
from tests.helpers.scalar_runs import write_events

N = 12
FRAMEWORK_TAGS = {
    "trl": {
        "train/rewards/format_reward/mean": S.CHANNEL_MEAN + "format_reward",
        "train/rewards/format_reward/std": S.CHANNEL_STD + "format_reward",
        "train/rewards/accuracy_reward/mean": S.CHANNEL_MEAN + "accuracy_reward",
        "train/rewards/accuracy_reward/std": S.CHANNEL_STD + "accuracy_reward",
        "train/reward": S.REWARD,
        "train/reward_std": S.REWARD_STD,
        "train/frac_reward_zero_std": S.ZERO_STD_SHARE,
        "train/kl": S.KL,
        "train/entropy": S.ENTROPY,
        "train/clip_ratio/region_mean": S.CLIP_RATIO,
        "train/clip_ratio/low_mean": S.CLIP_RATIO_LOW,
        "train/completions/mean_length": S.COMPLETION_LENGTH,
        "train/loss": S.LOSS,
        "train/grad_norm": S.GRAD_NORM,
        "eval/reward": S.EVAL_SCORE,
    },
    "verl": {
        "critic/score/mean": S.REWARD,
        "critic/rewards/mean": None,  # score (before the KL penalty) wins
        "critic/advantages/mean": S.ADVANTAGE_MEAN,
        "critic/advantages/max": S.ADVANTAGE_MAX,
        "critic/advantages/min": S.ADVANTAGE_MIN,
        "actor/entropy": S.ENTROPY,
        "actor/kl_loss": S.KL,
        "actor/pg_clipfrac": S.CLIP_RATIO,
        "actor/ppo_kl": None,
        "response_length/mean": S.COMPLETION_LENGTH,
        "gdpo/format/mean": S.CHANNEL_MEAN + "format",
        "gdpo/format/std": S.CHANNEL_STD + "format",
        "gdpo/correct/std": S.CHANNEL_STD + "correct",
        "gdpo/correct/max": S.CHANNEL_MAX + "correct",  # the batch max (ray_trainer.py, GDPO)
    },
    "openrlhf": {
        "train/reward": S.REWARD,
        "train/group_reward_std": S.REWARD_STD,
        "train/kl": S.KL,
        "train/policy_loss": S.LOSS,
        "train/ppo_clip_ratio": S.CLIP_RATIO,
        "train/response_length": S.COMPLETION_LENGTH,
        "rollout/reward_std": None,  # group_reward_std wins
        "train/dynamic_filtering_pass_rate": S.PASS_RATE,
    },
    "nemo_rl": {
        "train/reward": S.REWARD,
        "train/advantages/mean": S.ADVANTAGE_MEAN,
        "train/advantages/max": S.ADVANTAGE_MAX,
        "train/advantages/min": S.ADVANTAGE_MIN,
        "train/baseline_reward/pct_0": S.PCT_ALL_FAIL,
        "train/baseline_reward/pct_1": S.PCT_ALL_PASS,
        "train/baseline_reward/pct_mixed": None,
        "train/approx_entropy": S.ENTROPY,
        "train/kl_penalty": S.KL,
    },
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_TAGS))
def test_framework_is_detected_and_mapped(framework: str, tmp_path: Path) -> None:
    tags = FRAMEWORK_TAGS[framework]
    write_events(tmp_path / framework, {tag: np.full(N, 30.0) for tag in tags})
    scalars = read_scalar_log(discover_runs([tmp_path])[0])
    assert scalars is not None and scalars.framework == framework
    expected = {name: tag for tag, name in tags.items() if name is not None}
    assert {k: v for k, v in scalars.tags.items() if not v.startswith(("(", "1 - "))} == expected
    assert all(len(scalars.series[name].steps) == N for name in expected)


def test_derived_zero_std_share(tmp_path: Path) -> None:
    write_events(
        tmp_path / "nemo",
        {
            "train/reward": np.ones(N),
            "train/baseline_reward/pct_0": np.full(N, 30.0),
            "train/baseline_reward/pct_1": np.full(N, 45.0),
        },
    )
    write_events(
        tmp_path / "orl", {"train/group_reward_std": np.ones(N), "train/dynamic_filtering_pass_rate": np.full(N, 0.2)}
    )
    nemo, orl = (read_scalar_log(r) for r in sorted(discover_runs([tmp_path]), key=lambda r: r.name))
    assert nemo is not None and orl is not None
    np.testing.assert_allclose(nemo.series[S.ZERO_STD_SHARE].values, 0.75)
    np.testing.assert_allclose(orl.series[S.ZERO_STD_SHARE].values, 0.8, rtol=1e-6)


def test_trainer_state_json_is_a_scalar_source(tmp_path: Path) -> None:
    history = [
        {"step": s, "epoch": s / 10, "loss": 0.1, "reward": 0.5, "reward_std": 0.6 if s < 20 else 0.001, "kl": 0.01}
        for s in range(1, 41)
    ] + [{"step": 40, "eval_reward": 0.4}, {"train_runtime": 10.0, "step": 40}]
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(json.dumps({"log_history": history[:20]}))
    (tmp_path / "checkpoint-40").mkdir()
    (tmp_path / "checkpoint-40" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    diagnosis = diagnose([tmp_path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_framework == "trl"
    assert diagnosis.scalars is not None and diagnosis.scalars.tags[S.REWARD_STD] == "train/reward_std"
    assert len(diagnosis.scalars.series[S.REWARD_STD].steps) == 40
    assert [f.code for f in diagnosis.findings] == ["CD501"]


def test_verl_file_logger_jsonl(tmp_path: Path) -> None:
    lines = [
        {"step": s, "data": {"critic/score/mean": 0.5, "actor/entropy": 0.8 if s < 30 else 0.02, "timing_s/gen": 3}}
        for s in range(1, 61)
    ]
    path = tmp_path / "verl_metrics.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n" + '{"step": 61, "da')  # last line still open
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_framework == "verl"
    assert diagnosis.run.last_step == 60
    assert [f.code for f in diagnosis.findings] == ["CD503"]


def test_unknown_tags_are_a_warning(tmp_path: Path) -> None:
    write_events(tmp_path / "x", {"my/accuracy": np.ones(N)})
    diagnosis = diagnose([tmp_path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_framework is None and diagnosis.findings == ()
    assert any("no TRL, verl, OpenRLHF or NeMo-RL tags recognised" in w for w in diagnosis.run.warnings)


def test_the_monitors_series_are_read_with_or_without_the_trainers_prefix() -> None:
    """The callback's scalars go through the trainer's log: TensorBoard, W&B and Trackio get them as
    ``train/collapse_doctor/...``, MLflow as they are; both are the monitor's series."""
    from collapse_doctor.io.logs.tags import MONITOR, map_tags

    mapped = map_tags(
        ["train/collapse_doctor/rel_gain/fmt", "collapse_doctor/signal_share/fmt", "train/other/rel_gain/fmt"], MONITOR
    )
    assert mapped == {
        "channel_rel_gain/fmt": "train/collapse_doctor/rel_gain/fmt",
        "channel_signal_share/fmt": "collapse_doctor/signal_share/fmt",
    }
