"""The HTML report without a browser: content, escaping, bounds, the CLI (`report --html`, `scan --html`).

The real-browser checks (rendering, console errors, scripts that must not run) are in test_browser_report.py;
the collector's bounds and the figures' thinning on their own are in tests/unit/report/.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.core.series import RunSeries
from collapse_doctor.io.discovery import RunInputs, discover_runs
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.html import collect
from collapse_doctor.report.html.collect import ReportCollector, ReportExtras
from collapse_doctor.report.html.figures import MAX_POINTS
from collapse_doctor.report.html.page import PLOTLY_BUNDLE, PLOTLY_TRACE_TYPES, build_report, plotly_js
from collapse_doctor.report.outputs import make_report
from tests.helpers.report import PAYLOAD_CHANNEL, PAYLOAD_SCRIPT, payload_table, report_data
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()
CPU = ScanOptions(device="cpu")
ROOT = Path(__file__).resolve().parents[2]
SATURATING = ROOT / "sample_logs" / "saturating-format.parquet"
SAMPLE_LOGS = ROOT / "sample_logs"
SINGLE = ROOT / "sample_logs" / "single-reward.parquet"


@pytest.fixture(scope="module")
def saturating(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, ReportExtras, str]:
    out = tmp_path_factory.mktemp("report") / "saturating.html"
    diagnosis, extras, size = make_report([SATURATING], out, CPU)
    page = out.read_text(encoding="utf-8")
    assert size == len(page.encode("utf-8"))
    return diagnosis, extras, page


def test_report_is_one_offline_file_with_plotly_once(saturating: tuple[Diagnosis, ReportExtras, str]) -> None:
    _, _, page = saturating
    bundle = plotly_js()
    assert "plotly.js (cartesian - minified)" in bundle[:200]  # the vendored bundle, not the 4.8 MB one
    assert page.count(bundle[:2000]) == 1
    rest = page.replace(bundle, "")
    assert not re.search(r"<script[^>]*\bsrc\s*=", rest)
    assert "<link" not in rest
    assert "http://" not in rest and "https://" not in rest
    assert len(re.findall(r"<script\b", page)) == 3  # plotly.js, the figure data, the page script


def test_report_has_every_section_of_a_rollout_run(saturating: tuple[Diagnosis, ReportExtras, str]) -> None:
    _, extras, page = saturating
    data = report_data(page)
    ids = [chart["id"] for chart in data["charts"]]
    for expected in (
        "chart-rel-gain",
        "chart-share-grpo",
        "chart-share-gdpo",
        "chart-dominance",
        "chart-hist-grpo",
        "chart-hist-gdpo",
        "chart-hist-step",
        "chart-adv-std",
        "chart-adv-kurtosis",
        "chart-outliers",
        "chart-logged-mae",
        "chart-logged-bound",
        "chart-logged-scatter",
        "chart-distinct",
        "chart-corr-heatmap",
        "chart-corr-steps",
        "chart-zero-var",
    ):
        assert expected in ids
    for chart_id in ids:
        assert page.count(f'id="{chart_id}"') == 1
    # Header: verdict, findings with onset, remedy and the explain text one click away.
    assert "AT RISK" in page
    assert "onset step 39" in page  # CD402: `format` drowns `correct` while it saturates
    assert "What CD101 checks" in page and "Why it matters" in page
    # Constant series are one line each, not a chart: the weights (1 and 1), the tied share (0 all along).
    assert "chart-weights" not in ids and "chart-tied" not in ids
    assert "Channel weights, constant over the run (not drawn): format 1, correct 1." in page
    assert "Tied pairs: different reward vectors, equal sum: constant at 0% over the run (not drawn)." in page
    # Onset markers and shading on every step chart, the ground truth of the simulated run.
    for chart in data["charts"]:
        if chart["steps"]:
            shapes = chart["layout"]["shapes"]
            assert any(s.get("x0") == 73 and s["type"] == "line" and s["name"].startswith("onset-") for s in shapes)
            assert [s["name"] for s in shapes if s["type"] == "rect" and "name" in s] == ["shade-0", "shade-1"]
    assert "expected CD101" in page
    # Example groups around the onset, recomputed advantages next to the rewards.
    assert 'id="examples"' in page
    assert {g.step for g in extras.examples} == {29, 39, 49}  # a persistence window (10) around the onset
    assert data["histograms"]["steps"] == list(range(200))


def test_histograms_count_every_rollout_once(saturating: tuple[Diagnosis, ReportExtras, str]) -> None:
    diagnosis, extras, _ = saturating
    hist = extras.histograms
    assert hist is not None
    assert hist.grpo.shape == (200, len(hist.edges) - 1)
    rollouts = diagnosis.series["rollouts"]
    np.testing.assert_array_equal(hist.grpo.sum(axis=1), rollouts)
    np.testing.assert_array_equal(hist.gdpo.sum(axis=1), rollouts)
    sample = extras.logged_sample
    assert sample is not None
    assert collect.MAX_LOGGED_SAMPLE // 2 < len(sample.logged) <= collect.MAX_LOGGED_SAMPLE
    assert sample.steps.min() == 0 and sample.steps.max() == 199  # spread over the whole run


def test_single_channel_run_says_why_there_is_no_correlation(tmp_path: Path) -> None:
    out = tmp_path / "single.html"
    make_report([SINGLE], out, CPU)
    page = out.read_text(encoding="utf-8")
    assert "One reward channel: no pairs to correlate." in page
    assert "chart-corr-heatmap" not in page


def test_text_from_logs_is_escaped(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(payload_table())
    out = tmp_path / "report.html"
    _, extras, _ = make_report([path], out, CPU)
    page = out.read_text(encoding="utf-8")
    assert PAYLOAD_CHANNEL not in page
    assert PAYLOAD_SCRIPT not in page
    assert "onerror=&quot;window.__xss=1&quot;" in page  # HTML parts: escaped and shown
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
    data = report_data(page)  # the JSON parses back to names plotly shows as text, not markup
    names = [trace.get("name", "") for chart in data["charts"] for trace in chart["data"]]
    assert '&lt;img src=x onerror="window.__xss=1"&gt;' in names
    assert extras.examples and all(g.prompt for g in extras.examples)
    assert "<details><summary>" in page  # long completions are shortened and expand on click


def test_long_run_is_thinned_for_display(tmp_path: Path) -> None:
    path = write_simulation(tmp_path / "long.parquet", "saturating-format", steps=3000, groups=2, group_size=4).path
    out = tmp_path / "long.html"
    make_report([path], out, CPU)
    page = out.read_text(encoding="utf-8")
    data = report_data(page)
    rel_gain = next(c for c in data["charts"] if c["id"] == "chart-rel-gain")
    assert all(len(trace["x"]) <= MAX_POINTS + 2 for trace in rel_gain["data"])
    assert "thinned for display" in page
    share = next(c for c in data["charts"] if c["id"] == "chart-share-grpo")
    assert len({tuple(trace["x"]) for trace in share["data"]}) == 1  # stacked traces share their steps


def test_scalar_panels_appear_only_when_the_run_has_scalars(
    saturating: tuple[Diagnosis, ReportExtras, str],
) -> None:
    from collapse_doctor.core.scalars import ScalarSeries, TagPoints

    diagnosis, _, page = saturating
    assert 'id="scalars"' not in page
    steps = np.arange(0, 200, 2)
    scalars = ScalarSeries(
        framework="trl",
        series={"kl": TagPoints(steps, np.linspace(0, 0.1, len(steps))), "entropy": TagPoints(steps, np.ones(100))},
        tags={"kl": "train/kl", "entropy": "train/entropy"},
        points=200,
    )
    page = build_report(replace(diagnosis, scalars=scalars))
    charts = {c["id"]: c for c in report_data(page)["charts"]}
    # entropy (constant at 1) is one line; kl is drawn with the findings' onsets as every step chart
    assert 'id="scalars"' in page and list(charts)[-1] == "chart-scalar-1"
    assert "entropy: constant at 1 over the run (not drawn)." in page
    assert "Logged as train/kl." in page and "Logged as train/entropy." not in page
    onsets = [s["x0"] for s in charts["chart-scalar-1"]["layout"]["shapes"] if s["type"] == "line"]
    assert onsets == [f.onset_step for f in diagnosis.findings if f.onset_step is not None]


def test_the_callbacks_copies_of_series_drawn_from_rollouts_are_not_drawn_again(
    saturating: tuple[Diagnosis, ReportExtras, str],
) -> None:
    """The TRL callback logs rel_gain, signal share, zero-variance share and advantage std per step: the rollout
    sections draw them already, so the scalar section names them in one line instead of a second chart."""
    from collapse_doctor.core.scalars import ScalarSeries, TagPoints

    diagnosis, _, _ = saturating
    steps = np.arange(200)
    wave = np.sin(steps / 7.0)
    series = {
        "channel_rel_gain/format": ("collapse_doctor/rel_gain/format", wave),
        "channel_rel_gain/correct": ("collapse_doctor/rel_gain/correct", wave),
        "channel_signal_share/format": ("train/collapse_doctor/signal_share/format", wave),
        "advantage_std": ("collapse_doctor/advantage_std", wave),
        "frac_reward_zero_std": ("collapse_doctor/zero_variance_group_share", wave),
        "channel_dominance/format": ("collapse_doctor/dominance/format", wave),  # not drawn per step above
        "kl": ("train/kl", wave),
    }
    scalars = ScalarSeries(
        framework="trl",
        series={name: TagPoints(steps, values) for name, (_, values) in series.items()},
        tags={name: tag for name, (tag, _) in series.items()},
        points=200 * len(series),
    )
    page = build_report(replace(diagnosis, scalars=scalars))
    titles = re.findall(r'<figure class="chart"[^>]*><h3>([^<]*)</h3>', page.split('id="scalars"')[1])
    assert titles == ["channel_dominance", "kl"]
    assert (
        "Not drawn again: collapse_doctor/advantage_std, collapse_doctor/rel_gain/*, collapse_doctor/"
        "zero_variance_group_share, train/collapse_doctor/signal_share/* (5 series the callback logged" in page
    )


def test_a_run_without_rollout_series_renders_the_header(saturating: tuple[Diagnosis, ReportExtras, str]) -> None:
    diagnosis, _, _ = saturating
    empty = RunSeries(steps=diagnosis.series.steps, channels=diagnosis.series.channels, pairs=[], values={})
    page = build_report(replace(diagnosis, series=empty, findings=()))
    assert report_data(page)["charts"] == []
    assert "No findings" in page


def test_build_report_without_extras(saturating: tuple[Diagnosis, ReportExtras, str]) -> None:
    diagnosis, _, _ = saturating
    page = build_report(diagnosis)
    ids = [c["id"] for c in report_data(page)["charts"]]
    assert "chart-rel-gain" in ids and "chart-hist-step" not in ids
    assert 'id="examples"' not in page


# -- CLI -------------------------------------------------------------------------------------------
def test_report_command_writes_the_file_and_exits_like_scan(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(SATURATING), "--html", str(out), "--device", "cpu"])
    assert result.exit_code == 1, result.output  # at risk: a warning at or above --fail-on warning
    assert f"wrote {out}" in result.output and "AT RISK" in result.output
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    never = runner.invoke(app, ["report", str(SATURATING), "--html", str(out), "--device", "cpu", "--fail-on", "never"])
    assert never.exit_code == 0, never.output


def test_scan_writes_the_same_report(tmp_path: Path) -> None:
    out = tmp_path / "scan.html"
    result = runner.invoke(app, ["scan", str(SATURATING), "--html", str(out), "--device", "cpu"])
    assert result.exit_code == 1, result.output
    ids = [c["id"] for c in report_data(out.read_text(encoding="utf-8"))["charts"]]
    assert "chart-rel-gain" in ids and "chart-hist-step" in ids


def test_report_refuses_to_overwrite_an_input(write_table: WriteTable) -> None:
    path = write_table(make_table())
    before = path.read_bytes()
    result = runner.invoke(app, ["report", str(path), "--html", str(path), "--device", "cpu"])
    assert result.exit_code == 2
    assert "refusing to overwrite an input" in result.output and "--html" in result.output
    assert path.read_bytes() == before


def test_report_into_a_missing_directory_is_a_one_line_error(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table())
    out = tmp_path / "missing" / "report.html"
    result = runner.invoke(app, ["report", str(path), "--html", str(out), "--device", "cpu"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "does not exist" in result.output
    assert not out.parent.exists()


def test_report_leaves_no_temp_file(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table())
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    result = runner.invoke(app, ["report", str(path), "--html", str(out), "--device", "cpu"])
    assert result.exit_code in (0, 1), result.output
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


def test_text_longer_than_the_cap_is_cut(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=2, groups=2)
    long = ["x" * (collect.MAX_TEXT_CHARS * 3)] * table.num_rows
    table = table.set_column(table.schema.get_field_index("completion"), "completion", pa.array(long))
    path = write_table(table)
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    [run] = discover_runs([path])
    groups = collect.read_example_groups(run, collect.example_steps(diagnosis))
    assert groups and all(len(c or "") == collect.MAX_TEXT_CHARS for g in groups for c in g.completions)
    assert pq.read_table(path).num_rows == table.num_rows


def test_examples_that_cannot_be_re_read_leave_a_note(
    saturating: tuple[Diagnosis, ReportExtras, str], tmp_path: Path
) -> None:
    diagnosis, _, _ = saturating
    gone = RunInputs(name="gone", root=tmp_path, rollout_kind="parquet", rollout_files=[tmp_path / "gone.parquet"])
    extras = ReportCollector(gone).finish(diagnosis)
    assert extras.examples == () and extras.notes
    page = build_report(diagnosis, extras)
    assert "example groups could not be re-read" in page


def test_a_scalar_log_only_run_gets_the_header_and_scalar_panels(tmp_path: Path) -> None:
    from tests.helpers.scalar_runs import trl_run

    out = tmp_path / "scalars.html"
    diagnosis, extras, _ = make_report([trl_run(tmp_path / "logs")], out, CPU)
    page = out.read_text(encoding="utf-8")
    ids = [c["id"] for c in report_data(page)["charts"]]
    assert diagnosis.run.rollouts == 0 and extras.examples == ()
    assert "none: the input is a scalar log only" in page and "reward std peak" in page
    assert ids and all(i.startswith("chart-scalar-") for i in ids)


def test_the_vendored_plotly_bundle_has_every_trace_type_the_report_draws(tmp_path: Path) -> None:
    import plotly.offline

    bundle = PLOTLY_BUNDLE.read_text(encoding="utf-8")
    declared = set(re.findall(r'moduleType:"trace",name:"([a-z0-9]+)"', bundle))
    assert declared == PLOTLY_TRACE_TYPES
    version = re.search(r"plotly\.js[^v]*v([0-9.]+)", bundle[:200])
    full = re.search(r"plotly\.js v([0-9.]+)", plotly.offline.get_plotlyjs()[:300])
    assert version and full and version.group(1) == full.group(1)  # same plotly.js as the Python package's
    used = set()
    for sample in sorted(SAMPLE_LOGS.glob("*.parquet")):
        out = tmp_path / f"{sample.stem}.html"
        make_report([sample], out, CPU)
        used |= {
            trace.get("type", "scatter") for chart in report_data(out.read_text())["charts"] for trace in chart["data"]
        }
    assert used and used <= PLOTLY_TRACE_TYPES, used - PLOTLY_TRACE_TYPES
