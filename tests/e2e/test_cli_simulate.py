"""`collapse-doctor simulate` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from collapse_doctor.cli.app import app

runner = CliRunner()


def test_simulate_writes_run_with_ground_truth(tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    args = ["simulate", "saturating-format", "-o", str(out), "--steps", "40", "--groups", "4"]
    result = runner.invoke(app, [*args, "--group-size", "8", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "1,280 rows, 40 steps, channels format, correct; ground truth: onset step 16" in result.stderr
    table = pq.read_table(out)
    assert table.num_rows == 40 * 4 * 8
    truth = json.loads(table.schema.metadata[b"collapse_doctor.ground_truth"])
    assert truth["scenario"] == "saturating-format"
    assert truth["affected_channels"] == ["format"]
    # Same seed, same numbers; the shipped samples are made the same way.
    again = tmp_path / "again.parquet"
    assert runner.invoke(app, [*args[:3], str(again), *args[4:], "--group-size", "8", "--seed", "3"]).exit_code == 0
    assert pq.read_table(again).equals(table)


def test_simulated_run_feeds_advantages(tmp_path: Path) -> None:
    run = tmp_path / "run.parquet"
    assert runner.invoke(app, ["simulate", "tied-sums", "-o", str(run), "--steps", "5", "--groups", "3"]).exit_code == 0
    out = tmp_path / "adv.parquet"
    result = runner.invoke(app, ["advantages", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    names = pq.read_schema(out).names
    assert {"adv/grpo", "adv/gdpo", "adv/format", "adv/correct", "adv/reasoning", "advantage"} <= set(names)


def test_simulate_bad_options(tmp_path: Path) -> None:
    cases = [
        (["simulate", "nope", "-o", str(tmp_path / "x.parquet")], "unknown scenario 'nope'"),
        (["simulate", "healthy", "-o", str(tmp_path / "x.parquet"), "--onset-step", "3"], "--onset-step"),
        (["simulate", "healthy", "-o", str(tmp_path / "no" / "x.parquet")], "does not exist"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
