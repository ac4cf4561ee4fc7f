"""``collapse-doctor retrain``: options, config files, --dry-run, --from-scan, errors (mostly no training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.retrain.data import read_prompt_rows
from collapse_doctor.retrain.plan import RetrainOptions, apply_scan, build_plan
from collapse_doctor.retrain.rewards import exact_match, format_tag, length_limit, parse_reward, parse_rewards
from collapse_doctor.retrain.settings import load_settings, resolve_algorithm, settings_from_mapping
from tests.helpers.paths import GOLDEN
from tests.helpers.tables import modules_imported_by_cli

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_help_does_not_import_the_training_stack() -> None:
    code, out, _ = invoke("retrain", "--help")
    assert code == 0 and "--algo" in out and "--dry-run" in out
    assert modules_imported_by_cli(["retrain", "--help"], packages=("torch", "trl", "transformers", "numpy")) == []


def test_missing_train_extra_is_one_line() -> None:
    code = (
        "import sys\n"
        "sys.modules['trl'] = None\n"
        "from collapse_doctor.cli.app import main\n"
        "main(['retrain', '--demo', '--dry-run'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "pip install 'collapse-doctor[train]'" in lines[0]


def test_dry_run_prints_plan_and_grpo_config(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    code, out, err = invoke(
        "retrain", "--algo", "gdpo-dynamic", "--demo", "--dry-run", "--output-dir", str(tmp_path / "o")
    )
    assert code == 0, err
    assert "algorithm        gdpo-dynamic" in out
    assert "dynamic weights  EMA alpha 0.05" in out
    config = json.loads(out[out.index("{") :])
    assert config["multi_objective_aggregation"] == "normalize_then_sum"
    assert config["num_generations"] == 8
    assert config["reward_weights"] == [1.0, 1.0], "the copy task: correct and length"
    assert "dataset          built-in digit copy (demo)" in out
    assert f"output           {tmp_path / 'o'} (rollouts/, tensorboard/, checkpoint-*/): will be created" in out
    assert not (tmp_path / "o").exists(), "a dry run writes nothing"


def test_dry_run_prints_the_schedule_and_refuses_a_file_as_output(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    cfg = tmp_path / "r.toml"
    cfg.write_text(
        "reward_weight_temperature = [[0, 0.7], [60, 0.4]]\nreward_weight_max = 0.8\nhybrid_switch = 20\n"
        'channel_start = {length = 40}\ncondition = {length = "correct >= 1"}\n'
    )
    code, out, err = invoke("retrain", "--algo", "gdpo-dynamic", "--demo", "--dry-run", "--config", str(cfg))
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("schedule")] == [
        "schedule         from step 0    grpo, channels correct",
        "schedule         from step 20   gdpo-dynamic, T=0.7, channels correct",
        "schedule         from step 40   gdpo-dynamic, T=0.7, channels correct, length, conditions: length only "
        "where correct >= 1",
        "schedule         from step 60   gdpo-dynamic, T=0.4, channels correct, length, conditions: length only "
        "where correct >= 1",
    ]
    config = json.loads(out[out.index("{") :])
    assert config["learning_rate"] == 3e-2 and config["num_generations"] == 8, "--demo's settings stay the defaults"
    (tmp_path / "taken").write_text("x")
    code, _, err = invoke("retrain", "--demo", "--dry-run", "--output-dir", str(tmp_path / "taken"))
    assert code == 2 and err.strip() == f"error: --output-dir {tmp_path / 'taken'} is a file. Hint: choose a directory"
    cfg.write_text('condition = {length = "correct >> 1"}\n')
    code, _, err = invoke("retrain", "--demo", "--dry-run", "--config", str(cfg))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "condition.length 'correct >> 1' is not 'channel OP number'" in err
    code, _, err = invoke("retrain", "--demo", "--demo-task", "nope", "--dry-run")
    assert code == 2 and "--demo-task 'nope' is not one of copy, sums" in err
    code, _, err = invoke("retrain", "--demo-task", "sums", "--dry-run")
    assert code == 2 and "--demo-task sums needs --demo" in err


def test_dry_run_grpo_scale_and_config(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[tool.collapse-doctor.retrain]\ngroup_size = 4\nbatch_size_prompts = 2\nlearning_rate = 1e-5\n"
        "policy_clip_epsilon = 0.1\nkl_target = 0.05\nwarmup_steps = 3\n"
    )
    code, out, err = invoke(
        "retrain", "--algo", "grpo", "--scale", "batch", "--demo", "--dry-run", "--config", str(cfg)
    )
    assert code == 0, err
    config = json.loads(out[out.index("{") :])
    assert config["multi_objective_aggregation"] == "sum_then_normalize"
    assert config["scale_rewards"] == "batch"
    assert config["num_generations"] == 4
    assert config["per_device_train_batch_size"] == 8
    assert config["learning_rate"] == 1e-5
    assert config["epsilon"] == 0.1
    assert config["warmup_steps"] == 3
    assert config["beta"] == 0.04
    assert "KL               adaptive beta" in out


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"group_size": 4, "lr": 0.1}))
    code, _, err = invoke("retrain", "--demo", "--dry-run", "--config", str(cfg))
    assert code == 2
    assert err.strip() == f"error: {cfg}: unknown key 'lr'. Hint: known keys: " + ", ".join(
        [
            "group_size",
            "reward_mode",
            "reward_weights_ema_alpha",
            "reward_weight_temperature",
            "reward_weight_min",
            "reward_weight_max",
            "advantage_clip",
            "policy_clip_epsilon",
            "kl_target",
            "learning_rate",
            "warmup_steps",
            "batch_size_prompts",
            "hybrid_switch",
            "channel_start",
            "condition",
            "advantage_clip_when_std_above",
        ]
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"group_size": 1}, "group_size must be >= 2"),
        ({"group_size": 2.5}, "must be an integer"),
        ({"reward_mode": "mix"}, "reward_mode 'mix' is not one of"),
        ({"learning_rate": "fast"}, "must be a number"),
        ({"reward_weight_min": 0.6, "reward_weight_max": 0.5}, "must not exceed"),
        ({"reward_weights_ema_alpha": 2}, "must be in (0, 1]"),
        ({"warmup_steps": -1}, "must be >= 0"),
    ],
)
def test_settings_validation(data: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        settings_from_mapping(data)


def test_reward_mode_and_algo() -> None:
    assert resolve_algorithm(None, settings_from_mapping({})) == "gdpo"
    assert resolve_algorithm(None, settings_from_mapping({"reward_mode": "sum"})) == "grpo"
    assert resolve_algorithm(None, settings_from_mapping({"reward_mode": "decompose_and_dynamic_weight"})) == (
        "gdpo-dynamic"
    )
    with pytest.raises(UsageError, match="contradicts"):
        resolve_algorithm("grpo", settings_from_mapping({"reward_mode": "decompose"}))
    with pytest.raises(UsageError, match="--algo 'ppo'"):
        resolve_algorithm("ppo", settings_from_mapping({}))


def test_load_settings_formats(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("group_size = 6\n")
    assert load_settings(tmp_path / "a.toml").group_size == 6
    (tmp_path / "b.yaml").write_text("group_size: 6\n")
    with pytest.raises(UsageError, match=r"\.json or \.toml"):
        load_settings(tmp_path / "b.yaml")
    (tmp_path / "c.json").write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_settings(tmp_path / "c.json")


def test_rewards_builtins_and_resolver() -> None:
    assert format_tag(["<answer>1</answer>", "<answer>"]) == [1.0, 0.0]
    assert exact_match(["<answer> 7 </answer>", "7", "<answer>8</answer>"], answer=["7", "7", "7"]) == [1.0, 1.0, 0.0]
    assert length_limit(["x" * 10, "x" * 30], max_length=[20, 20]) == [1.0, 0.5]
    spec = parse_reward("correct=collapse_doctor.retrain.rewards:exact_match")
    assert spec.name == "correct" and spec.function is exact_match
    assert parse_reward("length=length_limit").function is length_limit
    for bad, message in [
        ("x=nomodule_zz:f", "cannot import module"),
        ("x=collapse_doctor.retrain.rewards:nope", "has no function"),
        ("x=justaname", "expected name=module:function"),
        ("bad name=format_tag", "must be a word"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_reward(bad)
    with pytest.raises(UsageError, match="given twice"):
        parse_rewards(["a=format_tag", "a=length_limit"])
    with pytest.raises(UsageError, match="no reward function"):
        parse_rewards([])


def test_dataset_reading(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": "4"}\n')
    assert [r["answer"] for r in read_prompt_rows(good)] == ["2", "4"]
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "1+1="}\n')
    with pytest.raises(InputError, match=r"no 'prompt' column; found columns: \[question\]"):
        read_prompt_rows(bad)
    with pytest.raises(InputError, match="no such dataset file"):
        read_prompt_rows(tmp_path / "missing.jsonl")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"]}), tmp_path / "p.parquet")
    assert len(read_prompt_rows(tmp_path / "p.parquet")) == 2


def test_never_writes_into_the_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "x"}\n')
    options = RetrainOptions(output_dir=model / "runs", model=str(model), dataset=data, rewards=("format=format_tag",))
    with pytest.raises(UsageError, match="inside the input model's directory"):
        build_plan(options)


def scan_json(tmp_path: Path) -> Path:
    findings = [
        {
            "code": "CD401",
            "title": "`correct` and `judge` are collinear",
            "remedy": "drop `judge`: it repeats `correct`, rho=0.97 (collapse-doctor retrain --from-scan scan.json "
            "drops it), or merge the two into one channel",
            "actions": [{"kind": "drop", "channel": "judge"}],
            "gdpo_resolves": False,
        },
        {
            "code": "CD101",
            "title": "`format` no longer ranks samples",
            "remedy": "lower `format`'s weight (e.g. retrain --weights format=0.1) or drop it, make the check "
            "harder, or switch to GDPO: collapse-doctor retrain --algo gdpo --from-scan scan.json",
            "actions": [
                {"kind": "weight", "channel": "format", "weight": 0.1},
                {"kind": "aggregation", "algorithm": "gdpo"},
            ],
            "gdpo_resolves": True,
        },
    ]
    path = tmp_path / "scan.json"
    path.write_text(json.dumps({"verdict": "collapsed", "findings": findings}))
    return path


def test_from_scan_drops_and_reweights(tmp_path: Path) -> None:
    specs = parse_rewards(["format=format_tag", "correct=exact_match", "judge=length_limit"])
    rewards, weights, changes, wants_gdpo = apply_scan(scan_json(tmp_path), specs, {s.name: 1.0 for s in specs})
    assert [r.name for r in rewards] == ["format", "correct"]
    assert weights == {"format": 0.1, "correct": 1.0}
    assert wants_gdpo
    assert changes[0].startswith("CD401: dropped channel `judge`")
    assert changes[1] == "CD101: weight of `format` 1 -> 0.1"


def test_from_scan_reads_the_remedies_scan_writes() -> None:
    """The golden scans' actions are what --from-scan applies (their remedy texts word the same actions)."""
    golden = GOLDEN / "scan"
    specs = parse_rewards(["correct=exact_match", "verifier=exact_match", "style=length_limit"])
    rewards, _, changes, wants_gdpo = apply_scan(golden / "collinear.json", specs, {s.name: 1.0 for s in specs})
    assert [r.name for r in rewards] == ["correct", "style"] and not wants_gdpo
    assert changes[0].startswith("CD401: dropped channel `verifier`")
    specs = parse_rewards(["format=format_tag", "correct=exact_match"])
    _, weights, changes, wants_gdpo = apply_scan(golden / "saturating-format.json", specs, {s.name: 1.0 for s in specs})
    assert wants_gdpo
    # CD101 (`format` saturated at its ceiling) proposes no weight: a constant channel changes no advantage.
    # CD402 (`format` drowns `correct` from step 39 of a 200-step GRPO run): switch when it shows. No gate on
    # `correct` >= 1: that sample's `correct` is a score below 1 (at most 0.996), so it would count `format` nowhere.
    assert changes == [
        "CD402: hybrid_switch on-finding:CD402@warning (the GRPO run showed it at step 39 of 200: summed rewards "
        "while the channels agree, GDPO from when one drowns another)",
        "CD402: weight of `format` 1 -> 0.44",
    ]
    assert weights == {"format": 0.44, "correct": 1.0}


def test_from_scan_in_dry_run(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    code, out, err = invoke(
        "retrain",
        "--demo",
        "--dry-run",
        "--reward",
        "format=format_tag",
        "--reward",
        "correct=exact_match",
        "--reward",
        "judge=length_limit",
        "--from-scan",
        str(scan_json(tmp_path)),
    )
    assert code == 0, err
    assert "from scan        CD401: dropped channel `judge`" in out
    assert "algorithm        gdpo" in out
    config = json.loads(out[out.index("{") :])
    assert config["reward_weights"] == [0.1, 1.0]


def test_from_scan_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "scan.json"
    bad.write_text("[]")
    code, _, err = invoke("retrain", "--demo", "--dry-run", "--from-scan", str(bad))
    assert code == 2
    assert "not a scan result" in err


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    code, _, err = invoke("retrain", "--demo", "--resume", "--output-dir", str(tmp_path / "none"))
    assert code == 2
    assert "no checkpoint-* directory" in err


@pytest.mark.slow
def test_cli_demo_trains_and_prints_the_verdict(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"group_size": 4, "batch_size_prompts": 2, "learning_rate": 0.01}))
    out_dir = tmp_path / "run"
    code, out, err = invoke(
        "retrain",
        "--algo",
        "grpo",
        "--demo",
        "--config",
        str(cfg),
        "--max-steps",
        "2",
        "--max-completion-length",
        "4",
        "--output-dir",
        str(out_dir),
    )
    assert code == 0, err
    assert "trained 2 steps" in err  # a note (stderr); the verdict is the result (stdout)
    assert any(v in out for v in ("HEALTHY", "INCONCLUSIVE", "AT RISK", "COLLAPSED"))
    code, out, err = invoke("scan", str(out_dir / "rollouts"), "--fail-on", "never")
    assert code == 0, err
    # a second run into the same directory must not mix runs
    code, _, err = invoke("retrain", "--demo", "--max-steps", "1", "--output-dir", str(out_dir))
    assert code == 2 and "already holds a run" in err
