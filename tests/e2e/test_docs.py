"""Documentation that is generated or quoted must match the code."""

from __future__ import annotations

import os

import pytest

from collapse_doctor.detectors.reference import reference_markdown
from tests.helpers.paths import ROOT


def test_detector_reference_is_up_to_date() -> None:
    path = ROOT / "docs" / "detectors.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(reference_markdown())
        pytest.skip("UPDATE_GOLDEN=1: docs/detectors.md rewritten")
    hint = "run: python -m collapse_doctor.detectors.reference > docs/detectors.md"
    assert path.read_text() == reference_markdown(), hint


def test_readme_quick_start_matches_ci() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands[0] == "./scripts/quickstart.sh"
    assert commands[1] == "./scripts/test.sh"
    assert "./scripts/test.sh" in ci
    quickstart = (ROOT / "scripts" / "quickstart.sh").read_text()
    assert "collapse-doctor scan sample_logs/" in quickstart
