"""The comparison page in headless Chromium, as the report (tests/e2e/test_browser_report.py, whose browser fixture
this reuses): no console errors, nothing fetched, every chart drawn, script payloads in run labels and channel names
never run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.compare import GateSettings, compare_runs
from collapse_doctor.report.html.compare_html import write_comparison_html
from tests.e2e.test_browser_report import NETWORK, UNRENDERED, browser, load, screenshot
from tests.helpers.report import PAYLOAD_CHANNEL, PAYLOAD_SCRIPT, payload_table
from tests.helpers.tables import WriteTable

__all__ = ["browser"]  # the fixture, imported for pytest

ROOT = Path(__file__).resolve().parents[2]
CPU = ScanOptions(device="cpu")


def test_demo_comparison_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    runs = [str(ROOT / "sample_logs" / "demo-grpo"), str(ROOT / "sample_logs" / "demo-gdpo")]
    comparison, inputs = compare_runs(runs, CPU, gate=GateSettings())
    page = tmp_path / "compare.html"
    write_comparison_html(page, comparison, inputs=inputs)
    messages = load(browser, page)
    assert not [m for m in messages if m["level"] == "SEVERE"], messages
    assert browser.execute_script(NETWORK) == []
    assert browser.execute_script("return document.querySelectorAll('.plot').length") >= 10
    assert browser.execute_script(UNRENDERED) == []
    # Both runs are drawn on a shared chart, in their own colours.
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-adv-std .legendtext')).map(t => t.textContent)"
    )
    assert legend == [f"A: {runs[0]}", f"B: {runs[1]}"]
    # The channel table has the report's state column, per run (A then B under each channel).
    from collapse_doctor.report.html.page import channel_state

    states = browser.execute_script(
        "const t = Array.from(document.querySelectorAll('#runs table')).find(t => t.innerText.includes('state'));"
        "const i = Array.from(t.tHead.rows[0].cells).findIndex(c => c.innerText === 'state');"
        "return Array.from(t.tBodies[0].rows).map(r => r.cells[i].innerText);"
    )
    tables = [{row["channel"]: row for row in r.diagnosis.channel_table()} for r in comparison.runs]
    assert states == [channel_state(t[c]) for c in comparison.channels for t in tables]
    assert "floor 91%" in states
    assert screenshot(browser, "compare-demo").stat().st_size > 50_000


def test_script_payloads_in_run_labels_and_channels_do_not_run(
    browser: Any, write_table: WriteTable, tmp_path: Path
) -> None:
    label = PAYLOAD_SCRIPT.replace("/", "_")  # a directory name: no slash
    path = write_table(payload_table(), f"{label}/run.parquet")
    comparison, inputs = compare_runs([str(path), str(path)], CPU, gate=GateSettings())
    page = tmp_path / "payloads.html"
    write_comparison_html(page, comparison, inputs=inputs)
    messages = load(browser, page)
    assert not [m for m in messages if m["level"] == "SEVERE"], messages
    time.sleep(0.3)
    assert browser.execute_script("return typeof window.__xss") == "undefined"
    assert browser.execute_script("return document.querySelectorAll('img').length") == 0
    assert browser.execute_script("return document.scripts.length") == 3
    body = browser.execute_script("return document.body.innerText")
    assert PAYLOAD_CHANNEL in body and label in body
    titles = browser.execute_script("return Array.from(document.querySelectorAll('h3')).map(h => h.textContent)")
    assert f"rel_gain: {PAYLOAD_CHANNEL}" in titles
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('.legendtext')).map(t => t.textContent)"
    )
    assert f"A: {path}" in legend


FIRST_ON_PAGE = """
const main = document.querySelector('main');
const first = main.firstElementChild;
const lines = Array.from(document.querySelectorAll('#conclusion p.conclusion'));
const above = Array.from(main.querySelectorAll('section, table, .plot')).filter(
  el => !el.closest('#conclusion') && el.getBoundingClientRect().top < lines[0].getBoundingClientRect().top);
return {
  first: first.id,
  lines: lines.map(p => ({text: p.innerText, gate: p.dataset.gate, verdict: p.dataset.verdict,
                          top: p.getBoundingClientRect().top, bottom: p.getBoundingClientRect().bottom})),
  above: above.map(el => el.id || el.tagName),
  viewport: [window.innerWidth, window.innerHeight],
  cells: Array.from(document.querySelectorAll('#runs td.num')).map(td => td.innerText),
};
"""
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?%?"


def _significant(text: str) -> int:
    digits = text.rstrip("%").lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return len(digits)


def test_the_conclusion_is_the_first_thing_on_the_page_and_its_numbers_are_rounded(
    browser: Any, tmp_path: Path
) -> None:
    """At 1400x900 the conclusion is in view before scrolling, above every table and chart; every number on it and
    in the tables has at most 3 significant digits (percents whole), as the scan report shows them."""
    import re

    runs = [str(ROOT / "sample_logs" / "demo-grpo"), str(ROOT / "sample_logs" / "demo-gdpo")]
    comparison, inputs = compare_runs(runs, CPU)
    page = tmp_path / "compare.html"
    write_comparison_html(page, comparison, inputs=inputs)
    load(browser, page)
    browser.execute_script("window.scrollTo(0, 0)")
    seen = browser.execute_script(FIRST_ON_PAGE)
    assert seen["viewport"][1] <= 900 and seen["first"] == "conclusion"
    (line,) = seen["lines"]
    assert seen["above"] == [] and line["top"] >= 0 and line["bottom"] <= seen["viewport"][1]
    # The shares test_compare_cli derives from the rollouts the trainers wrote (2.5% and 19.5%), whole percents.
    assert line["text"].startswith("B is worse than A: zero-advantage share 3% -> 19%")
    assert line["text"].endswith("--gate would fail B") and (line["gate"], line["verdict"]) == ("fails", "worse")
    for text in [line["text"], *seen["cells"]]:
        for number in re.findall(NUMBER, text.replace(",", "")):
            if number.endswith("%"):
                assert "." not in number, (number, text)
            elif "." in number:
                assert _significant(number) <= 3, (number, text)
    assert browser.get_screenshot_as_png()  # the first screen, as a reader sees it
