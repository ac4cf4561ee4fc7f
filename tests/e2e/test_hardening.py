"""Outputs never replace devices, FIFOs or symlinks; `-` is stdout; SIGTERM cleans up; log text is shown escaped."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.text import render_text
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()

EVIL = "fmt\x1b[31mRED\x1b[0m\nFORGED\u202etxt"
EVIL_SHOWN = "fmt\\x1b[31mRED\\x1b[0m\\nFORGED\\u202etxt"


@pytest.fixture
def run_file(write_table: WriteTable) -> Path:
    return write_table(make_table(steps=8))


def _mknod(path: Path, minor: int) -> Path:
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, minor))  # S_IFCHR
    except (PermissionError, OSError) as exc:
        pytest.skip(f"mknod is not permitted here ({exc})")
    return path


def test_character_device_is_written_directly(run_file: Path, tmp_path: Path) -> None:
    null = _mknod(tmp_path / "null", 3)  # /dev/null's numbers
    scanned = runner.invoke(app, ["scan", str(run_file), "--json", str(null), "--markdown", str(null.with_name("m"))])
    assert scanned.exit_code == 0, scanned.output
    exported = runner.invoke(app, ["advantages", str(run_file), "-o", str(null)])
    assert exported.exit_code == 0, exported.output
    assert null.is_char_device()
    assert not list(tmp_path.glob(".*.tmp"))


def test_full_device_is_one_error_line(run_file: Path, tmp_path: Path) -> None:
    full = _mknod(tmp_path / "full", 7)  # /dev/full's numbers: every write fails with ENOSPC
    for args in (["scan", str(run_file), "--json", str(full)], ["advantages", str(run_file), "-o", str(full)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: {full}: cannot write (") and result.stderr.count("\n") == 1
        assert "No space left on device" in result.stderr
        assert full.is_char_device()


def test_fifo_is_written_directly(run_file: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = runner.invoke(app, ["scan", str(run_file), "--json", str(fifo)])
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert received and b'"format_version"' in received[0]
    assert fifo.is_fifo() and not list(tmp_path.glob(".*.tmp"))


def test_symlink_is_written_through(run_file: Path, tmp_path: Path) -> None:
    target = tmp_path / "real" / "scan.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = runner.invoke(app, ["scan", str(run_file), "--json", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert '"format_version"' in target.read_text()
    assert not list(tmp_path.glob("**/.*.tmp"))
    exported_link = tmp_path / "adv.parquet"
    exported_link.symlink_to(tmp_path / "real" / "adv.parquet")  # dangling: the target is created
    result = runner.invoke(app, ["advantages", str(run_file), "-o", str(exported_link)])
    assert result.exit_code == 0, result.output
    assert exported_link.is_symlink() and pq.read_table(tmp_path / "real" / "adv.parquet").num_rows == 256


def test_dash_is_stdout(run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["scan", str(run_file), "--json", "-", "--format", "github"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("{\n") and "::notice title=collapse-doctor::" in result.stdout
    twice = runner.invoke(app, ["scan", str(run_file), "--json", "-", "--format", "json"])
    assert twice.exit_code == 0, twice.output
    assert json.loads(twice.stdout)["verdict"], "one JSON document on stdout, not the same one twice"
    exported = runner.invoke(app, ["advantages", str(run_file), "-o", "-"])
    assert exported.exit_code == 0, exported.output
    assert exported.stdout_bytes.startswith(b"PAR1") and exported.stderr.startswith("wrote -: 256 rows")
    assert pq.read_table(io.BytesIO(exported.stdout_bytes)).num_rows == 256
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize(("first", "second"), [("--json", "--html"), ("--json", "--junit"), ("--junit", "--markdown")])
def test_two_outputs_on_one_path(run_file: Path, tmp_path: Path, first: str, second: str) -> None:
    same = tmp_path / "same.out"
    result = runner.invoke(app, ["scan", str(run_file), first, str(same), second, str(same)])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {first} and {second} both write to {same}. Hint: give each output its own path\n",
    )
    assert not same.exists()


def test_two_outputs_on_one_path_through_a_symlink_or_stdout(run_file: Path, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "j")
    linked = runner.invoke(
        app, ["scan", str(run_file), "--json", str(tmp_path / "j"), "--junit", str(tmp_path / "link")]
    )
    assert linked.exit_code == 2 and linked.stderr.startswith("error: --json and --junit both write to ")
    dashes = runner.invoke(app, ["scan", str(run_file), "--json", "-", "--markdown", "-"])
    assert dashes.exit_code == 2 and dashes.stderr.startswith("error: --json and --markdown both write to -.")
    assert dashes.stdout == ""


def test_sigterm_removes_the_temp_file_and_exits_143(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    write_simulation(source, "healthy", steps=600, groups=64, group_size=8)
    out = tmp_path / "out" / "adv.parquet"
    out.parent.mkdir()
    exe = Path(sys.executable).with_name("collapse-doctor")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "collapse_doctor.cli.app"]
    proc = subprocess.Popen(
        [*command, "advantages", str(source), "-o", str(out), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(".*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the export finished before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert b"terminated (SIGTERM)" in stderr
    assert list(out.parent.iterdir()) == []


def _evil_run(write_table: WriteTable) -> Path:
    table = make_table(steps=6, channels=("format", EVIL))
    return write_table(table)


def test_control_characters_in_channel_names_are_escaped(write_table: WriteTable, tmp_path: Path) -> None:
    path = _evil_run(write_table)
    markdown = tmp_path / "summary.md"
    result = runner.invoke(app, ["scan", str(path), "--markdown", str(markdown)], env={"NO_COLOR": "1"})
    assert result.exit_code in (0, 1), result.output
    for text in (result.stdout, markdown.read_text(encoding="utf-8")):
        assert EVIL_SHOWN in text
        assert "\x1b" not in text and "\u202e" not in text and "\nFORGED" not in text
    exported = runner.invoke(app, ["advantages", str(path), "-o", str(tmp_path / "adv.parquet")])
    assert exported.exit_code == 0, exported.output
    assert EVIL_SHOWN in exported.stderr and "\x1b" not in exported.stderr and exported.stderr.count("\n") == 1


def test_control_characters_are_escaped_in_colour(write_table: WriteTable) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    diagnosis = diagnose([_evil_run(write_table)])
    out = Terminal()
    render_text(diagnosis, out, color=None)
    text = out.getvalue()
    assert "\x1b[" in text  # coloured: rich's own escapes are there
    assert EVIL_SHOWN in text and "\x1b[31mRED" not in text and "\u202e" not in text and "\nFORGED" not in text


@pytest.mark.parametrize(("sample", "expected"), [("healthy", 0), ("saturating-format", 1)])
def test_a_reader_that_went_away_keeps_the_scans_exit_code(sample: str, expected: int) -> None:
    """`scan RUN | head`: stdout is a pipe whose reader is gone before anything is written. No traceback, no
    rich SystemExit(1): the exit code is the scan's own (0 healthy, 1 a finding at --fail-on: a CI gate piped into
    head still fails)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # every write raises EPIPE
    done = subprocess.run(
        [sys.executable, "-m", "collapse_doctor", "scan", f"sample_logs/{sample}.parquet"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    os.close(write)
    assert done.returncode == expected, done.stderr
    assert "Traceback" not in done.stderr and "Broken pipe" not in done.stderr
