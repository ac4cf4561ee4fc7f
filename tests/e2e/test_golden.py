"""The terminal and JSON output of `scan` on every sample log, against tests/golden/scan/.

``UPDATE_GOLDEN=1`` writes the goldens from this run and skips the comparison (a comparison against what was
just written would pass whatever the output); rerun without it to check them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.report.schemas import schema_text

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "sample_logs").glob("*.parquet"))
GOLDEN = ROOT / "tests" / "golden" / "scan"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
SCHEMA = json.loads(schema_text("scan"))


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # Golden outputs name the input relative to the repository, as a user in the checkout would.
    monkeypatch.chdir(ROOT)


def _close(actual: object, expected: object, path: str = "$") -> None:
    """Compare JSON values; numbers within 1e-3 relative (CPU kernels may differ in the last bits)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            _close(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _close(a, e, f"{path}[{i}]")
    elif isinstance(expected, float) and isinstance(actual, (int, float)):
        assert math.isclose(actual, expected, rel_tol=1e-3, abs_tol=1e-6), (path, actual, expected)
    else:
        assert actual == expected, (path, actual, expected)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_golden_outputs(sample: Path, tmp_path: Path) -> None:
    relative = sample.relative_to(ROOT)
    out = tmp_path / "scan.json"
    # off a terminal, tables take COLUMNS when set: unset here, the documented default width (report/text.py)
    env = {"NO_COLOR": "1", "COLUMNS": None}
    result = runner.invoke(app, ["scan", str(relative), "--json", str(out), "--device", "cpu"], env=env)
    assert result.exit_code in (0, 1), result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    text_golden = GOLDEN / f"{sample.stem}.txt"
    json_golden = GOLDEN / f"{sample.stem}.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        text_golden.write_text(result.stdout)
        json_golden.write_text(json.dumps(data, indent=1) + "\n")
        pytest.skip(f"UPDATE_GOLDEN=1: wrote {text_golden.name} and {json_golden.name}; rerun without it to compare")
    assert result.stdout == text_golden.read_text()
    _close(data, json.loads(json_golden.read_text()))
    assert result.exit_code == (1 if data["findings"] else 0)
