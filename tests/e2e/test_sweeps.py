"""A sweep: several runs in one scan give one summary table first (worst runs on top), then each run's detail;
``--summary-only`` stops after the table; ``@FILE`` lists the runs; every output covers every run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.tables import make_table

runner = CliRunner()


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Three runs: two healthy, one whose groups hold one rollout each (CD102 critical: every advantage is 0)."""
    root = tmp_path / "sweep"
    for name, seed in (("lr-1e-6", 0), ("lr-3e-6", 1)):
        (root / name).mkdir(parents=True)
        pq.write_table(make_table(steps=12, groups=16, seed=seed), root / name / "rollouts.parquet")
    (root / "lr-1e-5").mkdir()
    rng = np.random.default_rng(2)
    n = 12 * 64
    singles = pa.table(
        {
            "step": np.repeat(np.arange(12), 64),
            "group_id": np.tile(np.arange(64), 12),
            "reward/format": (rng.random(n) < 0.5) * 1.0,
            "reward/correct": rng.random(n),
        }
    )
    pq.write_table(singles, root / "lr-1e-5" / "rollouts.parquet")
    return root


def test_summary_table_comes_first_worst_run_on_top(sweep: Path) -> None:
    result = runner.invoke(app, ["scan", str(sweep)])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "3 runs: worst COLLAPSED, 1 failing the gate"
    table = lines[1 : lines.index("")]
    assert table[2].startswith("lr-1e-5") and "COLLAPSED" in table[2] and "CD102" in table[2]
    assert sum("HEALTHY" in row for row in table) == 2
    assert result.stdout.count("\nrun lr-") == 3  # then each run's detail


def test_summary_only(sweep: Path) -> None:
    result = runner.invoke(app, ["scan", str(sweep), "--summary-only"])
    assert result.exit_code == 1 and "Channels" not in result.stdout and len(result.stdout.splitlines()) == 6


def test_a_list_file_names_the_runs(sweep: Path, tmp_path: Path) -> None:
    listing = sweep / "runs.txt"
    listing.write_text("# the two healthy runs\nlr-1e-6\n\nlr-3e-6\n")
    result = runner.invoke(app, ["scan", f"@{listing}", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert sorted(r["run"]["name"] for r in json.loads(result.stdout)["runs"]) == ["lr-1e-6", "lr-3e-6"]
    missing = runner.invoke(app, ["scan", f"@{tmp_path / 'nope.txt'}"])
    assert missing.exit_code == 2 and "cannot read the list file" in missing.stderr
    # an entry that does not exist is named with its list, its line and the directory it was looked for in
    listing.write_text("lr-1e-6\nlr-typo\n")
    typo = runner.invoke(app, ["scan", f"@{listing}"])
    assert typo.exit_code == 2
    assert typo.stderr.startswith(f"error: @{listing} line 2: lr-typo: no such file or directory (relative to the list")
    assert str(sweep.resolve()) in typo.stderr
    listing.write_text(f"@{listing}\n")  # a list naming a list (itself): said, not "no such file"
    nested = runner.invoke(app, ["scan", f"@{listing}"])
    assert nested.exit_code == 2 and "a list file cannot name another list file" in nested.stderr


def test_json_and_junit_cover_every_run(sweep: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["scan", str(sweep), "--json", str(tmp_path / "s.json"), "--junit", str(tmp_path / "j.xml")]
    )
    assert result.exit_code == 1
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["verdict"] == "collapsed" and data["exit_code"] == 1 and len(data["runs"]) == 3
    assert (tmp_path / "j.xml").read_text().count("<testsuite ") == 3
    assert "wrote " in result.stderr and "JSON of 3 runs" in result.stderr


def test_a_run_that_cannot_be_read_does_not_lose_the_others(sweep: Path, tmp_path: Path) -> None:
    """A corrupt run among three readable ones: each readable run is diagnosed as alone, the broken one is named
    in every output (summary row, JSON ``failed_runs``, a JUnit error) and the exit code is 2, the code of bad
    input, whatever the other verdicts."""
    import jsonschema

    from tests.unit.report.test_outputs import SCHEMA

    (sweep / "zz-broken").mkdir()
    (sweep / "zz-broken" / "rollouts.parquet").write_bytes(b"PAR1" + b"\0" * 32 + b"PAR1")
    out, junit = tmp_path / "sweep.json", tmp_path / "sweep.xml"
    result = runner.invoke(app, ["scan", str(sweep), "--json", str(out), "--junit", str(junit)])
    assert result.exit_code == 2
    assert result.stdout.splitlines()[0] == "4 runs: worst COLLAPSED, 1 failing the gate, 1 not scanned (error)"
    assert "zz-broken" in result.stdout.splitlines()[3] and "ERROR" in result.stdout.splitlines()[3]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and error_lines[0].startswith("error: run zz-broken: ")
    assert "zz-broken/rollouts.parquet" in error_lines[0]
    document = json.loads(out.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["exit_code"] == 2 and [f["run"] for f in document["failed_runs"]] == ["zz-broken"]
    assert sorted(r["run"]["name"] for r in document["runs"]) == ["lr-1e-5", "lr-1e-6", "lr-3e-6"]
    alone = runner.invoke(app, ["scan", str(sweep / "lr-1e-5"), "--format", "json"])
    ours = next(r for r in document["runs"] if r["run"]["name"] == "lr-1e-5")
    assert ours["findings"] == json.loads(alone.stdout)["findings"]
    xml = junit.read_text()
    assert 'name="collapse-doctor: zz-broken"' in xml and 'errors="1"' in xml and "<error " in xml


def test_every_run_failing_is_one_error(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rollouts.parquet").write_bytes(b"PAR1" + b"\0" * 32 + b"PAR1")
    result = runner.invoke(app, ["scan", str(tmp_path)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: 2 of 2 runs could not be scanned: a: ")
