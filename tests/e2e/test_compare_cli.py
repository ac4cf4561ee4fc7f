"""`collapse-doctor compare` and `scan --baseline` end to end: text (golden), JSON (schema), HTML, gate exit codes.

``UPDATE_GOLDEN=1`` writes tests/golden/compare/ from this run and skips the comparison; rerun without it to check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.schemas import schema_text
from tests.helpers.report import PAYLOAD_CHANNEL, PAYLOAD_SCRIPT, payload_table
from tests.helpers.tables import WriteTable

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_logs"
GOLDEN = ROOT / "tests" / "golden" / "compare"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
SCHEMA = json.loads(schema_text("compare"))
HEALTHY, SATURATING = "sample_logs/healthy.parquet", "sample_logs/saturating-format.parquet"
ENV = {"NO_COLOR": "1"}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # labels are the arguments as typed, relative to the checkout


def invoke(*args: str) -> Any:
    return runner.invoke(app, [*args, "--device", "cpu"], env=ENV)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README's demo comparison, once: its stdout, JSON and HTML."""
    out = tmp_path_factory.mktemp("demo")
    old = Path.cwd()
    os.chdir(ROOT)
    try:
        result = invoke(
            "compare",
            "sample_logs/demo-grpo",
            "sample_logs/demo-gdpo",
            "--json",
            str(out / "cmp.json"),
            "--html",
            str(out / "cmp.html"),
        )
    finally:
        os.chdir(old)
    return {"result": result, "json": json.loads((out / "cmp.json").read_text()), "html": (out / "cmp.html")}


def test_demo_comparison_text_is_the_golden(demo: dict[str, Any]) -> None:
    result = demo["result"]
    assert result.exit_code == 0, result.output  # no --gate: comparing is not judging
    golden = GOLDEN / "demo-grpo-vs-demo-gdpo.txt"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(result.stdout)
        pytest.skip(f"UPDATE_GOLDEN=1: wrote {golden.name}; rerun without it to compare")
    assert result.stdout == golden.read_text()
    assert not any(line != line.rstrip() for line in result.stdout.splitlines())


def test_demo_json_matches_the_schema_and_each_runs_own_scan(demo: dict[str, Any], tmp_path: Path) -> None:
    data = demo["json"]
    jsonschema.validate(data, SCHEMA)
    for run in data["runs"]:
        # The comparison shows what `scan` of the run alone says (same pipeline, same numbers).
        scan = tmp_path / "scan.json"
        invoke("scan", run["label"], "--json", str(scan))
        alone = json.loads(scan.read_text())
        assert run["verdict"] == alone["verdict"] and run["algorithm"] == alone["run"]["algorithm"]
        assert run["signal"] == alone["run"]["signal"]
        assert run["channels"] == alone["channels"]
        assert [f["code"] for f in run["findings"]] == [f["code"] for f in alone["findings"]]
    grpo, gdpo = data["runs"]
    assert (grpo["algorithm"], gdpo["algorithm"]) == ("grpo", "gdpo")
    by_key = {(f["code"], tuple(f["channels"])): f for f in data["findings"]}
    assert by_key[("CD402", ("format", "length"))]["present_in"] == ["sample_logs/demo-grpo"]
    # GDPO gives `length` its own z-score: its share of the advantage variance is larger under GDPO.
    share = {r["label"]: {c["channel"]: c for c in r["channels"]} for r in data["runs"]}
    assert (
        share["sample_logs/demo-gdpo"]["length"]["signal_share_gdpo"]
        > (share["sample_logs/demo-grpo"]["length"]["signal_share_grpo"])
    )
    assert data["aligned"]["x"] == list(range(100)) and data["align"] == "step"


def test_demo_html_is_one_offline_page_with_the_runs_overlaid(demo: dict[str, Any]) -> None:
    page = demo["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and "https://" not in page.split("<script>")[0]
    data = json.loads(page.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    ids = [c["id"] for c in data["charts"]]
    assert {"chart-rel-gain-0", "chart-signal-share-2", "chart-zero-advantage-share", "chart-adv-std"} <= set(ids)
    assert any(i.startswith("chart-scalar-") for i in ids)
    colors = {}
    for chart in data["charts"]:
        for trace in chart["data"]:
            colors.setdefault(trace["legendgroup"], set()).add(trace["line"]["color"])
    assert set(colors) == {"run0", "run1"} and all(len(c) == 1 for c in colors.values())  # one colour per run
    assert colors["run0"] != colors["run1"]


def test_gate_exit_codes(tmp_path: Path) -> None:
    regressed = invoke("compare", HEALTHY, SATURATING, "--gate", "--format", "json")
    assert regressed.exit_code == 1, regressed.output
    data = json.loads(regressed.stdout)
    jsonschema.validate(data, SCHEMA)
    new = data["gates"][0]["new_findings"]
    assert [(f["code"], f["channels"]) for f in new] == [("CD402", ["format", "correct"])]
    same = invoke("compare", SATURATING, SATURATING, "--gate")
    assert same.exit_code == 0, same.output
    assert "no regression against the baseline" in same.stdout


def test_scan_baseline_replaces_the_finding_gate_with_the_regression_gate() -> None:
    alone = invoke("scan", SATURATING)
    assert alone.exit_code == 1  # CD402 warning at the default --fail-on
    against_itself = invoke("scan", SATURATING, "--baseline", SATURATING)
    assert against_itself.exit_code == 0, against_itself.output  # the baseline shares the finding
    assert "new: none; shared: 1" in against_itself.stdout
    against_healthy = invoke("scan", SATURATING, "--baseline", HEALTHY)
    assert against_healthy.exit_code == 1
    assert "new: CD402 (format, correct)" in against_healthy.stdout


def test_margins_come_from_the_config_and_the_options(tmp_path: Path) -> None:
    run = tmp_path / "run.parquet"
    run.write_bytes((ROOT / SATURATING).read_bytes())
    (tmp_path / "collapse-doctor.toml").write_text("[gate]\nrel_gain_margin = 0.5\nzero_advantage_margin = 0.2\n")
    configured = json.loads(invoke("compare", str(run), str(run), "--gate", "--format", "json").stdout)["gates"][0]
    assert (configured["rel_gain_margin"], configured["zero_advantage_margin"]) == (0.5, 0.2)
    rel = next(c for c in configured["criteria"] if c["criterion"] == "rel_gain")
    assert rel["limit"] == pytest.approx(rel["baseline"] * 0.5, rel=1e-3)
    args = ("compare", str(run), str(run), "--gate", "--format", "json", "--rel-gain-margin", "0.1")
    overridden = json.loads(invoke(*args).stdout)["gates"][0]
    assert overridden["rel_gain_margin"] == 0.1 and overridden["zero_advantage_margin"] == 0.2


def test_fraction_alignment_lines_up_runs_of_different_lengths(tmp_path: Path) -> None:
    short, long = tmp_path / "short.parquet", tmp_path / "long.parquet"
    write_simulation(short, "healthy", steps=20, groups=8, group_size=4)
    write_simulation(long, "healthy", steps=50, groups=8, group_size=4)
    by_step = json.loads(invoke("compare", str(short), str(long), "--format", "json").stdout)
    assert by_step["aligned"]["x"] == list(range(50))
    assert by_step["aligned"]["series"]["adv_std"][str(short)][20:] == [None] * 30
    by_fraction = json.loads(invoke("compare", str(short), str(long), "--align", "fraction", "--format", "json").stdout)
    x = by_fraction["aligned"]["x"]
    assert len(x) == 20 and x[0] == 0 and x[-1] == 1
    assert None not in by_fraction["aligned"]["series"]["adv_std"][str(long)]


def _one_line_error(*args: str) -> str:
    result = runner.invoke(app, list(args), env=ENV)
    assert result.exit_code == 2, (args, result.output)
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return str(result.stderr)


def test_the_executable_reports_a_bad_run_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "collapse_doctor", "compare", HEALTHY, "missing.parquet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "missing.parquet" in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["compare", HEALTHY], "expected at least 2 runs"),
        (["compare", "sample_logs"], "sample_logs: one argument of"),  # a folder of runs: each run an argument
        (["compare", HEALTHY, "missing.parquet"], "missing.parquet"),
        (["compare", HEALTHY, HEALTHY, "--align", "time"], "--align 'time'"),
        (["compare", HEALTHY, HEALTHY, "--gate", "--zero-adv-margin", "2"], "--zero-adv-margin 2"),
        (["compare", HEALTHY, HEALTHY, "--rel-gain-margin", "0.1"], "need --gate"),
        (["compare", HEALTHY, HEALTHY, "--json", HEALTHY], "refusing to overwrite an input file"),
        (["compare", HEALTHY, HEALTHY, "--json", "x.json", "--html", "x.json"], "both write to"),
        (["compare", HEALTHY, f"{HEALTHY}@nosuchrun"], "nosuchrun"),
        (["scan", HEALTHY, "--baseline", "missing.parquet"], "missing.parquet"),
        (["scan", HEALTHY, "--rel-gain-margin", "0.1"], "need --baseline"),
        (["scan", SATURATING, "--baseline", HEALTHY, "--json", HEALTHY], "refusing to overwrite an input file"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_exits_2_with_one_line(args: list[str], expected: str) -> None:
    assert expected in _one_line_error(*args)


def test_payloads_in_run_and_channel_names_are_escaped(write_table: WriteTable, tmp_path: Path) -> None:
    folder = tmp_path / PAYLOAD_SCRIPT.replace("/", "_")
    path = write_table(payload_table(), f"{folder.name}/run.parquet")
    page = tmp_path / "cmp.html"
    result = invoke("compare", str(path), str(path), "--html", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert PAYLOAD_CHANNEL not in html and PAYLOAD_SCRIPT.replace("/", "_") not in html
    assert f"{folder.name}/run.parquet" in result.stdout  # the terminal shows the label as it is (no markup)


def test_run_selection_per_input_with_path_at_name(tmp_path: Path) -> None:
    for name, sample in (("exp-a", HEALTHY), ("exp-b", SATURATING)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rollouts.parquet").write_bytes((ROOT / sample).read_bytes())
    several = _one_line_error("compare", str(tmp_path), f"{tmp_path}@exp-b")
    assert "found 2 runs: exp-a, exp-b" in several and f"pick one as {tmp_path}@NAME" in several
    result = invoke("compare", f"{tmp_path}@exp-a", f"{tmp_path}@exp-b", "--gate", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [r["verdict"] for r in data["runs"]] == ["healthy", "at_risk"]
    assert data["gates"][0]["baseline"] == f"{tmp_path}@exp-a"


def test_scan_baseline_keeps_stdout_one_json_document() -> None:
    result = invoke("scan", SATURATING, "--baseline", HEALTHY, "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["verdict"] == "at_risk"  # the scan's document, alone
    assert "Regression gate (fail-on warning)" in result.stderr and "FAILED" in result.stderr


@pytest.mark.parametrize(("run", "baseline", "expected"), [(SATURATING, SATURATING, 0), (SATURATING, HEALTHY, 1)])
def test_the_gate_decides_the_json_and_the_junit_as_it_decides_the_exit_code(
    tmp_path: Path, run: str, baseline: str, expected: int
) -> None:
    # Against itself the run regresses nothing (exit 0) although CD402 fails the scan's own --fail-on; against the
    # healthy run it regresses (a new CD402: exit 1). Every output must say the same as the exit code: the JSON's
    # exit_code and its gates, the JUnit's failures (the gate's criteria; the findings are reported, not failed).
    import xml.etree.ElementTree as ET

    json_out, junit_out = tmp_path / "scan.json", tmp_path / "scan.xml"
    result = invoke("scan", run, "--baseline", baseline, "--json", str(json_out), "--junit", str(junit_out))
    assert result.exit_code == expected, result.output
    data = json.loads(json_out.read_text())
    jsonschema.validate(data, json.loads(schema_text("scan")))
    assert data["exit_code"] == expected and data["gates"][0]["exit_code"] == expected
    assert data["gates"][0]["baseline"] == baseline
    suite = ET.parse(junit_out).getroot()
    gate_cases = suite.findall("testcase[@classname='collapse-doctor.gate']")
    assert gate_cases and int(suite.get("failures", "0")) == sum(1 for c in gate_cases if c.find("failure") is not None)
    assert (int(suite.get("failures", "0")) > 0) == bool(expected)
    stdout_json = json.loads(invoke("scan", run, "--baseline", baseline, "--format", "json").stdout)
    assert stdout_json["exit_code"] == expected and stdout_json["gates"] == data["gates"]


def test_many_runs_are_one_row_each(tmp_path: Path) -> None:
    # 50 runs were 50 columns of a 120-column page: every cell blank. Beyond WIDE_RUNS each run is a row, and a
    # finding says in which runs it is, with its severity and onset there.
    from collapse_doctor.report.compare_text import WIDE_RUNS

    paths = []
    for i in range(WIDE_RUNS + 2):
        path = tmp_path / f"run{i}.parquet"
        path.write_bytes((ROOT / (SATURATING if i == 3 else HEALTHY)).read_bytes())
        paths.append(str(path))
    result = runner.invoke(app, ["compare", *paths, "--device", "cpu"], env={**ENV, "COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    budget = result.stdout.split("Verdicts and signal budgets", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in budget.splitlines() if line[:1].isalpha() and line.split()[0] in "ABCDEFGH"]
    assert [r.split()[:2] for r in rows] == [[letter, "AT" if letter == "D" else "HEALTHY"] for letter in "ABCDEFGH"]
    assert f"in 1 of {WIDE_RUNS + 2}: D warning @" in result.stdout


def test_the_gate_schema_is_the_compare_schemas() -> None:
    scan = json.loads(schema_text("scan"))
    assert scan["$defs"]["gate"] == SCHEMA["properties"]["gates"]["items"]


def test_the_readme_quotes_the_real_demo_output() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("$ collapse-doctor compare sample_logs/demo-grpo sample_logs/demo-gdpo\n", 1)[1]
    quoted = [line for line in block.split("```", 1)[0].splitlines() if line and line != "..."]
    golden = (GOLDEN / "demo-grpo-vs-demo-gdpo.txt").read_text().splitlines()
    assert len(quoted) >= 10
    missing = [line for line in quoted if line not in golden]
    assert not missing, missing
