"""Bad inputs to the newer readers and commands: exit 2, one line on stderr naming the input, a hint, no file left."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.paths import SAMPLE_LOGS
from tests.helpers.scalar_runs import scalar_event, session_start, write_raw

runner = CliRunner()


def _fails(args: list[str], *expected: str, hint: bool = True) -> str:
    """Run the CLI; assert exit 2, exactly one stderr line with ``expected`` in it, no traceback."""
    result = runner.invoke(app, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in line and "internal error" not in line, line
    for text in expected:
        assert text in line, line
    if hint:
        assert ". Hint: " in line, line
    return line


def _no_files_left(directory: Path) -> None:
    assert sorted(p.name for p in directory.iterdir()) == []


# --- TensorBoard: logs with nothing to read -------------------------------------------------------------------


def _empty_event_file(d: Path) -> Path:
    path = d / "events.out.tfevents.1"
    path.write_bytes(b"")
    return path


def _session_only(d: Path) -> Path:
    return write_raw(d / "events.out.tfevents.1", [session_start(0, 1.0)])


@pytest.mark.parametrize("make", [_empty_event_file, _session_only], ids=["empty-file", "no-scalar-tags"])
def test_a_scalar_log_without_points_is_an_error_not_healthy(make: Callable[[Path], Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    path = make(run)
    out = tmp_path / "out"
    out.mkdir()
    _fails(["scan", str(run), "--json", str(out / "scan.json")], str(path), "no scalar points")
    _fails(["report", str(run), "--html", str(out / "report.html")], "no scalar points")
    _no_files_left(out)


def test_trainer_state_with_no_numeric_log_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"loss": "x"}, 5]}))
    _fails(["scan", str(tmp_path)], "trainer_state.json", "no scalar points")


def test_watch_waits_for_the_first_scalar_point(tmp_path: Path) -> None:
    _empty_event_file(tmp_path)
    result = runner.invoke(app, ["watch", str(tmp_path), "--interval", "0", "--max-polls", "1"])
    assert result.exit_code == 0
    assert "waiting: " in result.stderr and "no scalar points" in result.stderr


def test_an_empty_log_among_several_runs_does_not_stop_the_others(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    _empty_event_file(tmp_path / "a")
    write_raw(
        tmp_path / "b" / "events.out.tfevents.1", [scalar_event("train/reward", 0.5, i, 1.0 + i) for i in range(5)]
    )
    result = runner.invoke(app, ["scan", str(tmp_path), "--fail-on", "never"])
    assert result.exit_code == 0, result.stderr
    _fails(["scan", str(tmp_path), "--run", "a"], "no scalar points")


# --- rollout dumps with values of the wrong type --------------------------------------------------------------


def _trl(tmp_path: Path, table: pa.Table) -> Path:
    directory = tmp_path / "run" / "completions"
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "completions_10.parquet")
    return tmp_path / "run"


def test_trl_step_column_that_is_not_a_number(tmp_path: Path) -> None:
    run = _trl(tmp_path, pa.table({"step": ["a"] * 4, "prompt": ["p"] * 4, "fmt": [1.0, 0.0, 1.0, 0.0]}))
    _fails(["scan", str(run)], "completions", "step column 'step'", "'a'")


def test_trl_reward_cols_naming_a_text_column(tmp_path: Path) -> None:
    run = _trl(tmp_path, pa.table({"step": [10] * 4, "prompt": ["p"] * 4, "completion": ["x"] * 4}))
    _fails(["scan", str(run), "--reward-cols", "completion"], "reward column 'completion'", "expected numbers")


def _verl(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    directory = tmp_path / "run" / "rollout"
    directory.mkdir(parents=True)
    (directory / "5.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory.parent


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"input": "p", "output": "o", "score": "high", "step": 5}, ["reward key 'score'", "'high'"]),
        ({"input": "p", "output": "o", "score": 1.0, "step": "x"}, ["key 'step'", "'x'"]),
        ({"output": "o", "score": 1.0, "step": 5}, ["neither 'uid' nor 'input' keys", "--group-size"]),
    ],
    ids=["text-score", "text-step", "no-input"],
)
def test_verl_rollout_dump_with_bad_records(row: dict[str, object], expected: list[str], tmp_path: Path) -> None:
    run = _verl(tmp_path, [row] * 4)
    out = tmp_path / "adv.parquet"
    _fails(["scan", str(run)], "rollout", *expected)
    _fails(["advantages", str(run), "-o", str(out)], *expected)
    assert not out.exists()


def test_verl_dump_without_input_is_read_with_group_size(tmp_path: Path) -> None:
    run = _verl(tmp_path, [{"output": "o", "score": float(i % 2), "step": 5} for i in range(4)])
    result = runner.invoke(app, ["scan", str(run), "--group-size", "2", "--fail-on", "never"])
    assert result.exit_code == 0, result.stderr


def test_verl_rollout_line_that_is_not_an_object(tmp_path: Path) -> None:
    directory = tmp_path / "rollout"
    directory.mkdir()
    (directory / "5.jsonl").write_text("[1, 2]\n")
    _fails(["scan", str(tmp_path)], "5.jsonl: line 1 is not a JSON object")


@pytest.mark.parametrize(("reward", "shown"), [("x", "'x'"), ([], "[]"), ({"a": 1}, "{'a': 1}")])
def test_nemo_rl_rewards_that_are_not_numbers(reward: object, shown: str, tmp_path: Path) -> None:
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text(json.dumps({"content": ["p", "r"], "rewards": reward}) + "\n")
    _fails(["scan", str(tmp_path)], f"{path}: line 1", "'rewards' is not a number", shown)


def test_nemo_rl_without_content_needs_group_size(tmp_path: Path) -> None:
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text("".join(json.dumps({"rewards": float(i % 2)}) + "\n" for i in range(4)))
    _fails(["scan", str(tmp_path)], f"{path}: line 1 has no 'content' key", "--group-size")
    assert runner.invoke(app, ["scan", str(tmp_path), "--group-size", "2", "--fail-on", "never"]).exit_code == 0


def test_trl_completions_with_corrupt_data_pages(tmp_path: Path) -> None:
    table = pa.table({"step": [10] * 64, "prompt": [f"p{i // 4}" for i in range(64)], "fmt": np.linspace(0, 1, 64)})
    run = _trl(tmp_path, table)
    path = run / "completions" / "completions_10.parquet"
    data = path.read_bytes()
    middle = len(data) // 2
    path.write_bytes(data[:4] + b"\x00" * (middle - 4) + data[middle:])
    out = tmp_path / "adv.parquet"
    _fails(["scan", str(run)], str(path), "cannot read data")
    _fails(["advantages", str(run), "-o", str(out)], str(path))
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (json.dumps({"step": 1, "data": {"a": 1.0}}) + "\n{bad\n", "line 2 is not JSON"),
        (json.dumps({"step": "x", "data": {"a": 1.0}}) + "\n", "'step' is not an integer: 'x'"),
    ],
    ids=["not-json", "text-step"],
)
def test_verl_file_logger_bad_lines(text: str, expected: str, tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(text)
    _fails(["scan", str(tmp_path)], "metrics.jsonl", expected)


# --- outputs and options ----------------------------------------------------------------------------------------


def test_output_that_is_a_directory_names_no_wrong_option(tmp_path: Path) -> None:
    sample = SAMPLE_LOGS / "healthy.parquet"
    line = _fails(["scan", str(sample), "--json", str(tmp_path)], str(tmp_path), "is a directory")
    assert "with -o" not in line
    _no_files_left(tmp_path)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "0"])
def test_watch_interval_must_be_positive(value: str, tmp_path: Path) -> None:
    line = _fails(["watch", str(tmp_path), "--interval", value], f"--interval {value}")
    assert "at least 0.1 seconds" in line


# --- retrain ----------------------------------------------------------------------------------------------------


@pytest.fixture
def retrain_args(tmp_path: Path) -> list[str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "a", "answer": "1"}\n')
    model = tmp_path / "model"
    model.mkdir()
    return ["retrain", "--model", str(model), "--dataset", str(data), "--reward", "fmt=format_tag", "--dry-run"]


def _with(args: list[str], option: str, value: str) -> list[str]:
    i = args.index(option)
    return [*args[: i + 1], value, *args[i + 2 :]]


def test_retrain_dataset_problems_have_hints(retrain_args: list[str], tmp_path: Path) -> None:
    cases = {
        "bad.jsonl": (b"not json\n", "bad.jsonl:1: not valid JSON"),
        "binary.jsonl": (b"\xff\xfe\x00", "binary.jsonl: cannot read as UTF-8"),
        "empty.jsonl": (b"", "empty.jsonl: dataset has no rows"),
        "data.csv": (b"a,b\n", "data.csv: dataset must be .jsonl or .parquet"),
    }
    for name, (content, expected) in cases.items():
        (tmp_path / name).write_bytes(content)
        _fails(_with(retrain_args, "--dataset", str(tmp_path / name)), expected)


def test_retrain_reward_without_that_function_lists_the_module_functions(retrain_args: list[str]) -> None:
    spec = "fmt=collapse_doctor.retrain.rewards:missing_function"
    line = _fails(_with(retrain_args, "--reward", spec), "no function 'missing_function'")
    assert "format_tag" in line.split("Hint: ")[1] and "Callable" not in line


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("type.json", '{"group_size": "eight"}', "group_size must be a number, got 'eight'"),
        ("bad.toml", "group_size = [", "not valid TOML"),
        ("tool.toml", "tool = 1\n", "unknown key 'tool'"),
    ],
)
def test_retrain_config_problems(name: str, text: str, expected: str, retrain_args: list[str], tmp_path: Path) -> None:
    (tmp_path / name).write_text(text)
    _fails([*retrain_args, "--config", str(tmp_path / name)], name, expected)


def test_retrain_dry_run_checks_a_model_path(retrain_args: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    _fails(_with(retrain_args, "--model", str(missing)), f"--model {missing}: no such model directory")
    result = runner.invoke(app, _with(retrain_args, "--model", "org/some-model"))  # a hub id: checked when loading
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', "no 'findings' list"),
        ("[1, 2]", "no 'findings' list"),
        ("{not json", "not valid JSON"),
        (None, "cannot read the scan result (No such file or directory)"),
    ],
    ids=["no-findings", "a-list", "not-json", "missing"],
)
def test_retrain_from_scan_that_is_not_a_scan(
    text: str | None, expected: str, retrain_args: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "scan.json"
    if text is not None:
        path.write_text(text)
    _fails([*retrain_args, "--from-scan", str(path)], str(path), expected)


def test_valid_inputs_still_work(retrain_args: list[str], tmp_path: Path) -> None:
    assert runner.invoke(app, retrain_args).exit_code == 0
    steps = np.arange(4)
    write_raw(
        tmp_path / "tb" / "events.out.tfevents.1", [scalar_event("train/reward", 0.5, int(s), 1.0) for s in steps]
    )
    assert runner.invoke(app, ["scan", str(tmp_path / "tb"), "--fail-on", "never"]).exit_code == 0


def test_an_empty_file_says_it_is_empty(tmp_path: Path) -> None:
    """A 0-byte file (a trainer that created it and has not written yet) is named as empty, not as "not Parquet"."""
    empty = tmp_path / "run.parquet"
    empty.write_bytes(b"")
    result = CliRunner().invoke(app, ["scan", str(empty)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {empty}: the file is empty (0 bytes). Hint: if the trainer is still")
