"""`collapse-doctor compare` and `scan --baseline` end to end: text (golden), JSON (schema), HTML, gate exit codes.

``UPDATE_GOLDEN=1`` writes tests/golden/compare/ from this run and skips the comparison; rerun without it to check.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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
ENV = {"NO_COLOR": "1", "COLUMNS": None}  # tables at the default width off a terminal, whatever the shell says


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


# -- the conclusion ------------------------------------------------------------------------------------
FORMAT_ROW = np.array([0, 0, 0, 0, 1, 1, 1, 1], dtype=np.float32)
CORRECT_ROW = np.array([0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5], dtype=np.float32)
"""A group's rewards: `format` spans 1, `correct` 0.5; their totals (0, 0.5, 1, 1.5) never equal the group mean
(0.75), so no row of such a group has a zero advantage, and no two distinct vectors tie."""
GROUPS, STEPS = 10, 40


def designed_run(path: Path, silent: int, names: tuple[str, str] = ("format", "correct")) -> Path:
    """``GROUPS`` groups of 8 per step; the first ``silent`` all-fail (every reward 0: constant, zero advantage),
    the others ``FORMAT_ROW`` / ``CORRECT_ROW``. At every step, so also run-wide and "now": zero-advantage share
    ``silent / GROUPS``, rel_gain (mean within-group max - min) of the first channel ``(GROUPS - silent) / GROUPS``,
    of the second half of that."""
    quiet = np.zeros(8, dtype=np.float32)
    groups = [g < silent for _ in range(STEPS) for g in range(GROUPS)]
    table = pa.table(
        {
            "step": np.repeat(np.arange(STEPS, dtype=np.int64), GROUPS * 8),
            "group_id": np.tile(np.repeat(np.arange(GROUPS, dtype=np.int64), 8), STEPS),
            f"reward/{names[0]}": np.concatenate([quiet if q else FORMAT_ROW for q in groups]),
            f"reward/{names[1]}": np.concatenate([quiet if q else CORRECT_ROW for q in groups]),
        }
    )
    pq.write_table(table, path)
    return path


def zero_share(silent: int) -> str:
    return f"{silent / GROUPS:.0%}"


def rel_gain(silent: int, span: float = 1.0) -> str:
    return f"{span * (GROUPS - silent) / GROUPS:.2f}"


def conclusion_lines(stdout: str) -> str:
    """The paragraph the text opens with, its lines joined (a long conclusion wraps)."""
    return " ".join(line.strip() for line in stdout.split("\n\n", 1)[0].splitlines())


@pytest.fixture(scope="module")
def designed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("designed")
    return {
        "1 silent": str(designed_run(out / "one.parquet", 1)),
        "1 silent again": str(designed_run(out / "one-again.parquet", 1)),
        "2 silent": str(designed_run(out / "two.parquet", 2)),
        "4 silent": str(designed_run(out / "four.parquet", 4)),
        "format renamed": str(designed_run(out / "renamed.parquet", 1, ("fmt", "correct"))),
    }


@pytest.mark.parametrize(
    ("baseline", "run", "expected", "exit_code"),
    [
        # 1 -> 4 silent groups: share 10% -> 40% (+30 points > 5), rel_gain 0.9 -> 0.6 and 0.45 -> 0.3 (-33% < -25%).
        (
            "1 silent",
            "4 silent",
            f"B is worse than A: zero-advantage share {zero_share(1)} -> {zero_share(4)}, `format` rel_gain"
            f" {rel_gain(1)} -> {rel_gain(4)}, `correct` rel_gain {rel_gain(1, 0.5)} -> {rel_gain(4, 0.5)};"
            " the gate fails B",
            1,
        ),
        # 1 -> 2: +10 points fails; rel_gain 0.9 -> 0.8 is -11%, within the margin: not named.
        (
            "1 silent",
            "2 silent",
            f"B is worse than A: zero-advantage share {zero_share(1)} -> {zero_share(2)}; the gate fails B",
            1,
        ),
        # 4 -> 1: 30 points fewer (> 5), rel_gain +50% (> +25%): better by the gate's margins.
        (
            "4 silent",
            "1 silent",
            f"B is better than A: zero-advantage share {zero_share(4)} -> {zero_share(1)}, `format` rel_gain"
            f" {rel_gain(4)} -> {rel_gain(1)}, `correct` rel_gain {rel_gain(4, 0.5)} -> {rel_gain(1, 0.5)};"
            " the gate passes B",
            0,
        ),
        (
            "1 silent",
            "1 silent again",
            "B is no worse than A on every measure compared; the gate passes B",
            0,
        ),
        # The same numbers, but `format` is `fmt` in B: not compared, which counts against B.
        (
            "1 silent",
            "format renamed",
            "B cannot be cleared against A: `format` rel_gain not compared (no such channel in B), which counts"
            " against B; the gate fails B",
            1,
        ),
    ],
    ids=["worse", "worse-share-only", "better", "no-worse", "not-comparable"],
)
def test_the_conclusion_comes_first_and_follows_the_runs_math(
    designed: dict[str, str], baseline: str, run: str, expected: str, exit_code: int, tmp_path: Path
) -> None:
    result = invoke("compare", designed[baseline], designed[run], "--gate", "--json", str(tmp_path / "cmp.json"))
    assert result.exit_code == exit_code, result.output
    assert conclusion_lines(result.stdout) == expected
    assert result.stdout.split("\n\n", 1)[1].startswith("Compare 2 runs")
    data = json.loads((tmp_path / "cmp.json").read_text())
    jsonschema.validate(data, SCHEMA)
    (entry,) = data["conclusion"]["runs"]
    assert entry["gate"] == ("fails" if exit_code else "passes") and data["conclusion"]["gated"]
    # Without --gate: the same conclusion, said as what --gate would do, and exit 0.
    ungated = invoke("compare", designed[baseline], designed[run])
    assert ungated.exit_code == 0
    would = expected.replace("the gate fails B", "--gate would fail B").replace(
        "the gate passes B", "--gate would pass B"
    )
    assert conclusion_lines(ungated.stdout) == would


def test_more_than_two_runs_are_each_concluded_against_the_first(designed: dict[str, str]) -> None:
    runs = [designed[k] for k in ("1 silent", "4 silent", "1 silent again", "format renamed")]
    result = invoke("compare", *runs, "--gate")
    assert result.exit_code == 1, result.output  # B and D regressed
    head = result.stdout.split("\n\n", 1)[0]
    starts = [line.split(":")[0].split(";")[0] for line in head.splitlines() if not line.startswith("  ")]
    assert starts == [
        "B is worse than A",
        "C is no worse than A on every measure compared",
        "D cannot be cleared against A",
    ]


def test_the_demo_conclusion_follows_the_rollouts_the_trainer_wrote() -> None:
    """The expected measures come from the rollout files themselves: the zero-advantage share from the advantages
    the trainers logged (a group whose advantages span < 1e-4 gives none, else its rows with |A| < 1e-4), rel_gain
    now from the rewards (per step the mean within-group max - min; the median of the last 10% of steps), and the
    gate's margins (5 points, 25%) decide which are named."""
    import glob

    def measured(run: str) -> tuple[float, dict[str, float]]:
        parts = sorted(glob.glob(str(SAMPLES / run / "rollouts" / "*.parquet")))
        table = pa.concat_tables([pq.read_table(p) for p in parts])
        step = table.column("step").to_numpy().reshape(-1, 8)
        group = table.column("group_id").to_numpy().reshape(-1, 8)
        assert (step == step[:, :1]).all() and (group == group[:, :1]).all()  # groups of 8, in order
        adv = table.column("advantage").to_numpy().astype(np.float64).reshape(-1, 8)
        silent = (adv.max(axis=1) - adv.min(axis=1)) < 1e-4
        zero = np.where(silent, 8, (np.abs(adv) < 1e-4).sum(axis=1)).sum() / adv.size
        steps = np.unique(step[:, 0])
        tail = steps[len(steps) - max(1, len(steps) // 10) :]
        now = {}
        for channel in ("format", "correct", "length"):
            r = table.column(f"reward/{channel}").to_numpy().astype(np.float64).reshape(-1, 8)
            span = r.max(axis=1) - r.min(axis=1)
            now[channel] = float(np.median([span[step[:, 0] == s].mean() for s in tail]))
        return float(zero), now

    (zero_a, now_a), (zero_b, now_b) = measured("demo-grpo"), measured("demo-gdpo")
    result = invoke("compare", "sample_logs/demo-grpo", "sample_logs/demo-gdpo", "--gate")
    text = conclusion_lines(result.stdout)
    assert zero_b - zero_a > 0.05 and f"zero-advantage share {zero_a:.0%} -> {zero_b:.0%}" in text
    for channel in now_a:
        worse, better = now_b[channel] < 0.75 * now_a[channel], now_b[channel] > 1.25 * now_a[channel]
        named = f"`{channel}` rel_gain {now_a[channel]:.2f} -> {now_b[channel]:.2f}"
        assert (named in text) == (worse or better), (channel, text)
    assert text.startswith("B is worse than A") and text.endswith("the gate fails B") and result.exit_code == 1


SAMPLE_PAIRS = [
    ("sample_logs/demo-grpo", "sample_logs/demo-gdpo"),
    ("sample_logs/demo-gdpo", "sample_logs/demo-grpo"),
    (HEALTHY, SATURATING),
    (SATURATING, HEALTHY),
    (HEALTHY, HEALTHY),
    (HEALTHY, "sample_logs/single-reward.parquet"),
    (HEALTHY, "sample_logs/collinear.parquet"),
    (HEALTHY, "sample_logs/trl-tensorboard"),
    ("sample_logs/trl-tensorboard", HEALTHY),
    ("sample_logs/tied-sums.parquet", "sample_logs/outlier-groups.parquet"),
]


def test_the_conclusion_says_the_gate_fails_exactly_when_it_exits_1(designed: dict[str, str], tmp_path: Path) -> None:
    """Every pair, samples and designed runs alike: the text says "the gate fails B" iff `--gate` exits 1 (and
    "passes" iff 0), and the JSON's conclusion says the same as its gates."""
    pairs = [*SAMPLE_PAIRS, *itertools.permutations(designed.values(), 2)]
    outcomes = set()
    for baseline, run in pairs:
        out = tmp_path / "cmp.json"
        result = invoke("compare", baseline, run, "--gate", "--json", str(out))
        assert result.exit_code in (0, 1), result.output
        text = conclusion_lines(result.stdout)
        assert ("the gate fails B" in text) == (result.exit_code == 1), (baseline, run, text)
        assert ("the gate passes B" in text) == (result.exit_code == 0), (baseline, run, text)
        data = json.loads(out.read_text())
        (entry,) = data["conclusion"]["runs"]
        assert (entry["gate"] == "fails") == data["gates"][0]["failed"] == (result.exit_code == 1)
        outcomes.add((entry["verdict"], result.exit_code))
    # The pairs cover every kind of answer.
    assert outcomes == {("worse", 1), ("not_cleared", 1), ("no_worse", 0), ("better", 0)}


def test_scan_baseline_opens_its_gate_with_the_conclusion(designed: dict[str, str]) -> None:
    result = invoke("scan", designed["4 silent"], "--baseline", designed["1 silent"])
    assert result.exit_code == 1, result.output
    gate = result.stdout.split("\n\nThe run is ", 1)[1]
    first = " ".join(line.strip() for line in ("The run is " + gate).split("\n\n", 1)[0].splitlines())
    assert first == (
        f"The run is worse than the baseline: zero-advantage share {zero_share(1)} -> {zero_share(4)}, `format`"
        f" rel_gain {rel_gain(1)} -> {rel_gain(4)}, `correct` rel_gain {rel_gain(1, 0.5)} -> {rel_gain(4, 0.5)};"
        " the gate fails the run"
    )
    assert gate.index("the gate fails the run") < gate.index("Regression gate (fail-on warning)")


def test_the_demo_json_has_the_conclusion_ungated(demo: dict[str, Any]) -> None:
    block = demo["json"]["conclusion"]
    assert (block["baseline"], block["gated"]) == ("sample_logs/demo-grpo", False)
    (entry,) = block["runs"]
    assert (entry["run"], entry["verdict"], entry["gate"]) == ("sample_logs/demo-gdpo", "worse", "fails")
    assert demo["json"]["exit_code"] == 0 and demo["json"]["gates"] == []  # concluding is not gating


def test_the_docs_quote_the_conclusion_the_demo_prints(demo: dict[str, Any]) -> None:
    """docs/usage.md quotes the text's first lines, docs/report.md the page's sentence, of the demo comparison."""
    import html
    import re

    usage = (ROOT / "docs" / "usage.md").read_text()
    block = usage.split("$ collapse-doctor compare sample_logs/demo-grpo sample_logs/demo-gdpo\n", 1)[1]
    quoted = [line.strip() for line in block.split("```", 1)[0].splitlines() if line.strip()]
    printed = demo["result"].stdout.split("\n\n", 1)[0].splitlines()
    # The docs show a terminal (the sentence wrapped at its width); off a terminal it is one line (issue 27).
    assert " ".join(quoted) == " ".join(line.strip() for line in printed)
    page = demo["html"].read_text()
    sentence = re.search(r'<p class="finding conclusion"[^>]*>(.*?)</p>', page)
    assert sentence is not None
    on_page = html.unescape(re.sub(r"</?code>", "`", sentence.group(1)))
    report = (ROOT / "docs" / "report.md").read_text().split("## The comparison page", 1)[1]
    first = report.split("\n> B is worse", 1)[1].split("\n>\n", 1)[0]
    assert " ".join(("> B is worse" + first).replace("\n> ", " ").lstrip("> ").split()) == on_page
