"""Inputs that used to end in an internal error (issue 26, item 9): each is one line naming the file and the
cause, exit 2, nothing written; or, where the input is fine (an output name that is not UTF-8), it just works."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()
SAMPLE = Path(__file__).parents[2] / "sample_logs" / "healthy.parquet"


def _duplicated(path: Path, names: list[str]) -> Path:
    """Two steps of two groups of 8 under the column ``names`` (some repeated: a join that kept both sides)."""
    step = np.repeat(np.arange(2), 16)
    group = np.tile(np.repeat(np.arange(2), 8), 2)
    reward = np.random.default_rng(0).random(32)
    columns = {"step": step, "group_id": group}
    arrays = [pa.array(columns.get(name, reward)) for name in names]
    pq.write_table(pa.Table.from_arrays(arrays, names=names), path)
    return path


def _one_error(args: list[str], starts: str, contains: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {starts}") and result.stderr.count("\n") == 1, result.stderr
    assert contains in result.stderr and "internal error" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("names", "extra", "column"),
    [
        (["step", "step", "group_id", "reward/a"], [], "step"),
        (["step", "group_id", "reward/a", "reward/a"], [], "reward/a"),
        # the "no reward column" error's hint says --reward-cols; following it for a repeated name must not crash
        (["step", "group_id", "acc", "acc"], ["--reward-cols", "acc"], "acc"),
        (["step", "group_id", "reward/a", "prompt", "prompt"], [], "prompt"),
    ],
)
def test_a_repeated_column_name_is_named(tmp_path: Path, names: list[str], extra: list[str], column: str) -> None:
    source = _duplicated(tmp_path / "run.parquet", names)
    for command in (["scan", str(source), *extra], ["advantages", str(source), "-o", str(tmp_path / "a.parquet")]):
        _one_error([*command, *extra] if command[0] == "advantages" else command, str(source), f"column {column!r}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.parquet"]


def test_a_binary_or_deeply_nested_config_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"persistence = 0.05\n\x00\xff\xfe")
    _one_error(["scan", str(SAMPLE), "--config", str(binary)], str(binary), "not UTF-8 text")
    nested = tmp_path / "nested.toml"
    nested.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    _one_error(["scan", str(SAMPLE), "--config", str(nested)], str(nested), "nested too deeply")
    retrain = tmp_path / "retrain.json"
    retrain.write_text("[" * 100_000)
    _one_error(["retrain", "--demo", "--dry-run", "--config", str(retrain)], str(retrain), "nested too deeply")


def test_a_deeply_nested_scan_result_is_named(tmp_path: Path) -> None:
    nested = tmp_path / "scan.json"
    nested.write_text('{"run": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _one_error(["retrain", "--demo", "--dry-run", "--from-scan", str(nested)], str(nested), "nested too deeply")


def test_deeply_nested_json_lines_are_named(tmp_path: Path) -> None:
    rollouts = tmp_path / "0.jsonl"
    rollouts.write_text("[" * 100_000 + "\n")
    result = runner.invoke(app, ["scan", str(rollouts)])
    assert result.exit_code == 2 and "internal error" not in result.output, result.output


def test_an_output_name_too_long_for_the_file_system(tmp_path: Path) -> None:
    name = "x" * 300
    for option, suffix in (("--json", "json"), ("--html", "html"), ("--junit", "xml"), ("--markdown", "md")):
        command = "report" if option == "--html" else "scan"
        target = tmp_path / f"{name}.{suffix}"
        _one_error([command, str(SAMPLE), option, str(target)], str(tmp_path), "this file system allows 255")
    _one_error(["advantages", str(SAMPLE), "-o", str(tmp_path / f"{name}.parquet")], str(tmp_path), "allows 255")
    assert list(tmp_path.iterdir()) == []


def test_outputs_whose_names_are_not_utf8_are_written(tmp_path: Path, write_table: WriteTable) -> None:
    # Linux file names are bytes: a name that is not UTF-8 is a valid output, written and named with its bytes
    # escaped (\xff), as the inputs' names are.
    source = write_table(make_table(steps=8))
    folder = os.fsencode(tmp_path)
    names = {suffix: os.fsdecode(folder + b"/run-\xff\xfe." + suffix.encode()) for suffix in ("json", "html", "pq")}
    scanned = runner.invoke(app, ["scan", str(source), "--json", names["json"]])
    assert scanned.exit_code == 0, scanned.output
    assert "run-\\xff\\xfe.json" in scanned.stderr + scanned.stdout
    assert json.loads(Path(names["json"]).read_text())["verdict"]
    assert runner.invoke(app, ["report", str(source), "--html", names["html"]]).exit_code == 0
    exported = runner.invoke(app, ["advantages", str(source), "-o", names["pq"]])
    assert exported.exit_code == 0, exported.output
    with Path(names["pq"]).open("rb") as written:  # pyarrow opens paths as UTF-8: through a Python file
        assert pq.read_table(written).num_rows == pq.read_table(source).num_rows
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_long_run_names_are_cut_in_the_middle_in_the_text_and_the_page(tmp_path: Path) -> None:
    # A sweep's deep directories: the run line and the summary row keep the name's start and end on one line; the
    # JSON keeps the name whole, and the HTML page shows it cut with the whole name in its tooltip.
    from collapse_doctor.report.text import NAME_WIDTH

    long = "lr-1e-6-" + "x" * 150 + "-seed-0"
    for name in (long, "short"):
        (tmp_path / "sweep" / name).mkdir(parents=True)
        (tmp_path / "sweep" / name / "rollouts.parquet").write_bytes(SAMPLE.read_bytes())
    result = runner.invoke(app, ["scan", str(tmp_path / "sweep"), "--device", "cpu"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("run lr-1e-6-"))
    assert "…" in line and line.split(": ", 1)[0].endswith("-seed-0") and len(line) < 200
    assert long not in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("lr-1e-6-"))
    assert len(row.split("  ")[0]) <= NAME_WIDTH
    html = tmp_path / "r.html"
    page = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--run", long, "--html", str(html)])
    assert page.exit_code == 0, page.output
    text = html.read_text()
    assert f'title="{long}"' in text and f">{long}<" not in text


def test_steps_beyond_int64_and_nan_group_ids_are_named(tmp_path: Path) -> None:
    # uint64 steps of 2**63 and more wrapped to negative numbers; a NaN float group id became a group of one row.
    step = np.repeat(np.arange(4), 16)
    group = np.tile(np.repeat(np.arange(2), 8), 4).astype(np.float64)
    reward = np.random.default_rng(0).random(64)
    big = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"step": pa.array(step.astype(np.uint64) + np.uint64(2**63)), "group_id": group, "reward/a": reward}),
        big,
    )
    _one_error(["scan", str(big)], str(big), "beyond 64-bit integers")
    group[5] = np.nan
    holes = tmp_path / "holes.parquet"
    pq.write_table(pa.table({"step": step, "group_id": group, "reward/a": reward}), holes)
    _one_error(["scan", str(holes)], str(holes), "1 empty (null or NaN) value(s) at step 0")


@pytest.mark.parametrize(
    "args",
    [
        ["scan", "missing.parquet"],
        ["scan", str(SAMPLE), "--fail-on", "loud"],
        ["scan", str(SAMPLE), "--weights", "a=nan"],
        ["compare", str(SAMPLE)],
        ["explain", "CD999"],
        ["schema", "nope"],
        ["scan", "@missing-list.txt"],
        ["retrain", "--demo", "--dry-run", "--weights", "format=-1"],
    ],
    ids=lambda a: " ".join(a[:3]).replace(str(SAMPLE), "SAMPLE"),
)
def test_error_lines_have_no_stray_punctuation(args: list[str]) -> None:
    # One line 'error: WHAT. Hint: HOW' (issue 27: a message ending in '?' got '?. Hint', one ending in '.' got '..')
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    assert not re.search(r"[?!:.]\. Hint|\.\. |\s\.\s", line), line
