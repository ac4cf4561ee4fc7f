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
