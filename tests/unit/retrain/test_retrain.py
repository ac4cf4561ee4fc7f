"""Integration tests of ``retrain`` on TRL's GRPOTrainer with the built-in tiny model (CPU, a few steps).

The parity tests capture the advantages TRL's loss actually received and check them against
collapse-doctor's recomputation from the logged rewards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer

from collapse_doctor.engine.advantages import gdpo_advantages, grpo_advantages
from collapse_doctor.retrain.plan import RetrainOptions
from collapse_doctor.retrain.run import run_retrain

pytestmark = pytest.mark.slow

CHANNELS = ("format", "graded", "sometimes")
WEIGHTS = {"format": 1.0, "graded": 0.5, "sometimes": 2.0}


def graded(completions: list[str], **_: Any) -> list[float | None]:
    """A continuous reward that varies within groups (a hash of the text)."""
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


def sometimes(completions: list[str], **_: Any) -> list[float | None]:
    """Not applicable (None -> NaN) for a third of the completions."""
    return [None if len(c) % 3 == 0 else len(c) / 10 for c in completions]


REWARDS = (
    "format=format_tag",
    f"graded={__name__}:graded",
    f"sometimes={__name__}:sometimes",
)


def tiny_config(tmp_path: Path, **extra: Any) -> Path:
    path = tmp_path / "retrain.json"
    settings = {"group_size": 4, "batch_size_prompts": 4, "learning_rate": 0.02, **extra}
    path.write_text(json.dumps(settings))
    return path


def tiny_options(tmp_path: Path, algo: str, **kwargs: Any) -> RetrainOptions:
    defaults: dict[str, Any] = {
        "output_dir": tmp_path / "run",
        "algo": algo,
        "demo": True,
        "rewards": REWARDS,
        "weights": dict(WEIGHTS),
        "config": tiny_config(tmp_path),
        "max_steps": 3,
        "max_completion_length": 6,
        "write_every": 2,
        "save_steps": 2,
        "overrides": {"disable_tqdm": True, "report_to": []},
    }
    defaults.update(kwargs)
    return RetrainOptions(**defaults)


@pytest.fixture
def loss_advantages(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every ``advantages`` tensor TRL's loss receives during the test."""
    seen: list[torch.Tensor] = []
    original = GRPOTrainer._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        seen.append(inputs["advantages"].detach().clone())
        return original(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    return seen


def read_rollouts(run: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(run / "rollouts")
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


def recompute(rows: dict[str, np.ndarray], algo: str, scale: str) -> np.ndarray:
    rewards = torch.from_numpy(np.stack([rows[f"reward/{c}"] for c in CHANNELS], axis=1).astype(np.float32))
    steps = torch.from_numpy(np.unique(rows["step"], return_inverse=True)[1].astype(np.int64))
    groups = steps * 1000 + torch.from_numpy(rows["group_id"].astype(np.int64))
    groups = torch.unique(groups, return_inverse=True)[1]
    weights = torch.tensor([WEIGHTS[c] for c in CHANNELS])
    if algo == "gdpo":
        out = gdpo_advantages(rewards, groups, weights=weights, step_index=steps)
    else:
        out = grpo_advantages(rewards, groups, weights=weights, step_index=steps, scale=scale)  # type: ignore[arg-type]
    return out.numpy()


@pytest.mark.parametrize(("algo", "scale"), [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("gdpo", "group")])
def test_parity_with_trl_advantages(tmp_path: Path, loss_advantages: list[torch.Tensor], algo: str, scale: str) -> None:
    result = run_retrain(tiny_options(tmp_path, algo, scale=scale), final_scan=False)
    assert result.steps == 3
    rows = read_rollouts(result.output_dir)
    assert sorted(set(rows["step"].tolist())) == [1, 2, 3], "TRL's steps"
    assert np.isnan(rows["reward/sometimes"]).any(), "the NaN convention is exercised"
    # 1) the logged advantage column is what TRL's loss received (the loss sees each batch shuffled)
    assert len(loss_advantages) == 3
    for step, used in enumerate(loss_advantages, start=1):
        logged = np.sort(rows["advantage"][rows["step"] == step])
        np.testing.assert_allclose(np.sort(used.numpy()), logged, atol=1e-6, rtol=0)
    # 2) collapse-doctor's recomputation from the logged rewards equals it
    np.testing.assert_allclose(recompute(rows, algo, scale), rows["advantage"], atol=1e-5, rtol=0)
    assert np.abs(rows["advantage"]).max() > 0.1, "some groups carry signal"


def test_gdpo_dynamic_replaces_advantages_and_logs_weights(tmp_path: Path, loss_advantages: list[torch.Tensor]) -> None:
    from collapse_doctor.engine.advantages import dynamic_weight_schedule

    result = run_retrain(tiny_options(tmp_path, "gdpo-dynamic"), final_scan=True)
    rows = read_rollouts(result.output_dir)
    weights = np.stack([rows[f"weight/{c}"] for c in CHANNELS], axis=1)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
    for step, used in enumerate(loss_advantages, start=1):
        logged = np.sort(rows["advantage"][rows["step"] == step])
        np.testing.assert_allclose(np.sort(used.numpy()), logged, atol=1e-6, rtol=0)
    # the logged weights are the schedule of the logged rewards (one source of math)
    from collapse_doctor.engine.advantages import channel_advantage_std, clipped_channel_advantages, group_zscores

    stds = []
    for step in range(1, 4):
        r = torch.from_numpy(np.stack([rows[f"reward/{c}"][rows["step"] == step] for c in CHANNELS], axis=1))
        stds.append(channel_advantage_std(clipped_channel_advantages(group_zscores(r, torch.arange(len(r)) // 4))))
    base = torch.tensor([WEIGHTS[c] for c in CHANNELS])
    expected = dynamic_weight_schedule(torch.stack(stds), base_weights=base).numpy()
    first_rows = [int(np.flatnonzero(rows["step"] == s)[0]) for s in range(1, 4)]
    np.testing.assert_allclose(weights[first_rows], expected, atol=1e-5)
    assert result.diagnosis is not None
    assert (result.output_dir / "checkpoint-2" / "collapse_doctor_dynamic_weights.json").is_file()


def test_monitoring_output_scans_and_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from collapse_doctor.pipeline.scan import diagnose

    result = run_retrain(tiny_options(tmp_path, "gdpo"), final_scan=True)
    parts = sorted(p.name for p in (result.output_dir / "rollouts").glob("*.parquet"))
    assert parts == ["part-000001-000002.parquet", "part-000003-000003.parquet"]
    diagnosis = diagnose([result.output_dir / "rollouts"])
    assert diagnosis.run.channels == CHANNELS
    assert diagnosis.run.weights == WEIGHTS
    assert diagnosis.run.steps == 3
    assert result.diagnosis is not None  # three steps are too few for most detectors to judge
    assert result.diagnosis.verdict in ("healthy", "inconclusive", "at_risk", "collapsed")
    events = EventAccumulator(str(result.output_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("rel_gain", "signal_share", "weight", "zero_variance_share"):
        assert {f"collapse_doctor/{name}/{c}" for c in CHANNELS} <= tags
    assert [e.step for e in events.Scalars("collapse_doctor/rel_gain/format")] == [1, 2, 3]


def test_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    first = run_retrain(tiny_options(tmp_path, "gdpo", max_steps=2), final_scan=False)
    assert (first.output_dir / "checkpoint-2").is_dir()
    resumed = run_retrain(tiny_options(tmp_path, "gdpo", max_steps=4, resume=True), final_scan=False)
    assert resumed.steps == 4
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-2")
    rows = read_rollouts(resumed.output_dir)
    steps, counts = np.unique(rows["step"], return_counts=True)
    assert steps.tolist() == [1, 2, 3, 4], "steps 3-4 after checkpoint-2, none twice"
    assert set(counts.tolist()) == {16}, "no step is written twice"


def test_interrupt_saves_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collapse_doctor.retrain import callbacks

    original = callbacks.RetrainCallback.on_step_begin

    def press_ctrl_c(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == 1:
            self.interrupt.requested = True  # what the SIGINT handler does
        return original(self, args, state, control, **kwargs)

    monkeypatch.setattr(callbacks.RetrainCallback, "on_step_begin", press_ctrl_c)
    result = run_retrain(tiny_options(tmp_path, "grpo", max_steps=5, save_steps=50), final_scan=False)
    assert result.interrupted and result.exit_code() == 130
    assert result.steps == 2
    assert (result.output_dir / "checkpoint-2").is_dir()
    assert sorted(set(read_rollouts(result.output_dir)["step"].tolist())) == [1, 2]


def test_fail_on_stops_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part is checked (a check budget of the whole training time): with the default 1%, the tiny run's steps
    of a few milliseconds let a loaded machine skip the checks of steps 6-8, and the run would end unstopped."""
    from collapse_doctor.integrations import trl as integration

    class Checked(integration.CollapseDoctorCallback):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs, check_budget=1.0)

    monkeypatch.setattr(integration, "CollapseDoctorCallback", Checked)
    result = run_retrain(tiny_options(tmp_path, "grpo", max_steps=9, fail_on="info", write_every=1), final_scan=False)
    assert result.fail_on_findings, "the tiny run has findings at info level"
    assert result.steps < 9
    assert result.exit_code() == 1
    assert (result.output_dir / f"checkpoint-{result.steps}").is_dir()
