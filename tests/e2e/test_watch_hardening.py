"""`watch` as a sidecar: a typo fails at once, garbage is given up on, polling has a floor, and both Ctrl-C and
SIGTERM print the summary (issue 14, item 12)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.watch import WatchState, watch
from tests.helpers.scalar_runs import after, flat, record, scalar_event, trl_series

runner = CliRunner()
CPU = ScanOptions(device="cpu")


def test_a_path_that_does_not_exist_fails_at_once(tmp_path: Path) -> None:
    result = runner.invoke(app, ["watch", str(tmp_path / "typo"), "--interval", "0", "--max-polls", "5"])
    assert result.exit_code == 2 and "typo: no such file or directory" in result.stderr
    assert "watched" not in result.stdout


def test_unreadable_files_that_do_not_change_are_given_up_on(tmp_path: Path) -> None:
    garbage = tmp_path / "rollouts.parquet"
    garbage.write_bytes(b"this is not parquet" * 100)
    notes: list[str] = []
    with pytest.raises(InputError, match=r"not a Parquet file .*\(unchanged for 3 polls\)"):
        watch([garbage], CPU, interval=0, max_polls=10, on_note=notes.append)
    assert len(notes) == 1 and notes[0].startswith("waiting: ")


def test_an_empty_directory_is_waited_for(tmp_path: Path) -> None:
    state = watch([tmp_path], CPU, interval=0, max_polls=10)
    assert state.polls == 10 and state.scans == 0


@pytest.mark.parametrize("interval", ["1e-9", "0.05", "-1", "nan", "inf"])
def test_interval_has_a_floor(tmp_path: Path, interval: str) -> None:
    result = runner.invoke(app, ["watch", str(tmp_path), "--interval", interval])
    assert result.exit_code == 2 and "--interval" in result.stderr and "at least 0.1" in result.stderr


def test_ctrl_c_prints_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: object, state: WatchState, **__: object) -> None:
        state.polls, state.scans, state.last_step = 4, 2, 17
        raise KeyboardInterrupt

    monkeypatch.setattr("collapse_doctor.pipeline.watch.watch", interrupted)
    result = runner.invoke(app, ["watch", str(tmp_path), "--interval", "1"])
    assert result.exit_code == 0
    assert "stopped (Ctrl-C): watched 4 poll(s), 2 scan(s), last step 17: no findings" in result.stdout


def test_sigterm_prints_the_summary_and_exits_143(tmp_path: Path) -> None:
    series = trl_series(train__entropy=after(60, 0.8, 0.05), train__reward=flat(0.5))
    (tmp_path / "events.out.tfevents.1700000000.host").write_bytes(
        b"".join(
            record(scalar_event(tag, float(values[step]), step, 1.7e9 + step))
            for step in range(150)
            for tag, values in series.items()
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "collapse_doctor", "watch", str(tmp_path), "--interval", "0.1", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stderr.readline().startswith("watching ")  # a note: stderr; the findings are the results
    first = process.stdout.readline()  # the first scan's first finding: the watch is polling now
    assert " CD50" in first, first
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "stopped (SIGTERM): watched " in out and "last step 149" in out


def test_finding_lines_show_control_characters_escaped() -> None:
    from types import SimpleNamespace

    from collapse_doctor.core.findings import Finding, Severity
    from collapse_doctor.pipeline.watch import finding_line

    evil = "fmt\x1b[31mRED\u202e"
    finding = Finding("CD101", Severity.WARNING, f"`{evil}` decays", f"`{evil}` fell", channels=(evil,), remedy="x")
    line = finding_line(SimpleNamespace(run=SimpleNamespace(name="run\x1b]0;t\x07")), finding)  # type: ignore[arg-type]
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b[31mRED\\u202e" in line
