"""The terminal conventions of issue 27: -q/-v, --color with NO_COLOR/FORCE_COLOR, shell completion, results on
stdout and everything else on stderr, tables that keep a row on one line at 80 and 120 columns, no hard wrap off a
terminal, choices in --help, and the gate in `scan --baseline --markdown`. Real sample runs, real output."""

from __future__ import annotations

import html
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from collapse_doctor.cli.app import COMMANDS, app
from tests.helpers.scalar_runs import flat, trl_series, write_events

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
GRPO, GDPO = "sample_logs/demo-grpo", "sample_logs/demo-gdpo"
HEALTHY, SATURATING = "sample_logs/healthy.parquet", "sample_logs/saturating-format.parquet"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PLAIN = {"NO_COLOR": "", "FORCE_COLOR": ""}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env={**PLAIN, **(env or {})})


@pytest.fixture(scope="module")
def demo_scan() -> dict[str, Any]:
    """`scan demo-grpo` at each verbosity, once."""
    out = {}
    for name, flags in {"normal": [], "quiet": ["-q"], "verbose": ["-v"]}.items():
        out[name] = runner.invoke(app, ["scan", GRPO, "--device", "cpu", *flags], env=PLAIN)
    return out


# -- -q / -v ---------------------------------------------------------------------------------------
def test_quiet_prints_the_verdict_line_only(demo_scan: dict[str, Any]) -> None:
    normal, quiet = demo_scan["normal"], demo_scan["quiet"]
    assert quiet.exit_code == normal.exit_code == 1
    assert quiet.stdout == normal.stdout.splitlines()[0] + "\n"
    assert quiet.stdout.startswith("AT RISK ") and "of rollouts gave no gradient" in quiet.stdout
    assert quiet.stderr == ""
    before = invoke("-q", "scan", GRPO, "--device", "cpu")  # before the command too
    assert before.stdout == quiet.stdout


def test_verbose_shows_evidence_and_skipped_checks_in_full(demo_scan: dict[str, Any]) -> None:
    normal, verbose = demo_scan["normal"].stdout, demo_scan["verbose"].stdout
    assert "(+8 more: -v shows all)" in normal and "-v shows all" not in verbose
    assert "identical_completion_group_share=0" in verbose and "identical_completion_group_share" not in normal
    skipped = [line.strip() for line in verbose.splitlines() if line.strip().startswith("skipped ")]
    assert [line.split(":")[0] for line in skipped] == [
        f"skipped {c}" for c in ("CD502", "CD506", "CD507", "CD510", "CD511")
    ]
    assert "not enough data to judge: `train/reward` has 10 logged point(s)" in verbose
    assert "skipped 5 checks: CD502, CD506, CD510 (a series the scalar log lacks); CD507, CD511" in normal


def test_quiet_and_verbose_together_is_a_usage_error() -> None:
    result = invoke("scan", GRPO, "-q", "-v")
    assert result.exit_code == 2 and result.stderr.startswith("error: -q/--quiet and -v/--verbose")
    assert result.stderr.count("\n") == 1


def test_quiet_report_compare_and_scan_baseline(tmp_path: Path) -> None:
    report = invoke("report", HEALTHY, "--html", str(tmp_path / "r.html"), "-q", "--device", "cpu")
    assert report.exit_code == 0 and report.stderr == ""
    assert report.stdout.startswith("HEALTHY ") and report.stdout.count("\n") == 1
    compare = invoke("compare", GRPO, GDPO, "-q", "--device", "cpu")
    assert compare.exit_code == 0
    assert compare.stdout == "B is worse than A: " + compare.stdout.split("B is worse than A: ", 1)[1]
    assert compare.stdout.count("\n") == 1 and compare.stdout.rstrip().endswith("--gate would fail B")
    gated = invoke("scan", SATURATING, "--baseline", HEALTHY, "-q", "--device", "cpu")
    assert gated.exit_code == 1
    lines = gated.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("AT RISK") and lines[1].startswith("The run is worse than")


# -- --color, NO_COLOR, FORCE_COLOR ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "env", "coloured"),
    [
        ([], {}, False),  # not a terminal
        ([], {"FORCE_COLOR": "1"}, True),
        ([], {"FORCE_COLOR": "0"}, True),  # any non-empty value (force-color.org)
        ([], {"NO_COLOR": "1"}, False),
        ([], {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),  # NO_COLOR wins, as in rich and CMake
        (["--color", "always"], {"NO_COLOR": "1"}, True),  # the option beats both variables
        (["--color", "never"], {"FORCE_COLOR": "1"}, False),
        (["--color", "auto"], {"FORCE_COLOR": "1"}, True),
    ],
)
def test_color_follows_the_option_then_the_environment(flags: list[str], env: dict[str, str], coloured: bool) -> None:
    result = invoke("scan", HEALTHY, "-q", "--device", "cpu", *flags, env=env)
    assert result.exit_code == 0
    assert bool(ANSI.search(result.stdout)) is coloured, result.stdout
    assert ANSI.sub("", result.stdout).startswith("HEALTHY ")


def test_bad_color_is_one_line() -> None:
    result = invoke("compare", HEALTHY, HEALTHY, "--color", "sometimes")
    assert result.exit_code == 2
    assert result.stderr == "error: --color 'sometimes' is not one of auto, always, never\n"


# -- shell completion --------------------------------------------------------------------------------
def _complete(words: str) -> list[str]:
    env = {**os.environ, "_COLLAPSE_DOCTOR_COMPLETE": "complete_bash", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    out = subprocess.run([sys.executable, "-m", "collapse_doctor"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_shell_completion_completes_commands_options_and_choices() -> None:
    assert {"scan", "compare", "report", "watch"} <= set(_complete("collapse-doctor "))
    assert _complete("collapse-doctor scan --format ") == ["text", "json", "github"]
    assert _complete("collapse-doctor scan --color a") == ["auto", "always"]
    assert "--quiet" in _complete("collapse-doctor compare --q")
    script = invoke("--show-completion", "bash")
    assert script.exit_code == 0 and "_COLLAPSE_DOCTOR_COMPLETE" in script.stdout


# -- stdout for results, stderr for everything else --------------------------------------------------------------
def _warned_run(tmp_path: Path) -> Path:
    """A Parquet run whose reading gives a warning (NaN rewards)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(ROOT / HEALTHY)
    column = table.column("reward/style").to_pylist()
    column[:3] = [float("nan")] * 3
    table = table.set_column(table.schema.get_field_index("reward/style"), "reward/style", pa.array(column))
    path = tmp_path / "nan.parquet"
    pq.write_table(table, path)
    return path


def test_scan_streams(tmp_path: Path) -> None:
    run = _warned_run(tmp_path)
    result = invoke("scan", str(run), "--json", str(tmp_path / "s.json"), "--device", "cpu")
    assert result.exit_code in (0, 1), result.output
    assert result.stdout.startswith(("HEALTHY", "AT RISK")) and "Findings (" in result.stdout
    assert not re.search(r"^\s*(warning|wrote) ", result.stdout, re.M)
    assert "warning: reward/style: 3 NaN" in result.stderr, result.stderr
    assert re.search(r"^wrote .*s\.json \([\d.]+ [kM]B\): JSON$", result.stderr, re.M), result.stderr
    quiet = invoke("scan", str(run), "--json", str(tmp_path / "s.json"), "--device", "cpu", "-q")
    assert quiet.stderr == ""
    as_json = invoke("scan", str(run), "--format", "json", "--device", "cpu")
    assert json.loads(as_json.stdout)["verdict"] and "warning: reward/style" in as_json.stderr


def test_report_streams(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = invoke("report", str(_warned_run(tmp_path)), "--html", str(out), "--device", "cpu")
    assert result.exit_code in (0, 1), result.output
    assert result.stdout.count("\n") == 1 and "no gradient" in result.stdout and "wrote" not in result.stdout
    assert f"wrote {out} (" in result.stderr and "warning: reward/style: 3 NaN" in result.stderr
    to_stdout = invoke("report", HEALTHY, "--html", "-", "--device", "cpu")  # the page on stdout: the rest on stderr
    assert to_stdout.stdout.lstrip().startswith("<!DOCTYPE html>") and to_stdout.stderr.startswith("HEALTHY")


def test_compare_streams(tmp_path: Path) -> None:
    result = invoke("compare", HEALTHY, SATURATING, "--json", str(tmp_path / "c.json"), "--device", "cpu")
    assert result.exit_code == 0
    assert "Compare 2 runs" in result.stdout and "wrote" not in result.stdout
    assert re.fullmatch(r"wrote \S+c\.json \([\d.]+ kB\): comparison JSON of 2 runs\n", result.stderr)


def test_watch_streams(tmp_path: Path) -> None:
    write_events(tmp_path, trl_series(train__reward=flat(0.5)))
    result = invoke("watch", str(tmp_path), "--interval", "0", "--max-polls", "1", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"watching {tmp_path} every 0 s") and "watching" not in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("watched 1 poll(s)")
    quiet = invoke("watch", str(tmp_path), "--interval", "0", "--max-polls", "1", "--device", "cpu", "-q")
    assert quiet.stderr == "" and quiet.stdout.startswith("watched 1 poll(s)")


def test_advantages_simulate_explain_and_schema_streams(tmp_path: Path) -> None:
    adv = invoke("advantages", HEALTHY, "-o", str(tmp_path / "a.parquet"), "--device", "cpu")
    assert adv.exit_code == 0 and adv.stdout == "" and adv.stderr.startswith("wrote ")
    assert invoke("advantages", HEALTHY, "-o", str(tmp_path / "a.parquet"), "--device", "cpu", "-q").stderr == ""
    sim = invoke("simulate", "healthy", "-o", str(tmp_path / "s.parquet"), "--steps", "8", "--groups", "4")
    assert sim.exit_code == 0 and sim.stdout == "" and sim.stderr.startswith("wrote ")
    explain = invoke("explain", "CD101")
    assert explain.stdout.startswith("CD101 ") and explain.stderr == ""
    schema = invoke("schema", "scan")
    assert json.loads(schema.stdout) and schema.stderr == ""


def test_retrain_dry_run_streams(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    result = invoke("retrain", "--demo", "--dry-run", "--output-dir", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert "GRPOConfig" in result.stdout and result.stderr == ""  # the plan is the dry run's result


# -- tables at 80 and 120 columns, no hard wrap off a terminal -------------------------------------------------
def _rendered(width: int, *, terminal: bool = True) -> tuple[str, Any]:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose
    from collapse_doctor.report.text import render_text

    diagnosis = diagnose([GRPO], ScanOptions(device="cpu"))
    out = io.StringIO()
    render_text(diagnosis, out, color=False, width=width, terminal=terminal)
    return out.getvalue(), diagnosis


def _table_rows(text: str, title: str) -> list[str]:
    block = text.split(title, 1)[1].split("\n\n", 1)[0].splitlines()
    rule = next(i for i, line in enumerate(block) if set(line.strip()) == {"─"})
    return block[rule + 1 :]


@pytest.mark.parametrize("width", [80, 120])
def test_every_table_row_keeps_one_line(width: int) -> None:
    text, diagnosis = _rendered(width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    rows = _table_rows(text, "Channels (now")
    channels = [row["channel"] for row in diagnosis.channel_table()]
    assert [row.split()[0] for row in rows] == channels  # one line per channel, nothing wrapped under it
    for row, channel in zip(rows, diagnosis.channel_table(), strict=True):
        assert row.rstrip().endswith(f"{channel['reward_mean']:.2g}"[:3]) or "ranking" in row or "floor" in row
        assert ("(step " in row) is (width >= 110)  # the narrow layout shows the peak's step as @N
    for finding in diagnosis.findings:  # a finding's first line: severity, code, title; its steps fold under it
        start = f"  {finding.severity.label.upper():8s} {finding.code}  {finding.title[:20]}"
        assert any(line.startswith(start) for line in lines), start


@pytest.mark.parametrize("width", [80, 120])
def test_compare_tables_keep_one_line_per_row(width: int, tmp_path: Path) -> None:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.compare import compare_runs
    from collapse_doctor.report.compare_text import render_comparison

    comparison, _ = compare_runs([GRPO, GDPO], ScanOptions(device="cpu"), gate=lambda config: _settings(config))
    out = io.StringIO()
    render_comparison(comparison, out, color=False, width=width, terminal=True)
    text = out.getvalue()
    assert all(len(line) <= width for line in text.splitlines())
    rows = _table_rows(text, "Channels (now")
    assert len(rows) == 2 * len(comparison.channels)  # a row per channel and run, each one line
    assert [row.split()[1] if row[0] != " " else row.split()[0] for row in rows] == ["A", "B"] * len(
        comparison.channels
    )
    findings = [row for row in _table_rows(text, "Findings by run") if not row.startswith("  (")]
    assert len(findings) == len(comparison.findings) and all(re.match(r"CD\d{3} ", row) for row in findings)
    gate = text.split("Regression gate", 1)[1].splitlines()
    criteria = [line for line in gate if line.startswith(("zero", "verdict", "`", "new", "rel_gain", "checks"))]
    assert criteria and all(line.rstrip().endswith(("ok", "FAILED")) for line in criteria)


def _settings(config: Any) -> Any:
    from collapse_doctor.cli.options import gate_settings

    return gate_settings(config, None, None)


def test_off_a_terminal_every_logical_line_is_whole() -> None:
    text, diagnosis = _rendered(80, terminal=False)
    lines = text.splitlines()
    for finding in diagnosis.findings:
        assert f"      {finding.message}" in lines  # the message whole, on one line
        assert f"      remedy: {finding.remedy}" in lines
    # End to end: the CLI's stdout is not a terminal; tables follow COLUMNS, prose is never broken.
    result = invoke("scan", GRPO, "--device", "cpu", env={"COLUMNS": "80"})
    assert any(len(line) > 120 for line in result.stdout.splitlines())  # a long message, whole
    assert all(len(row) <= 80 for row in _table_rows(result.stdout, "Channels (now"))
    compare = invoke("compare", GRPO, GDPO, "--device", "cpu")
    assert compare.stdout.splitlines()[0].endswith("--gate would fail B")  # the conclusion, one line


# -- choices in --help ------------------------------------------------------------------------------------
EXPECTED_CHOICES = {
    ("scan", "--format"): ["text", "json", "github"],
    ("scan", "--algo"): ["auto", "grpo", "gdpo"],
    ("scan", "--fail-on"): ["never", "info", "warning", "critical"],
    ("scan", "--device"): ["auto", "cpu", "cuda"],
    ("scan", "--color"): ["auto", "always", "never"],
    ("compare", "--format"): ["text", "json"],
    ("compare", "--align"): ["step", "fraction"],
    ("watch", "--fail-on"): ["never", "info", "warning", "critical"],
    ("advantages", "--convention"): ["trl", "verl", "paper"],
    ("advantages", "--scale"): ["group", "batch", "none"],
    ("retrain", "--algo"): ["grpo", "gdpo", "gdpo-dynamic"],
    ("retrain", "--demo-task"): ["copy", "sums"],
    ("simulate", "SCENARIO"): ["healthy", "single-reward", "saturating-format", "tied-sums", "collinear"],
    ("schema", "DOCUMENT"): ["scan", "compare"],
}
LISTED = re.compile(r"\b([a-z][\w-]*), ([a-z][\w-]*)(?: \([^)]*\))?,? or ([a-z][\w-]*)\b")


@pytest.mark.parametrize("name", [command.__name__ for command in COMMANDS])
def test_every_option_with_a_fixed_set_lists_its_choices(name: str) -> None:
    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    help_text = " ".join(invoke(name, "--help", env={"COLUMNS": "300"}).stdout.split())
    seen = set()
    for param in command.params:
        names = [*param.opts, str(param.metavar or "").upper()]
        key = next(((name, n) for n in names if (name, n) in EXPECTED_CHOICES), None)
        metavar = param.metavar or ""
        choices = metavar.strip("<>").split("[")[0].split("|") if "|" in metavar else None
        if key is not None:
            seen.add(key)
            expected = EXPECTED_CHOICES[key]
            shown = choices or re.findall(r"[a-z][\w-]*", (param.help or "").split("One of:", 1)[-1])
            assert shown[: len(expected)] == expected, (key, shown)
            assert " ".join(expected) in " ".join(re.findall(r"[a-z][\w-]*", help_text))  # in the --help itself
        if choices:  # every fixed set shows in the help and completes in the shell
            assert metavar in help_text, (name, param.opts)
            assert [c.value for c in param.shell_complete(None, "")] == choices  # type: ignore[arg-type]
        elif param.help and LISTED.search(param.help) and param.param_type_name == "option":
            pytest.fail(f"{name} {param.opts}: its help lists values ({param.help!r}) but --help shows no choices")
    assert seen == {key for key in EXPECTED_CHOICES if key[0] == name}


# -- scan --baseline --markdown -----------------------------------------------------------------------------
def test_scan_baseline_markdown_carries_the_conclusion_and_the_gate(tmp_path: Path) -> None:
    md = tmp_path / "summary.md"
    args = ["scan", SATURATING, "--baseline", HEALTHY, "--device", "cpu"]
    result = invoke(*args, "--markdown", str(md), "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 1, result.output
    text = html.unescape(md.read_text(encoding="utf-8"))
    sentence = next(line for line in result.stdout.splitlines() if line.startswith("The run is worse"))
    assert f"**Regression gate against `{HEALTHY}`: failed ❌.** {sentence}" in text
    gate = json.loads((tmp_path / "s.json").read_text())["gates"][0]
    assert "### Regression gate (fail-on `warning`)" in text
    for criterion in gate["criteria"]:
        row = next(line for line in text.splitlines() if line.startswith(f"| {criterion['subject']} |"))
        assert row.endswith("| **failed** |" if criterion["failed"] else "| ok |")
    passing = invoke("scan", HEALTHY, "--baseline", HEALTHY, "--device", "cpu", "--markdown", str(md))
    assert passing.exit_code == 0 and ": passed ✅.** The run is no worse than the baseline" in md.read_text()
    plain = invoke("scan", HEALTHY, "--device", "cpu", "--markdown", str(md))
    assert plain.exit_code == 0 and "Regression gate" not in md.read_text()
