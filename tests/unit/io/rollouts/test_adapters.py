"""Framework layouts become the canonical table at the edge: TRL, verl, NeMo-RL; directory sniffing."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

from collapse_doctor import diagnose
from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.report.schemas import schema_text
from tests.helpers.scalar_runs import write_events
from tests.helpers.trl import GROUPS, SIZE, STEPS, trl_output_dir


def test_trl_output_dir_combines_completions_and_events(tmp_path: Path) -> None:
    out = trl_output_dir(tmp_path / "out")
    runs = discover_runs([out])
    assert len(runs) == 1
    run = runs[0]
    assert run.rollout_kind == "trl_completions" and len(run.rollout_files) == STEPS
    assert len(run.scalar_logs["events"]) == 1 and len(run.scalar_logs["trainer_state"]) == 1
    diagnosis = diagnose([out], ScanOptions.of(device="cpu"))
    assert diagnosis.run.rollouts == STEPS * GROUPS * SIZE
    assert diagnosis.run.groups == STEPS * GROUPS and diagnosis.run.group_size_max == SIZE
    assert diagnosis.run.channels == ("format_reward", "accuracy_reward")
    assert diagnosis.run.algorithm == "grpo"  # the logged advantage matches the recomputation
    assert diagnosis.run.scalar_points == 200 * 11 and diagnosis.run.scalar_framework == "trl"
    assert diagnosis.scalars is not None
    # rollout detectors and CD5xx both ran; CD104 says why it cannot judge (this log has no clipped-ratio tag), and
    # the scalar checks whose series the log lacks (no advantage max/min, clip ratios or eval score) are named
    assert set(diagnosis.skipped) <= {"CD104", "CD506", "CD508", "CD510"}
    assert "truncated share" in diagnosis.skipped.get("CD104", "truncated share")
    assert all(diagnosis.skipped[c].startswith("the scalar log has none of") for c in ("CD506", "CD508", "CD510"))
    data = json.loads(diagnosis.to_json())
    jsonschema.validate(data, json.loads(schema_text("scan")))
    assert data["run"]["scalar_points"] == 200 * 11 and "scalars" in data
    assert any("tfevents" in s for s in diagnosis.run.sources)


def test_trl_saturation_is_found_from_completions(tmp_path: Path) -> None:
    out = trl_output_dir(tmp_path / "out", saturate_at=10, events=False)
    diagnosis = diagnose([out], ScanOptions.of(device="cpu"))
    found = {f.code: f for f in diagnosis.findings}
    assert "CD101" in found and found["CD101"].channels == ("format_reward",)


def test_trl_group_size_option_cuts_blocks(tmp_path: Path) -> None:
    out = trl_output_dir(tmp_path / "out", events=False)
    diagnosis = diagnose([out / "completions"], ScanOptions.of(device="cpu", group_size=4))
    assert diagnosis.run.group_size_max == 4


def test_verl_rollout_dumps_rebuild_groups_from_input_text(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    dump = tmp_path / "rollouts"
    dump.mkdir()
    for step in range(1, STEPS + 1):
        rows = []
        for g in range(GROUPS):
            for _ in range(SIZE):
                acc, fmt = float(rng.random() < 0.5), float(rng.random() < 0.7)
                rows.append(
                    {
                        "input": f"q{g}",
                        "output": "o",
                        "score": acc + fmt,
                        "step": step,
                        "gts": "1",
                        "acc": acc,
                        "format": fmt,
                    }
                )
        order = rng.permutation(len(rows))  # verl does not keep group order
        (dump / f"{step}.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in order))
    diagnosis = diagnose([dump], ScanOptions.of(device="cpu"))
    assert diagnosis.run.channels == ("acc", "format")
    assert diagnosis.run.groups == STEPS * GROUPS and diagnosis.run.group_size_min == SIZE
    assert diagnosis.run.steps == STEPS


def test_verl_uid_is_the_group_id(tmp_path: Path) -> None:
    """The v1 trainer's ``uid`` marks the ``rollout.n`` responses of one prompt. Here every prompt text is sampled
    by two groups (a small dataset repeated within a batch): grouping by text would merge them into groups of
    2 * SIZE, the uid keeps the 2 * GROUPS groups of SIZE apart."""
    rng = np.random.default_rng(3)
    dump = tmp_path / "rollouts"
    dump.mkdir()
    for step in range(1, STEPS + 1):
        rows = [
            {"input": f"q{g % GROUPS}", "output": "o", "score": float(rng.random() < 0.5), "step": step, "uid": f"u{g}"}
            for g in range(2 * GROUPS)
            for _ in range(SIZE)
        ]
        order = rng.permutation(len(rows))
        (dump / f"{step}.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in order))
    diagnosis = diagnose([dump], ScanOptions.of(device="cpu"))
    assert diagnosis.run.groups == STEPS * 2 * GROUPS
    assert diagnosis.run.group_size_min == diagnosis.run.group_size_max == SIZE


def test_nemo_rl_training_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    logs = tmp_path / "logs" / "exp_001"
    logs.mkdir(parents=True)
    for step in range(1, STEPS + 1):
        lines = []
        for g in range(GROUPS):
            rewards = (rng.random(SIZE) < 0.5).astype(float)
            for r in rewards:
                adv = [0.0, 0.0, r - rewards.mean(), r - rewards.mean()]
                content = ["system prompt", f"question {g}", f"answer {r}"]
                lines.append({"content": content, "rewards": r, "advantages": adv, "token_loss_mask": [0, 0, 1, 1]})
        (logs / f"train_data_step{step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    diagnosis = diagnose([tmp_path / "logs"], ScanOptions.of(device="cpu"))
    assert diagnosis.run.channels == ("reward",)
    assert diagnosis.run.groups == STEPS * GROUPS and diagnosis.run.rollouts == STEPS * GROUPS * SIZE
    assert diagnosis.run.logged_advantage


def test_unrecognised_directory_lists_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "metrics.csv").write_text("a,b")
    with pytest.raises(
        InputError, match=r"no run found in this directory \(it holds 2 file\(s\): metrics.csv, notes.txt\)"
    ):
        diagnose([tmp_path], ScanOptions.of(device="cpu"))
    result = CliRunner().invoke(app, ["scan", str(tmp_path)])
    assert result.exit_code == 2 and "TensorBoard event files" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_two_event_dirs_under_one_output_dir_are_two_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_events(out / "runs" / "a", {"train/kl": np.ones(3)})
    write_events(out / "runs" / "b", {"train/kl": np.ones(3)})
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    runs = discover_runs([out])
    assert sorted(r.name for r in runs) == ["runs/a", "runs/b"]
    assert all(len(r.scalar_logs["events"]) == 1 and "trainer_state" not in r.scalar_logs for r in runs)


def test_an_output_dir_with_one_rollout_set_is_one_run(tmp_path: Path) -> None:
    out = trl_output_dir(tmp_path / "out", events=True)
    write_events(out / "tensorboard", {"collapse_doctor/advantage_std": np.full(200, 0.9)})  # a monitor's own log
    runs = discover_runs([out])
    assert len(runs) == 1 and len(runs[0].scalar_logs["events"]) == 2
    diagnosis = diagnose([out], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_points == 200 * 12
    assert diagnosis.scalars is not None
    assert diagnosis.scalars.tags["advantage_std"] == "collapse_doctor/advantage_std"
    assert diagnosis.scalars.framework == "trl"
