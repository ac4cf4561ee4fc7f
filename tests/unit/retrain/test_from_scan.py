"""``--from-scan``: several runs, conflicting weights, findings mapped to recipes; ``--output-dir`` and hub checks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.core.findings import (
    Action,
    ChangeSetting,
    ConditionChannel,
    DropChannel,
    SetAggregation,
    SetRecipe,
    SetWeight,
)
from collapse_doctor.retrain.from_scan import scan_advice
from collapse_doctor.retrain.plan import RetrainOptions, build_plan, check_hub_model, check_output_dir
from collapse_doctor.retrain.rewards import parse_rewards
from collapse_doctor.retrain.schedule import Condition, HybridSwitch

REWARDS = ["format=format_tag", "correct=exact_match"]


def finding(
    code: str, severity: str, channels: list[str], remedy: str, *actions: Action, **extra: Any
) -> dict[str, Any]:
    return {
        "code": code,
        "severity": severity,
        "channels": channels,
        "title": f"{code} on {channels}",
        "remedy": remedy,
        "actions": [a.to_dict() for a in actions],
        "evidence": extra.pop("evidence", {}),
        "gdpo_resolves": extra.pop("gdpo_resolves", None),
        **extra,
    }


GATE = ConditionChannel("format", "correct", ">=", 1.0)
HYBRID = SetRecipe("hybrid_switch", "on-finding:CD402@warning")


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
                "CD402",
                "warning",
                ["format", "correct"],
                "lower `format`'s weight: retrain --weights format=0.44",
                SetWeight("format", 0.44),
            ),
            finding(
                "CD101",
                "critical",
                ["format"],
                "lower `format`'s weight (e.g. retrain --weights format=0.1)",
                SetWeight("format", 0.1),
            ),
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
            finding(
                "CD402", "warning", ["format", "correct"], "retrain --weights format=0.44", SetWeight("format", 0.44)
            ),
            finding("CD101", "warning", ["format"], "retrain --weights format=0.1", SetWeight("format", 0.1)),
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
            finding("CD999", "warning", ["correct"], "retrain --weights correct=0.2", SetWeight("correct", 0.2)),
        ],
    )
    a = advice(path)
    assert a.weights["correct"] == 1.0, "a constant channel adds no advantage: its weight changes nothing"
    assert any("CD999: weight `correct`=0.2 overruled: `correct` is at its floor (CD101)" in line for line in a.changes)


def cd402(*actions: Action, remedy: str = "switch to GDPO; retrain --weights format=0.44") -> dict[str, Any]:
    return finding(
        "CD402",
        "warning",
        ["format", "correct"],
        remedy,
        *actions,
        evidence={"drowned_channels": ["correct"]},
        onset_step=40,
        gdpo_resolves=True,
    )


def test_cd402_conditions_the_loud_channel_and_an_early_grpo_one_gets_a_hybrid_switch(tmp_path: Path) -> None:
    drowns = cd402(SetAggregation("gdpo"), SetWeight("format", 0.44), GATE, HYBRID)
    a = advice(scan_file(tmp_path, [drowns], algorithm="grpo", steps=200))
    assert a.conditions == [Condition("format", "correct", ">=", 1.0)]
    assert a.hybrid == HybridSwitch(code="CD402", severity=a.hybrid.severity) and a.hybrid.severity.label == "warning"
    assert a.algorithm == "gdpo" and a.wants_gdpo
    # The scan chose the recipes (a late CD402, a GDPO run or an objective at its ceiling: none, see the detector's
    # tests); a scan without the recipe actions gets none.
    plain = advice(scan_file(tmp_path, [cd402(SetWeight("format", 0.44))], algorithm="grpo", steps=200))
    assert plain.hybrid is None and plain.conditions == [] and plain.weights["format"] == 0.44
    scan_file(tmp_path, [cd402(SetWeight("format", 0.44), GATE)], algorithm="gdpo", steps=200)  # a GDPO run's
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


def test_a_condition_on_a_channel_not_among_the_rewards_is_ignored(tmp_path: Path) -> None:
    gate = ConditionChannel("format", "judge", ">=", 1.0)
    a = advice(scan_file(tmp_path, [cd402(gate)]))
    assert a.conditions == []
    assert "CD402: would count `format` only where `judge` >= 1, but `judge` is not among --reward; ignored" in (
        a.changes
    )


def test_the_advice_comes_from_the_actions_not_the_words(tmp_path: Path) -> None:
    """Rewording a remedy, or emptying it, changes nothing retrain does; words without actions propose nothing."""
    actions = (SetAggregation("gdpo"), SetWeight("format", 0.44), GATE, HYBRID)
    first = advice(scan_file(tmp_path, [cd402(*actions)], algorithm="grpo"))
    for remedy in ("", "rebalance: the loud channel is `format`; see the docs", "drop `correct` --weights correct=9"):
        again = advice(scan_file(tmp_path, [cd402(*actions, remedy=remedy)], algorithm="grpo"))
        assert (again.weights, again.conditions, again.hybrid, again.changes, again.algorithm) == (
            first.weights,
            first.conditions,
            first.hybrid,
            first.changes,
            first.algorithm,
        ), remedy
        assert [r.name for r in again.rewards] == [r.name for r in first.rewards] == ["format", "correct"]
    words_only = advice(
        scan_file(tmp_path, [finding("CD401", "warning", ["format", "correct"], "drop `correct`: --weights format=2")])
    )
    assert [r.name for r in words_only.rewards] == ["format", "correct"] and words_only.weights["format"] == 1.0


def test_drops_and_trainer_settings(tmp_path: Path) -> None:
    a = advice(
        scan_file(
            tmp_path,
            [
                finding("CD401", "warning", ["format", "correct"], "", DropChannel("correct"), DropChannel("judge")),
                finding("CD102", "warning", [], "", ChangeSetting("num_generations", "raise", 2)),
            ],
        )
    )
    assert [r.name for r in a.rewards] == ["format"]
    assert a.changes == [
        "CD401: dropped channel `correct` (CD401 on ['format', 'correct'])",
        "CD401: would drop `judge`, which is not among --reward; ignored",
        "CD102: raise num_generations (verl actor_rollout_ref.rollout.n) to 2 or more (a trainer setting: not "
        "changed by --from-scan)",
    ]


def test_a_scan_without_actions_or_with_an_unknown_one_is_refused_in_one_line(tmp_path: Path) -> None:
    old = finding("CD402", "warning", ["format", "correct"], "retrain --weights format=0.44")
    del old["actions"]
    with pytest.raises(InputError) as error:
        advice(scan_file(tmp_path, [old]))
    message = str(error.value)
    assert "finding CD402 has no 'actions' (what --from-scan applies): the scan was written by an older" in message
    assert "Hint: re-run collapse-doctor scan RUN --json scan.json" in message and "\n" not in message
    future = finding("CD402", "warning", ["format"], "")
    future["actions"] = [{"kind": "rewrite_reward", "channel": "format"}]
    with pytest.raises(InputError, match="finding CD402: unknown remedy action kind 'rewrite_reward'"):
        advice(scan_file(tmp_path, [future]))
    healthy = advice(scan_file(tmp_path, []))
    assert healthy.changes == ["scan.json: no channel or weight change (at_risk)"]


def test_the_config_keeps_its_own_recipe(tmp_path: Path) -> None:
    path = scan_file(tmp_path, [cd402(GATE, remedy="")])
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
                "findings": [
                    finding(
                        "CD402",
                        "warning",
                        ["format", "correct"],
                        f"--weights format={weight}",
                        SetWeight("format", weight),
                    )
                ],
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


def test_an_output_dir_under_proc_is_refused_even_as_root() -> None:
    # Permission bits do not say whether a directory can be made (root passes os.access everywhere, /proc and
    # read-only mounts refuse anyway): the dry run tries, and says it cannot.
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    with pytest.raises(UsageError, match=r"cannot be created: /proc is not writable \("):
        check_output_dir(Path("/proc/collapse-doctor-run"))


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


@pytest.mark.parametrize("weight", [-5.0, "inf", 0.0])
def test_weights_a_scan_carries_are_checked_as_weights_given_on_the_command_line(tmp_path: Path, weight: Any) -> None:
    """A --from-scan JSON (hand-edited, or from another tool) that sets a weight of -5 or inf, or leaves every weight
    at 0, is refused like --weights is: one line, exit 2, nothing trained."""
    action = SetWeight("format", 0.5).to_dict() | {"weight": float(weight)}
    findings = [finding("CD402", "warning", ["format", "correct"], "retrain --weights format=0.5")]
    findings[0]["actions"] = [action]
    if weight == 0.0:  # every weight 0: correct as well
        findings[0]["actions"].append(SetWeight("correct", 0.5).to_dict() | {"weight": 0.0})
    path = scan_file(tmp_path, findings)
    args = ["retrain", "--demo", "--dry-run", "--reward", "format=format_tag", "--reward", "correct=exact_match"]
    result = CliRunner().invoke(app, [*args, "--from-scan", str(path)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert result.stderr.startswith("error: ") and str(path) in result.stderr and "weight" in result.stderr
    flag = CliRunner().invoke(app, [*args, "--weights", "format=-5"])
    assert flag.exit_code == 2 and "a training weight is a finite number >= 0" in flag.stderr
