"""Data is never dropped or merged without a word, and odd tables get one line naming the file, column or value
(issue 14, items 9 and 11), the same in scan, report and advantages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()
COMMANDS = ("scan", "report", "advantages")


def _invoke(command: str, paths: list[Path], tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    out = tmp_path / f"out-{command}"
    extra = {"scan": [], "report": ["--html", str(out)], "advantages": ["-o", str(out)]}[command]
    result = runner.invoke(app, [command, *map(str, paths), *extra, *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output, out


def _steps(table: pa.Table, first: int) -> pa.Table:
    return table.set_column(0, "step", pa.compute.add(table.column("step"), first))


@pytest.mark.parametrize("command", COMMANDS)
def test_mixed_column_types_across_files_are_read_alike(write_table: WriteTable, tmp_path: Path, command: str) -> None:
    """An int64 reward in one file and a double in the next is one numeric column: every command reads both."""
    first = make_table(steps=6, channels=("a", "b"))
    second = _steps(make_table(steps=6, channels=("a", "b"), seed=1), 6)
    second = second.set_column(2, "reward/a", pa.array(second.column("reward/a").to_numpy().astype(np.int64)))
    paths = [write_table(first, "run/p0.parquet"), write_table(second, "run/p1.parquet")]
    code, output, _ = _invoke(command, paths, tmp_path)
    assert code in (0, 1), output


def test_a_group_id_of_another_type_names_the_file_and_column(write_table: WriteTable, tmp_path: Path) -> None:
    first = make_table(steps=6)
    second = _steps(make_table(steps=6, seed=1), 6)
    second = second.set_column(1, "group_id", pa.array([f"g{v}" for v in second.column("group_id").to_pylist()]))
    paths = [write_table(first, "run/p0.parquet"), write_table(second, "run/p1.parquet")]
    for command in COMMANDS:
        code, output, out = _invoke(command, paths, tmp_path)
        assert code == 2 and "p1.parquet: column 'group_id' has type string here but int64" in output, output
        assert not out.exists()


@pytest.mark.parametrize(
    ("metadata", "args", "expected"),
    [
        ('{"format": NaN, "correct": 1}', [], "gives channel 'format' the weight nan"),
        ('{"format": 0, "correct": 0}', [], "every channel weight is 0"),
        (None, ["--weights", "format=0,correct=0"], "every channel weight is 0"),
        (None, ["--reward-cols", "step"], "--reward-cols names 'step', the run's step column"),
        (None, ["--reward-cols", "group_id,reward/format"], "--reward-cols names 'group_id', the run's group column"),
    ],
)
def test_bad_weights_and_reward_columns(
    write_table: WriteTable, tmp_path: Path, metadata: str | None, args: list[str], expected: str
) -> None:
    table = make_table(steps=8)
    if metadata is not None:
        table = table.replace_schema_metadata({"collapse_doctor.weights": metadata})
    path = write_table(table)
    for command in COMMANDS:
        code, output, out = _invoke(command, [path], tmp_path, *args)
        assert code == 2 and expected in output and "Hint:" in output, output
        assert not out.exists()


def test_a_reward_column_with_an_empty_name_is_an_error(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=8).append_column("reward/", pa.array(np.zeros(8 * 4 * 8)))
    code, output, _ = _invoke("scan", [write_table(table)], tmp_path)
    assert code == 2 and "'reward/' looks like a reward column but has an empty channel name" in output


def test_a_channel_only_later_files_have_is_a_warning(write_table: WriteTable, tmp_path: Path) -> None:
    first = make_table(steps=6, channels=("a",))
    second = _steps(make_table(steps=6, channels=("a", "b"), seed=1), 6)
    paths = [write_table(first, "run/p0.parquet"), write_table(second, "run/p1.parquet")]
    _, output, _ = _invoke("scan", paths, tmp_path)
    assert "'reward/b' is in 1 of 2 files but not in the first one: not read" in " ".join(output.split())


def test_the_same_file_copied_under_two_names_is_a_warning(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table(steps=8, text=False))
    copy = tmp_path / "copy.parquet"
    shutil.copy(path, copy)
    _, output, _ = _invoke("scan", [path, copy], tmp_path)
    text = " ".join(output.split())
    assert "the same file given twice?" in text and "both hold rollouts of step 0" in text


def test_group_size_overriding_a_group_column_is_a_warning(write_table: WriteTable, tmp_path: Path) -> None:
    _, output, _ = _invoke("scan", [write_table(make_table(steps=8))], tmp_path, "--group-size", "4")
    assert "--group-size overrides the 'group_id' column" in " ".join(output.split())


def test_a_file_name_that_is_not_utf8_is_read_and_shown_escaped(write_table: WriteTable, tmp_path: Path) -> None:
    source = write_table(make_table(steps=8))
    folder = os.path.join(os.fsencode(tmp_path), b"run\xff")
    os.makedirs(folder)
    shutil.copy(source, os.path.join(folder, b"r\xfe.parquet"))
    cli = [sys.executable, "-m", "collapse_doctor"]
    for args in (
        [b"scan", folder],
        [b"report", folder, b"--html", os.fsencode(tmp_path / "r.html")],
        [b"advantages", folder, b"-o", os.fsencode(tmp_path / "a.parquet")],
    ):
        done = subprocess.run([*cli, *args], capture_output=True, check=False)
        assert done.returncode in (0, 1), done.stderr
        assert b"internal error" not in done.stderr
    assert b"run\\xff" in subprocess.run([*cli, b"scan", folder], capture_output=True).stdout  # the byte, escaped
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 8 * 4 * 8


def test_jsonl_errors_give_line_numbers_also_when_read_from_an_offset(tmp_path: Path) -> None:
    from collapse_doctor.core.errors import InputError
    from collapse_doctor.io.logs.trainer_logs import read_verl_file_log

    good = "".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.1 * s}}) + "\n" for s in range(3))
    path = tmp_path / "verl.jsonl"
    path.write_text(good)
    first = read_verl_file_log(path, start=0)  # as watch does: remember where the complete lines end
    with path.open("a") as handle:
        handle.write("{bad\n")
    with pytest.raises(InputError, match=r"verl\.jsonl: line 4 is not JSON"):
        read_verl_file_log(path, start=first.end)
    with pytest.raises(InputError, match=r"verl\.jsonl: line 4 is not JSON"):
        read_verl_file_log(path, start=0)
