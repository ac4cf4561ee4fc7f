"""Figures of the HTML report: display thinning, and reference lines drawn from the run's configuration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.html.figures import StepFigures, correlation_section, display_index


def test_display_index_keeps_spikes_and_bounds_points() -> None:
    values = np.sin(np.arange(20_000) / 50.0)
    values[12_345] = 40.0
    values[777] = -40.0
    keep = display_index(values, 1000)
    assert len(keep) <= 1002
    assert 12_345 in keep and 777 in keep
    assert keep[0] == 0 and keep[-1] == len(values) - 1
    assert np.all(np.diff(keep) > 0)


@pytest.fixture(scope="module")
def collinear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_simulation(
        tmp_path_factory.mktemp("collinear") / "run.parquet", "collinear", steps=40, groups=8, group_size=8
    ).path


def _rho_lines(diagnosis: Diagnosis) -> tuple[str, list[float]]:
    section = correlation_section(StepFigures(diagnosis))
    chart = next(c for c in section.charts if c.id == "chart-corr-steps")
    levels = [trace["y"][0] for trace in chart.data[1:]]  # after the correlation line: +rho, -rho
    return section.intro, levels


def test_the_collinearity_line_is_the_configured_cd401_threshold(collinear: Path, tmp_path: Path) -> None:
    intro, levels = _rho_lines(diagnose([collinear], ScanOptions.of(device="cpu")))
    assert levels == [0.85, -0.85] and "|rho| = 0.85" in intro  # CD401's default warn_rho
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD401]\nwarn_rho = 0.7\n")
    intro, levels = _rho_lines(diagnose([collinear], ScanOptions.of(device="cpu", config=config)))
    assert levels == [0.7, -0.7] and "|rho| = 0.7 " in intro


def test_a_chart_of_constant_series_becomes_one_line_and_reference_lines_do_not_count() -> None:
    from collapse_doctor.report.html.figures import Chart, flat_line, flat_lines

    level = {"type": "scatter", "x": [0, 9], "y": [0.5, 0.9], "name": "CD301 level", "hoverinfo": "skip"}
    flat = Chart("c", "Tied pairs", [{"x": list(range(10)), "y": [0.0] * 10, "name": "tied"}, level], {})
    assert flat_line(flat) == "constant at 0"
    flat.layout = {"yaxis": {"tickformat": ".0%"}}
    assert flat_line(flat) == "constant at 0%"
    varies = Chart("v", "Varies", [{"x": [0, 1], "y": [0.0, None]}, {"x": [0, 1], "y": [0.1, 0.2]}], {})
    assert flat_line(varies) is None
    off_axis = Chart("h", "Histogram", [{"x": [0, 1], "y": [1.0, 1.0]}], {}, steps_axis=False)
    assert flat_line(off_axis) is None
    two = Chart("t", "Distinct", [{"y": [1.0, 1.0], "name": "GRPO"}, {"y": [0.5, 0.5], "name": "GDPO"}], {})
    assert flat_lines([("Distinct", flat_line(two) or "")]) == [
        "Distinct: constant over the run (not drawn): GRPO 1, GDPO 0.5."
    ]


def test_every_finding_gets_a_toggleable_shading_and_a_whole_run_one_starts_off(collinear: Path) -> None:
    from dataclasses import replace

    from collapse_doctor.core.findings import Finding, Severity
    from collapse_doctor.report.html.figures import FINDING_COLORS

    diagnosis = diagnose([collinear], ScanOptions.of(device="cpu"))
    whole = Finding(code="CD101", severity=Severity.INFO, title="whole", message="", onset_step=0, step_range=(0, 39))
    part = Finding(
        code="CD402", severity=Severity.WARNING, title="part", message="", onset_step=30, step_range=(30, 60)
    )
    fig = StepFigures(replace(diagnosis, findings=(part, whole)))
    shapes = fig.layout("y")["shapes"]
    rects = [s for s in shapes if s["type"] == "rect"]
    assert [(s["name"], s["visible"], s["x0"], s["x1"]) for s in rects] == [
        ("shade-0", True, 30, 39),  # clipped to the chart's steps
        ("shade-1", False, 0, 39),  # covers the whole run: off at first, it would tint everything
    ]
    assert len({s["fillcolor"] for s in rects}) == 2
    lines = [s for s in shapes if s["type"] == "line"]
    assert [(s["name"], s["x0"], s["line"]["color"]) for s in lines] == [
        ("onset-0", 30, FINDING_COLORS[0]),
        ("onset-1", 0, FINDING_COLORS[1]),
    ]
    assert [a["text"] for a in fig.layout("y")["annotations"]] == ["CD402", "CD101"]
