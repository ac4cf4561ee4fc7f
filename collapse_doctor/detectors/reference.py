"""Generate docs/detectors.md from the detectors' own documentation.

Run ``python -m collapse_doctor.detectors.reference > docs/detectors.md``; a test fails when the file
is out of date.
"""

from __future__ import annotations

from collapse_doctor.detectors import REGISTRY, explain_sections
from collapse_doctor.detectors.base import EXPLAIN_HEADINGS


def reference_markdown() -> str:
    """The detector reference: one section per code, from the docstrings and class attributes."""
    lines = [
        "# Detector reference",
        "",
        "Generated from the detectors' docstrings by `python -m collapse_doctor.detectors.reference`;",
        "`collapse-doctor explain CODE` prints the same text. Thresholds can be changed in",
        "`[tool.collapse-doctor.thresholds.CODE]` (see [usage.md](usage.md#configuration)).",
        "",
        "| code | name | default severity | needs |",
        "|---|---|---|---|",
    ]
    for code in sorted(REGISTRY):
        detector = REGISTRY[code]
        needs = ", ".join(detector.requires)
        lines.append(f"| [{code}](#{code.lower()}) | {detector.name} | {detector.default_severity.label} | {needs} |")
    for code in sorted(REGISTRY):
        detector = REGISTRY[code]
        sections = explain_sections(detector)
        lines += ["", f"## {code}", "", f"**{detector.name}**: {sections['summary']}", ""]
        for heading in EXPLAIN_HEADINGS:
            body = " ".join(sections[heading].split())
            lines += [f"### {heading}", "", body, ""]
        if detector.thresholds:
            lines += ["### Thresholds", "", "| name | default |", "|---|---|"]
            lines += [f"| `{name}` | {value:g} |" for name, value in detector.thresholds.items()]
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(reference_markdown(), end="")
