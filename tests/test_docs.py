"""Documentation that is generated or quoted must match the code."""

from __future__ import annotations

import os
import re
from pathlib import Path

from collapse_doctor.detectors import REGISTRY
from collapse_doctor.detectors.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_detector_reference_is_up_to_date() -> None:
    path = ROOT / "docs" / "detectors.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(reference_markdown())
    hint = "run: python -m collapse_doctor.detectors.reference > docs/detectors.md"
    assert path.read_text() == reference_markdown(), hint


def test_every_code_is_documented_in_design_order() -> None:
    text = (ROOT / "docs" / "detectors.md").read_text()
    assert re.findall(r"^## (CD\d+)$", text, re.MULTILINE) == sorted(REGISTRY)


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
