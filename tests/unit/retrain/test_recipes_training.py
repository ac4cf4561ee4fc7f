"""One tiny TRL run that crosses every recipe phase: the loss's advantages equal the recomputation in each phase.

Steps are TRL's (the first batch is step 1, as TRL, its trackers and the rollouts count it), and so are the
recipe's: step 1 trains GRPO on the summed rewards of `format` and `graded` (`sometimes` starts at step 3), steps
2-6 gdpo-dynamic at T=0.7 then T=0.3 (from step 4), `graded` counts only where `sometimes` >= 0.4, and a channel's
z-scores are clipped to +-1 only at steps where their spread exceeds 0.7. The run then resumes from its
checkpoint-6 for 2 more steps (7 and 8): the schedule and the EMA go on as if it had not stopped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer

from collapse_doctor.engine.advantages import (
    channel_advantage_std,
    dynamic_channel_weights,
    gdpo_advantages,
    group_zscores,
    grpo_advantages,
    update_std_ema,
)
from collapse_doctor.retrain.plan import RetrainOptions
from collapse_doctor.retrain.run import RetrainResult, run_retrain

pytestmark = pytest.mark.slow

CHANNELS = ("format", "graded", "sometimes")
WEIGHTS = {"format": 1.0, "graded": 0.5, "sometimes": 2.0}
STEPS = 6
RESUMED = 8
CONFIG = {
    "group_size": 4,
    "batch_size_prompts": 4,
    "learning_rate": 0.02,
    "reward_weight_max": 0.8,
    "advantage_clip": 1.0,
    "reward_weight_temperature": [[0, 0.7], [4, 0.3]],
    "hybrid_switch": 2,
    "channel_start": {"sometimes": 3},
    "condition": {"graded": "sometimes >= 0.4"},
    "advantage_clip_when_std_above": 0.7,
}


def graded(completions: list[str], **_: Any) -> list[float | None]:
    """A continuous reward that varies within groups (a hash of the text)."""
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


def sometimes(completions: list[str], **_: Any) -> list[float | None]:
    """Not applicable (None -> NaN) for a third of the completions."""
    return [None if len(c) % 3 == 0 else len(c) / 10 for c in completions]


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RetrainResult, list[torch.Tensor]]:
    root = tmp_path_factory.mktemp("recipes")
    config = root / "recipes.json"
    config.write_text(json.dumps(CONFIG))
    seen: list[torch.Tensor] = []
    original = GRPOTrainer._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        seen.append(inputs["advantages"].detach().clone())
        return original(self, model, inputs)

    GRPOTrainer._compute_loss = spy
    try:
        options = RetrainOptions(
            output_dir=root / "run",
            algo="gdpo-dynamic",
            demo=True,
            rewards=("format=format_tag", f"graded={__name__}:graded", f"sometimes={__name__}:sometimes"),
            weights=dict(WEIGHTS),
            config=config,
            max_completion_length=6,
            write_every=2,
            save_steps=3,
            overrides={"disable_tqdm": True, "report_to": []},
            max_steps=STEPS,
        )
        assert run_retrain(options, final_scan=False).steps == STEPS
        result = run_retrain(dataclasses.replace(options, max_steps=RESUMED, resume=True), final_scan=True)
    finally:
        GRPOTrainer._compute_loss = original
    return result, seen


def _rows(run: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(run / "rollouts")
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


def test_every_phase_trains_on_the_recomputed_advantages(recipe_run: tuple[RetrainResult, list[torch.Tensor]]) -> None:
    result, seen = recipe_run
    assert result.steps == RESUMED and result.resumed_from is not None
    rows = _rows(result.output_dir)
    assert len(seen) == RESUMED
    base = torch.tensor([WEIGHTS[c] for c in CHANNELS], dtype=torch.float64)
    ema = None  # continued across the resume: the checkpoint holds it
    for step in range(1, RESUMED + 1):
        at = rows["step"] == step
        raw_graded = rows["raw_reward/graded"][at]
        some = rows["reward/sometimes"][at]
        # eq. 8: `graded` counts only where `sometimes` >= 0.4 (NaN there: not met)
        expected_graded = np.where(np.nan_to_num(some, nan=-1.0) >= 0.4, raw_graded, 0.0)
        np.testing.assert_allclose(rows["reward/graded"][at], expected_graded, atol=0, rtol=0)
        rewards = torch.from_numpy(np.stack([rows[f"reward/{c}"][at] for c in CHANNELS], axis=1).astype(np.float32))
        groups = torch.from_numpy(rows["group_id"][at].astype(np.int64))
        active = torch.tensor([True, True, step >= 3])
        aggregation = "grpo" if step < 2 else "gdpo-dynamic"
        assert set(rows["aggregation"][at]) == {aggregation}
        assert set(rows["active_channels"][at]) == {"format,graded,sometimes" if step >= 3 else "format,graded"}
        if aggregation == "grpo":
            weights = torch.where(active, base, torch.zeros_like(base)).float()
            expected = grpo_advantages(rewards, groups, weights=weights)
        else:
            z = group_zscores(rewards, groups)
            clip = channel_advantage_std(z) > 0.7
            z = torch.where(clip, z.clamp(-1.0, 1.0), z)
            ema = update_std_ema(ema, channel_advantage_std(z), 0.05)
            temperature = 0.7 if step < 4 else 0.3
            assert set(rows["temperature"][at].tolist()) == {temperature}
            weights = torch.zeros(3)
            weights[active] = dynamic_channel_weights(
                ema[active], temperature=temperature, lower=0.1, upper=0.8, base_weights=base[active]
            ).float()
            expected = gdpo_advantages(rewards, groups, weights=weights, zscores=z)
        logged = np.stack([rows[f"weight/{c}"][at] for c in CHANNELS], axis=1)
        np.testing.assert_allclose(logged[0], weights.numpy(), atol=1e-6)
        np.testing.assert_allclose(rows["advantage"][at], expected.numpy(), atol=1e-5)
        # the loss saw exactly these (shuffled within the batch)
        np.testing.assert_allclose(np.sort(seen[step - 1].numpy()), np.sort(rows["advantage"][at]), atol=1e-6)
    assert np.abs(rows["advantage"]).max() > 0.1, "some groups carry signal"


def test_the_switch_points_reach_tensorboard_scan_and_the_checkpoint(
    recipe_run: tuple[RetrainResult, list[torch.Tensor]],
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from collapse_doctor.pipeline.scan import diagnose

    result, _ = recipe_run
    events = EventAccumulator(str(result.output_dir / "tensorboard"))
    events.Reload()
    per_channel = [e.value for e in events.Scalars("collapse_doctor/recipe/per_channel_normalization")]
    assert [e.step for e in events.Scalars("collapse_doctor/recipe/per_channel_normalization")] == list(range(1, 9))
    assert per_channel == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [e.value for e in events.Scalars("collapse_doctor/recipe/active/sometimes")] == [0, 0, 1, 1, 1, 1, 1, 1]
    temperatures = [round(e.value, 6) for e in events.Scalars("collapse_doctor/recipe/temperature")]
    assert temperatures[1:] == [0.7, 0.7, 0.3, 0.3, 0.3, 0.3, 0.3] and np.isnan(temperatures[0])
    assert {f"collapse_doctor/recipe/clipped/{c}" for c in CHANNELS} <= set(events.Tags()["scalars"])
    diagnosis = diagnose([result.output_dir / "rollouts"])
    assert diagnosis.run.channels == CHANNELS
    assert diagnosis.run.dynamic_weight_channels == CHANNELS, "the per-step weights (0 before a start) are seen"
    state = json.loads((result.output_dir / "checkpoint-3" / "collapse_doctor_schedule.json").read_text())
    assert state["channels"] == list(CHANNELS) and len(state["ema"]) == 3


def test_the_final_scan_judges_each_phase_under_its_own_aggregation(
    recipe_run: tuple[RetrainResult, list[torch.Tensor]],
) -> None:
    """The rollouts' ``aggregation`` column records the switch at step 2: the scan of the output sees two phases
    (GRPO on step 1, then gdpo-dynamic, judged as GDPO), not one aggregation for the whole run."""
    from collapse_doctor.core.result import Phase

    result, _ = recipe_run
    assert result.diagnosis is not None
    assert result.diagnosis.run.phases == (Phase(1, 1, "grpo"), Phase(2, RESUMED, "gdpo"))
    assert result.diagnosis.run.algorithm == "gdpo"
