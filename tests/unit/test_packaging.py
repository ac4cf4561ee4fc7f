"""The wheel a user installs: its license metadata (SPDX), the license file, ``py.typed``, the JSON schemas and the
report's plotly bundle; and ``collapse-doctor schema`` prints the schemas it carries."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.report.schemas import SCHEMAS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the environment's setuptools (no download); the project needs setuptools >= 77 (PEP 639)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    [built] = out.glob("collapse_doctor-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_carries_what_users_need(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "collapse_doctor/py.typed" in names
    assert {f"collapse_doctor/report/schemas/{file}" for file in SCHEMAS.values()} <= names
    assert "collapse_doctor/report/html/vendor/plotly-cartesian.min.js" in names
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
    assert "License-Expression: Apache-2.0" in lines and "License-File: docs/LICENSE" in lines
    assert any(n.endswith(".dist-info/licenses/docs/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "sample_logs/")) for n in names)
    assert not [n for n in names if n.endswith("conftest.py")], "test configuration stays out of the wheel"
    [metadata_text] = [wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA")]
    assert "Project-URL: Homepage, https://collapse-doctor.dev" in metadata_text
    assert "Project-URL: Documentation, https://collapse-doctor.dev/docs" in metadata_text


@pytest.mark.parametrize("document", sorted(SCHEMAS))
def test_schema_prints_the_installed_schema(document: str) -> None:
    result = CliRunner().invoke(app, ["schema", document])
    assert result.exit_code == 0
    installed = ROOT / "collapse_doctor" / "report" / "schemas" / SCHEMAS[document]
    assert json.loads(result.stdout) == json.loads(installed.read_text())
    unknown = CliRunner().invoke(app, ["schema", "nope"])
    assert unknown.exit_code == 2 and "choose one of: scan, compare" in unknown.output
