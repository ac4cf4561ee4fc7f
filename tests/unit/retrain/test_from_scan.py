"""``--from-scan``: several runs, conflicting weights, findings mapped to recipes; ``--output-dir`` and hub checks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import UsageError
from collapse_doctor.retrain.from_scan import scan_advice
from collapse_doctor.retrain.plan import RetrainOptions, build_plan, check_hub_model, check_output_dir
from collapse_doctor.retrain.rewards import parse_rewards
from collapse_doctor.retrain.schedule import Condition, HybridSwitch

REWARDS = ["format=format_tag", "correct=exact_match"]


def finding(code: str, severity: str, channels: list[str], remedy: str, **extra: Any) -> dict[str, Any]:
    return {
        "code": code,
        "severity": severity,
        "channels": channels,
        "title": f"{code} on {channels}",
        "remedy": remedy,
        "evidence": extra.pop("evidence", {}),
        "gdpo_resolves": extra.pop("gdpo_resolves", None),
        **extra,
    }


def scan_file(tmp_path: Path, findings: list[dict[str, Any]], *, algorithm: str = "gdpo", steps: int = 200) -> Path:
    path = tmp_path / "scan.json"
    run = {"sources": [str(tmp_path / "run-a" / "rollouts")], "steps": steps, "algorithm": algorithm}
    path.write_text(json.dumps({"verdict": "at_risk", "run": run, "findings": findings}))
    return path


def advice(path: Path, run: str | None = None) -> Any:
    specs = parse_rewards(REWARDS)
    return scan_advice(path, specs, {s.name: 1.0 for s in specs}, run)


def test_the_more_severe_finding_wins_a_weight_and_the_other_is_reported(tmp_path: Path) -> None:
    path = scan_file(
        tmp_path,
        [
            finding(
                "CD402", "warning", ["format", "correct"], "lower `format`'s weight: retrain --weights format=0.44"
            ),
            finding("CD101", "critical", ["format"], "lower `format`'s weight (e.g. retrain --weights format=0.1)"),
        ],
    )
    a = advice(path)
    assert a.weights == {"format": 0.1, "correct": 1.0}
    assert "CD101: weight of `format` 1 -> 0.1" in a.changes
    assert "CD402: weight `format`=0.44 overruled by CD101 (CD101 is critical, CD402 warning)" in a.changes


def test_at_equal_severity_the_more_specific_finding_wins(tmp_path: Path) -> None:
    path = scan_file(
        tmp_path,
        [
            finding("CD402", "warning", ["format", "correct"], "retrain --weights format=0.44"),
            finding("CD101", "warning", ["format"], "retrain --weights format=0.1"),
        ],
    )
    a = advice(path)
    assert a.weights["format"] == 0.1
    assert any(line.startswith("CD402: weight `format`=0.44 overruled by CD101 (CD101 names 1") for line in a.changes)


def test_a_channel_at_its_floor_keeps_its_weight(tmp_path: Path) -> None:
    path = scan_file(
        tmp_path,
        [
            finding("CD101", "critical", ["correct"], "use a curriculum", evidence={"state": "floor"}),
            finding("CD999", "warning", ["correct"], "retrain --weights correct=0.2"),
        ],
    )
    a = advice(path)
    assert a.weights["correct"] == 1.0, "a constant channel adds no advantage: its weight changes nothing"
    assert any("CD999: weight `correct`=0.2 overruled: `correct` is at its floor (CD101)" in line for line in a.changes)


def test_cd402_conditions_the_loud_channel_and_an_early_grpo_one_gets_a_hybrid_switch(tmp_path: Path) -> None:
    drowns = finding(
        "CD402",
        "warning",
        ["format", "correct"],
        "switch to GDPO; retrain --weights format=0.44",
        evidence={"drowned_channels": ["correct"]},
        onset_step=40,
        gdpo_resolves=True,
    )
    a = advice(scan_file(tmp_path, [drowns], algorithm="grpo", steps=200))
    assert a.conditions == [Condition("format", "correct", ">=", 1.0)]
    assert a.hybrid == HybridSwitch(code="CD402", severity=a.hybrid.severity) and a.hybrid.severity.label == "warning"
    late = advice(scan_file(tmp_path, [{**drowns, "onset_step": 150}], algorithm="grpo", steps=200))
    assert late.hybrid is None, "a late CD402: plain GDPO"
    on_gdpo = advice(scan_file(tmp_path, [drowns], algorithm="gdpo", steps=200))
    assert on_gdpo.hybrid is None and on_gdpo.conditions
    plan = build_plan(
        RetrainOptions(output_dir=tmp_path / "out", demo=True, rewards=tuple(REWARDS), from_scan=tmp_path / "scan.json")
    )
    assert plan.algo == "gdpo"
    assert plan.settings.condition == (Condition("format", "correct", ">=", 1.0),)
    lines = plan.describe()
    assert any(line.startswith("from scan        CD402: condition `format` on `correct` >= 1") for line in lines)
    assert (
        "schedule         from step 0    gdpo, channels format, correct, conditions: format only where correct >= 1"
        in (lines)
    )
    earned = scan_file(tmp_path, [drowns], algorithm="gdpo")
    data = json.loads(earned.read_text())
    data["channels"] = [{"channel": "correct", "state": "ceiling"}, {"channel": "format", "state": "active"}]
    earned.write_text(json.dumps(data))
    at_ceiling = advice(earned)
    assert at_ceiling.conditions == [], "a channel earned almost everywhere gates nothing"
    assert "CD402: `format` drowns `correct`, but `correct` is at its ceiling by the end: not conditioned" in (
        at_ceiling.changes
    )


def test_the_config_keeps_its_own_recipe(tmp_path: Path) -> None:
    drowns = finding("CD402", "warning", ["format", "correct"], "", evidence={"drowned_channels": ["correct"]})
    path = scan_file(tmp_path, [drowns])
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"condition": {"format": "correct > 0.5"}}))
    plan = build_plan(
        RetrainOptions(output_dir=tmp_path / "o", demo=True, rewards=tuple(REWARDS), from_scan=path, config=config)
    )
    assert plan.settings.condition == (Condition("format", "correct", ">", 0.5),)
    assert "kept --config's condition (the scan's conditions are not applied)" in plan.changes


def multi_run_scan(tmp_path: Path) -> Path:
    runs = []
    for name, weight in (("lr-1e-6", 0.3), ("lr-3e-6", 0.6)):
        runs.append(
            {
                "verdict": "at_risk",
                "run": {
                    "sources": [str(tmp_path / "sweep" / name / "rollouts" / "part-000000-000009.parquet")],
                    "steps": 100,
                    "algorithm": "gdpo",
                },
                "findings": [finding("CD402", "warning", ["format", "correct"], f"retrain --weights format={weight}")],
            }
        )
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"format_version": 1, "verdict": "at_risk", "runs": runs}))
    return path


def test_a_scan_of_several_runs_needs_one_picked(tmp_path: Path) -> None:
    path = multi_run_scan(tmp_path)
    with pytest.raises(UsageError) as error:
        advice(path)
    assert "a scan of 2 runs (lr-1e-6, lr-3e-6); --from-scan needs one" in str(error.value)
    assert "--from-scan-run NAME" in str(error.value)
    assert advice(path, "lr-3e-6").weights["format"] == 0.6
    with pytest.raises(UsageError, match="matches no run; the runs are lr-1e-6, lr-3e-6"):
        advice(path, "lr-9")
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "retrain",
            "--demo",
            "--dry-run",
            "--reward",
            "format=format_tag",
            "--reward",
            "correct=exact_match",
            "--from-scan",
            str(path),
        ],
    )
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--from-scan-run" in result.stderr


def test_output_dir_checks(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(UsageError, match="is a file"):
        check_output_dir(tmp_path / "file" / "run")
    assert check_output_dir(tmp_path / "new" / "run") == "will be created (writable)"
    assert check_output_dir(tmp_path) == "exists, writable"
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(UsageError, match="cannot be created"):
            check_output_dir(locked / "run")
    finally:
        locked.chmod(0o700)


def test_an_unreachable_hub_model_fails_fast_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(UsageError) as error:
        check_hub_model("someorg/some-model")
    assert time.perf_counter() - started < 5
    message = str(error.value)
    assert "--model someorg/some-model: not a local directory and not in the Hugging Face cache" in message
    assert "pass a local model directory, or run where the Hub is reachable" in message and "\n" not in message
    pytest.importorskip("trl")
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "x"}\n')
    started = time.perf_counter()
    args = ["retrain", "--model", "someorg/some-model", "--dataset", str(data), "--reward", "format=format_tag"]
    result = CliRunner().invoke(app, [*args, "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.strip().endswith("Hint: pass a local model directory, or run where the Hub is reachable")
    assert time.perf_counter() - started < 30, "no retry loop"
