"""The output dispatcher (report/outputs.py): every format for one run and for two, checks before any work."""

from __future__ import annotations

import io
import json
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest

from collapse_doctor.core.errors import OutputError, UsageError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.scan import ScanHooks, ScanResult, plan_scan, run_scan
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.ci import github_annotations, junit_xml, markdown_summary
from collapse_doctor.report.html.collect import ReportCollector, ReportExtras
from collapse_doctor.report.outputs import OutputRequest, runs_dict, write_outputs
from collapse_doctor.report.schemas import schema_text
from tests.helpers.paths import ROOT as REPO_ROOT
from tests.helpers.scalar_runs import collapsed_series, trl_series, write_events

ROOT = REPO_ROOT
SCHEMA = json.loads(schema_text("scan"))


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> list[ScanResult]:
    """One rollout run (at risk: its finding fails the default gate), scanned with the report's collector."""
    path = tmp_path_factory.mktemp("one") / "run.parquet"
    write_simulation(path, "tied-sums", steps=60, groups=8, group_size=8)
    plan = plan_scan([path], ScanOptions.of(device="cpu"))
    results = run_scan(plan, ScanHooks(collector=ReportCollector))
    assert len(results) == 1
    return results


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[ScanResult]:
    """A log directory with two runs: ``bad`` (collapsed) and ``good`` (healthy)."""
    logs = tmp_path_factory.mktemp("two") / "logs"
    write_events(logs / "good", trl_series())
    write_events(logs / "bad", collapsed_series())
    results = run_scan(plan_scan([logs], ScanOptions.of(device="cpu")))
    assert [r.diagnosis.run.name for r in results] == ["bad", "good"]
    return results


def _write(results: list[ScanResult], request: OutputRequest) -> tuple[int, str]:
    out = io.StringIO()
    code = write_outputs(results, request, stdout=out)
    return code, out.getvalue()


# -- stdout -------------------------------------------------------------------------------------------
def test_text_one_run(one: list[ScanResult]) -> None:
    code, text = _write(one, OutputRequest())
    assert code == 1 == one[0].diagnosis.exit_code()
    assert text.startswith("AT RISK (rollouts only: 8 of 21 checks ran; 11 need a scalar log)  ")
    assert "Findings (1)" in text and "\x1b[" not in text  # no terminal: plain


def test_text_two_runs_one_after_another(two: list[ScanResult]) -> None:
    code, text = _write(two, OutputRequest(color=False))
    assert code == 1  # the worst of the runs
    summary, detail = text.split("\n\n", 1)
    assert summary.startswith("2 runs: worst COLLAPSED, 1 failing the gate")
    assert summary.splitlines()[3].startswith("bad ") and summary.splitlines()[4].startswith("good ")
    first, second = detail.split("\n\nHEALTHY")
    head = "COLLAPSED (a scalar log only: 8 of 21 checks ran; 9 need rollouts; 3 need a series the scalar log lacks)"
    assert first.startswith(f"{head}  no rollouts")
    assert first.split("\n")[1].startswith("run bad:")
    assert second.split("\n")[1].startswith("run good:")
    _, only = _write(two, OutputRequest(color=False, summary_only=True))
    assert only == summary + "\n"


def test_json_one_run_and_two(one: list[ScanResult], two: list[ScanResult]) -> None:
    _, text = _write(one, OutputRequest(format="json"))
    assert text == one[0].diagnosis.to_json() + "\n"
    jsonschema.validate(json.loads(text), SCHEMA)
    code, text = _write(two, OutputRequest(format="json"))
    data = json.loads(text)
    assert data == json.loads(json.dumps(runs_dict([r.diagnosis for r in two])))
    assert (data["verdict"], data["exit_code"], code) == ("collapsed", 1, 1)
    assert [r["run"]["name"] for r in data["runs"]] == ["bad", "good"]
    for run in data["runs"]:
        jsonschema.validate(run, SCHEMA)


def test_github_one_run_and_two_append_the_step_summary(
    one: list[ScanResult], two: list[ScanResult], tmp_path: Path
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("previous\n")
    _, text = _write(one, OutputRequest(format="github", step_summary=summary))
    assert text == github_annotations(one[0].diagnosis)
    assert summary.read_text() == "previous\n" + markdown_summary(one[0].diagnosis)
    summary.write_text("")
    _, text = _write(two, OutputRequest(format="github", step_summary=summary))
    assert text == "".join(github_annotations(r.diagnosis) for r in two)
    assert summary.read_text() == "\n".join(markdown_summary(r.diagnosis) for r in two)
    # Without a summary file only the annotations are written.
    assert _write(two, OutputRequest(format="github"))[1] == text


def test_no_stdout(one: list[ScanResult], tmp_path: Path) -> None:
    assert write_outputs(one, OutputRequest(json=tmp_path / "a.json"), stdout=None) == 1
    assert (tmp_path / "a.json").exists()


# -- files ----------------------------------------------------------------------------------------------
def test_every_file_for_one_run(one: list[ScanResult], tmp_path: Path) -> None:
    request = OutputRequest(
        format="json",
        json=tmp_path / "scan.json",
        junit=tmp_path / "junit.xml",
        markdown=tmp_path / "scan.md",
        html=tmp_path / "report.html",
    )
    request.check(one[0].inputs.files)
    code, text = _write(one, request)
    diagnosis = one[0].diagnosis
    assert code == 1
    assert (tmp_path / "scan.json").read_text() == text == diagnosis.to_json() + "\n"
    assert (tmp_path / "junit.xml").read_text() == junit_xml(diagnosis)
    assert ET.parse(tmp_path / "junit.xml").getroot().get("failures") != "0"
    assert (tmp_path / "scan.md").read_text() == markdown_summary(diagnosis)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'id="chart-hist-step"' in page  # the collector's histograms
    assert isinstance(one[0].extra, ReportExtras)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.html", "scan.json", "scan.md"]


def test_json_and_markdown_files_for_two_runs(two: list[ScanResult], tmp_path: Path) -> None:
    request = OutputRequest(json=tmp_path / "scan.json", markdown=tmp_path / "scan.md")
    code, _ = _write(two, request)
    assert code == 1
    data = json.loads((tmp_path / "scan.json").read_text())
    assert data["verdict"] == "collapsed" and len(data["runs"]) == 2
    assert (tmp_path / "scan.md").read_text() == "\n".join(markdown_summary(r.diagnosis) for r in two)


def test_two_runs_in_junit_and_html(two: list[ScanResult], tmp_path: Path) -> None:
    request = OutputRequest(junit=tmp_path / "j.xml", html=tmp_path / "r.html")
    request.check([], runs=["bad", "good"])
    write_outputs(two, request, stdout=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.xml", "r-bad.html", "r-good.html", "r.html"]
    suites = ET.fromstring((tmp_path / "j.xml").read_text(encoding="utf-8"))
    assert suites.tag == "testsuites" and [s.get("name") for s in suites] == [
        "collapse-doctor: bad",
        "collapse-doctor: good",
    ]
    assert int(suites.get("tests", "0")) == sum(int(s.get("tests", "0")) for s in suites)


def test_a_run_page_on_an_input_is_refused_before_any_work(two: list[ScanResult], tmp_path: Path) -> None:
    request = OutputRequest(html=tmp_path / "r.html")
    with pytest.raises(OutputError, match=r"r-bad\.html: refusing to overwrite an input file"):
        request.check([tmp_path / "r-bad.html"], runs=["bad", "good"])


def test_the_html_report_without_a_collector(one: list[ScanResult], tmp_path: Path) -> None:
    bare = [ScanResult(diagnosis=one[0].diagnosis, inputs=one[0].inputs)]
    write_outputs(bare, OutputRequest(html=tmp_path / "r.html"), stdout=None)
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="chart-rel-gain"' in page and 'id="chart-hist-step"' not in page


# -- checks before the scan ---------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["json", "junit", "markdown", "html"])
def test_check_refuses_an_input_as_output(tmp_path: Path, option: str) -> None:
    source = tmp_path / "run.parquet"
    source.write_bytes(b"rollouts")
    request = OutputRequest(**{option: source})  # type: ignore[arg-type]
    with pytest.raises(OutputError) as raised:
        request.check([source])
    assert raised.value.one_line() == (
        f"{source}: refusing to overwrite an input file. Hint: choose another path for --{option}"
    )
    assert source.read_bytes() == b"rollouts"


def test_check_refuses_a_missing_directory_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        OutputRequest(markdown=tmp_path / "missing" / "scan.md").check([])
    with pytest.raises(OutputError, match=r"is a directory\. Hint: pass a file path with --html"):
        OutputRequest(html=tmp_path).check([])
    OutputRequest(json=tmp_path / "fine.json", junit=Path("junit.xml")).check([tmp_path / "run.parquet"])


def test_check_comes_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI checks the outputs against the plan's files before it scans anything."""
    from typer.testing import CliRunner

    from collapse_doctor.cli.app import app
    from collapse_doctor.pipeline import scan as pipeline

    path = tmp_path / "run.parquet"
    write_simulation(path, "healthy", steps=20, groups=4, group_size=4)
    before = path.read_bytes()

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("scanned before the outputs were checked")

    monkeypatch.setattr(pipeline, "run_scan", no_scan)
    result = CliRunner().invoke(app, ["scan", str(path), "--markdown", str(path), "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "refusing to overwrite an input file. Hint: choose another path for --markdown" in result.stderr
    assert path.read_bytes() == before


def test_request_values() -> None:
    with pytest.raises(UsageError, match="--format 'xml' is not one of text, json, github"):
        OutputRequest(format="xml")
    request = OutputRequest(json="scan.json", html="r.html")  # type: ignore[arg-type]
    assert request.files() == {"--json": Path("scan.json"), "--html": Path("r.html")}
    assert request.collector() is ReportCollector
    assert OutputRequest(json=Path("scan.json")).collector() is None
