"""The terminal, Markdown and HTML renderers show the channel table's numbers the same way (numbers.py)."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.simulate import write_simulation
from collapse_doctor.report.ci import junit_xml, markdown_summary
from collapse_doctor.report.html.page import build_report
from collapse_doctor.report.text import render_text


@pytest.fixture(scope="module")
def diagnosis(tmp_path_factory: pytest.TempPathFactory) -> Diagnosis:
    path = tmp_path_factory.mktemp("run") / "run.parquet"
    write_simulation(path, "saturating-format", steps=40, groups=8, group_size=8)
    return diagnose([path], ScanOptions.of(device="cpu"))


def test_shares_are_clipped_and_missing_values_are_a_dash(
    diagnosis: Diagnosis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # off a terminal the text's tables are laid out at 110 columns
    rows = [dict(row) for row in diagnosis.channels]
    rows[0] |= {"signal_share_grpo": 1.013, "signal_share_gdpo": -0.03, "zero_variance_share": float("nan")}
    rows[1] |= {"signal_share_grpo": None, "signal_share_gdpo": 0.456, "zero_variance_share": 0.314}
    shown = replace(diagnosis, channels=tuple(rows))
    out, narrow = io.StringIO(), io.StringIO()
    render_text(shown, out, color=False)
    render_text(shown, narrow, color=False, width=80)  # the short layout: `var GRPO/GDPO`, `100%/0%`
    renderings = {"text": out.getvalue(), "markdown": markdown_summary(shown), "html": build_report(shown)}
    for name, text in renderings.items():
        assert "100% / 0%" in text, name
        assert "- / 46%" in text, name
        assert "31%" in text, name
    table = narrow.getvalue().split("Channels (now", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "var GRPO/GDPO" in table[1]
    cells = [re.split(r"\s{2,}", row.strip()) for row in table[3:]]  # channel, w, rel_gain, var, const, ...
    assert [row[3:5] for row in cells] == [["100%/0%", "-"], ["-/46%", "31%"]]


def test_junit_has_a_case_per_target_named_from_the_diagnosis(diagnosis: Diagnosis) -> None:
    from xml.etree import ElementTree as ET

    renamed = replace(diagnosis, detectors={code: f"named {code}" for code in diagnosis.detectors})
    names = [c.get("name") for c in ET.fromstring(junit_xml(renamed).split("\n", 1)[1]).iter("testcase")]
    channels = diagnosis.run.channels
    assert [n for n in names if n.startswith("CD101 ")] == [f"CD101 named CD101 [{c}]" for c in channels]
    assert [n for n in names if n.startswith("CD401 ")] == [f"CD401 named CD401 [{' / '.join(channels)}]"]
    assert "CD102 named CD102" in names  # a run-wide detector: one case


def test_junit_says_when_and_where_the_suite_ran(diagnosis: Diagnosis) -> None:
    import re
    from xml.etree import ElementTree as ET

    suite = ET.fromstring(junit_xml(diagnosis).split("\n", 1)[1])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.get("timestamp", ""))  # was empty
    assert suite.get("hostname")


def test_render_text_to_a_file_is_plain(diagnosis: Diagnosis, tmp_path: Path) -> None:
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as handle:
        render_text(diagnosis, handle)
    assert "\x1b[" not in (tmp_path / "out.txt").read_text()
