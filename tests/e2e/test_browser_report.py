"""The HTML report in a real browser: headless Chromium driven by selenium through chromedriver.

Each sample log's report must load without console errors, fetch nothing from the network, and have a
rendered plot (plotly's svg) in every chart container; a full-page screenshot of each goes to
``artifacts/browser/`` (git-ignored). Script payloads in channel names, group ids, prompts and
completions must not run. Without Chromium these tests are skipped, unless
``COLLAPSE_DOCTOR_BROWSER_TESTS=1`` (set by scripts/test.sh, which installs it) makes that a failure.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.report.outputs import make_report
from tests.helpers.report import PAYLOAD_CHANNEL, PAYLOAD_SCRIPT, payload_table
from tests.helpers.tables import WriteTable

CPU = ScanOptions(device="cpu")
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "sample_logs").glob("*.parquet"))
ARTIFACTS = ROOT / "artifacts" / "browser"
REQUIRED = os.environ.get("COLLAPSE_DOCTOR_BROWSER_TESTS") == "1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
READY_TIMEOUT_S = 30.0
WIDTH, HEIGHT = 1400, 900

if CHROMIUM is None or CHROMEDRIVER is None:
    message = "headless Chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)
if not REQUIRED:
    pytest.importorskip("selenium")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WIDTH},{HEIGHT}",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def load(driver: Any, page: Path) -> list[dict[str, Any]]:
    """Open ``page``, wait until every plot has rendered, return the console messages."""
    driver.get_log("browser")  # drop messages of earlier pages
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not driver.execute_script("return window.__reportReady === true"):
        if time.monotonic() > deadline:
            pytest.fail(f"{page.name}: the report did not finish rendering in {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return list(driver.get_log("browser"))


def screenshot(driver: Any, name: str) -> Path:
    """A full-page PNG (the whole scroll height at the window's width) under artifacts/browser/."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1},
        },
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


UNRENDERED = """
return Array.from(document.querySelectorAll('.plot'))
  .filter(el => !(el.classList.contains('js-plotly-plot') && el.querySelector('svg.main-svg')
                  && el.querySelectorAll('.trace, .heatmaplayer image, .imagelayer image').length > 0))
  .map(el => el.id);
"""

NETWORK = """
return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('file:')
  && !n.startsWith('data:') && !n.startsWith('blob:'));
"""


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_report_renders_in_chromium(browser: Any, sample: Path, tmp_path: Path) -> None:
    page = tmp_path / f"{sample.stem}.html"
    make_report([sample], page, CPU)
    messages = load(browser, page)
    errors = [m for m in messages if m["level"] == "SEVERE"]
    assert not errors, errors
    assert browser.execute_script(NETWORK) == []
    charts = browser.execute_script("return document.querySelectorAll('.plot').length")
    assert charts >= 12
    assert browser.execute_script(UNRENDERED) == []
    shot = screenshot(browser, sample.stem)
    assert shot.stat().st_size > 50_000


def test_step_slider_switches_the_histogram(browser: Any, tmp_path: Path) -> None:
    page = tmp_path / "saturating.html"
    make_report([ROOT / "sample_logs" / "saturating-format.parquet"], page, CPU)
    load(browser, page)
    before = browser.execute_script("return document.getElementById('chart-hist-step').data[0].y.slice()")
    browser.execute_script(
        "const s = document.getElementById('hist-slider'); s.value = '5';"
        "s.dispatchEvent(new Event('input', {bubbles: true}));"
    )
    after = browser.execute_script("return document.getElementById('chart-hist-step').data[0].y")
    assert browser.execute_script("return document.getElementById('hist-step').textContent") == "5"
    assert after != before


def test_script_payloads_in_logs_do_not_run(browser: Any, write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(payload_table())
    page = tmp_path / "payloads.html"
    make_report([path], page, CPU)
    messages = load(browser, page)
    assert not [m for m in messages if m["level"] == "SEVERE"]
    # Open every shortened text too, and hover nothing: the payloads must stay text.
    browser.execute_script("document.querySelectorAll('details').forEach(d => { d.open = true; });")
    time.sleep(0.3)
    assert browser.execute_script("return typeof window.__xss") == "undefined"
    assert browser.execute_script("return document.querySelectorAll('img').length") == 0
    assert browser.execute_script("return document.scripts.length") == 3
    body = browser.execute_script("return document.body.innerText")
    assert PAYLOAD_CHANNEL in body and PAYLOAD_SCRIPT in body
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-rel-gain .legendtext')).map(t => t.textContent)"
    )
    assert PAYLOAD_CHANNEL in legend
    screenshot(browser, "payloads")


def test_scalar_log_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    from tests.helpers.scalar_runs import trl_run

    page = tmp_path / "scalars.html"
    make_report([trl_run(tmp_path / "logs")], page, CPU)
    assert not [m for m in load(browser, page) if m["level"] == "SEVERE"]
    assert browser.execute_script("return document.querySelectorAll('.plot').length") >= 4
    assert browser.execute_script(UNRENDERED) == []
    screenshot(browser, "scalar-log")


def test_a_very_long_channel_name_keeps_the_channel_table_in_view(
    browser: Any, write_table: WriteTable, tmp_path: Path
) -> None:
    from tests.helpers.tables import make_table

    long_name = "x" * 5000
    names = ["step", "group_id", "reward/format", f"reward/{long_name}", "prompt", "completion"]
    table = make_table(steps=8).rename_columns(names)
    page = tmp_path / "long.html"
    make_report([write_table(table)], page, CPU)
    load(browser, page)
    width = browser.execute_script("return document.documentElement.clientWidth")
    right = browser.execute_script(
        "return Math.max(...Array.from(document.querySelectorAll('#overview table tr:nth-child(2) td'))"
        ".map(td => td.getBoundingClientRect().right))"
    )
    assert right <= width + 1, (right, width)


# -- the first screen, the run card, the findings on the charts (sample_logs/demo-grpo) ---------------------------
DEMO = ROOT / "sample_logs" / "demo-grpo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The report of the shipped demo: rollout parts and two event files, four findings, a scalar log."""
    page = tmp_path_factory.mktemp("demo") / "demo-grpo.html"
    diagnosis, _, _ = make_report([DEMO], page, CPU)
    return diagnosis, page


def _box(browser: Any, selector: str) -> dict[str, float]:
    return dict(browser.execute_script(f"return document.querySelector({selector!r}).getBoundingClientRect().toJSON()"))


def test_the_first_screen_shows_the_verdict_the_signal_budget_and_the_findings(
    browser: Any, demo: tuple[Any, Path]
) -> None:
    from collapse_doctor.core.result import signal_sentence

    diagnosis, page = demo
    load(browser, page)
    browser.execute_script("window.scrollTo(0, 0)")
    height = browser.execute_script("return window.innerHeight")
    assert height <= HEIGHT
    verdict, budget = _box(browser, "header .verdict"), _box(browser, "#budget")
    # The text output's first line, in its order: the verdict, then the budget sentence, both at the top.
    assert browser.execute_script("return document.querySelector('#budget').innerText") == signal_sentence(
        diagnosis.run.signal
    )
    assert browser.execute_script("return document.querySelector('.verdict').innerText") == "AT RISK"
    assert verdict["top"] < 40 and verdict["right"] <= budget["left"] and budget["top"] < 40
    first_text = browser.execute_script("return document.body.innerText.trim().split('\\n').slice(0, 2)")
    assert first_text[0].startswith("AT RISK") and signal_sentence(diagnosis.run.signal) in " ".join(first_text)
    # Every finding's headline is in view before scrolling, and nothing but the header and the contents above them.
    headlines = browser.execute_script(
        "return Array.from(document.querySelectorAll('.finding .headline'))"
        ".map(h => h.getBoundingClientRect().toJSON())"
    )
    assert len(headlines) == len(diagnosis.findings) == 4
    assert all(h["top"] > 0 and h["bottom"] <= height for h in headlines), (headlines, height)
    assert _box(browser, "#findings")["top"] < _box(browser, "#overview")["top"] < _box(browser, ".plot")["top"]
    # At 1400 px wide the page is far shorter than the 14,700 px it was.
    total = browser.execute_script("return document.documentElement.scrollHeight")
    assert total < 10_500, total
    browser.get_screenshot_as_png()


def test_the_inputs_are_summarised_with_the_list_folded_and_no_name_broken(
    browser: Any, demo: tuple[Any, Path]
) -> None:
    diagnosis, page = demo
    load(browser, page)
    summary = browser.execute_script("return document.querySelector('details.inputs > summary').innerText")
    assert summary == f"{DEMO}/: 10 Parquet parts under rollouts/, 2 event files in 2 folders"
    run_card = _box(browser, "table.run")
    assert run_card["height"] < 300  # the 12 paths one per line made it 700 px tall
    assert browser.execute_script("return document.querySelector('ul.files').checkVisibility()") is False  # folded
    browser.execute_script("document.querySelector('details.inputs').open = true")
    assert browser.execute_script("return document.querySelector('ul.files').checkVisibility()") is True
    listed = browser.execute_script("return Array.from(document.querySelectorAll('ul.files li')).map(l => l.innerText)")
    expected = [s.removeprefix(f"{DEMO}/") for s in diagnosis.run.sources]
    assert [item.replace("\n", "") for item in listed] == expected and len(listed) == 12
    # Each folder and file name is one piece of text on one line; a path may break only after a "/".
    broken = browser.execute_script(
        "return Array.from(document.querySelectorAll('details.inputs .seg'))"
        ".filter(s => s.getClientRects().length !== 1).map(s => s.textContent)"
    )
    assert broken == []
    card = browser.execute_script(
        "const c = document.querySelector('table.run').closest('.card'); return [c.scrollWidth, c.clientWidth]"
    )
    assert card[0] <= card[1]


SHAPES_DRAWN = """
return Array.from(document.querySelectorAll('.plot.js-plotly-plot')).filter(el => (el.layout.shapes || []).length)
  .map(el => ({id: el.id, shapes: el.layout.shapes.map((s, j) => ({
    name: s.name || '', type: s.type, fill: s.fillcolor || '',
    drawn: el.querySelector('.shapelayer path[data-index="' + j + '"]') !== null}))}));
"""


def _drawn(browser: Any, prefix: str) -> dict[str, list[str]]:
    """Per chart: the names of the shapes starting with ``prefix`` that are drawn."""
    return {
        chart["id"]: [s["name"] for s in chart["shapes"] if s["name"].startswith(prefix) and s["drawn"]]
        for chart in browser.execute_script(SHAPES_DRAWN)
    }


def test_each_findings_shading_is_toggled_by_the_reader(browser: Any, demo: tuple[Any, Path]) -> None:
    _, page = demo
    load(browser, page)
    step_charts = browser.execute_script(
        "return JSON.parse(document.getElementById('report-data').textContent)"
        ".charts.filter(c => c.steps).map(c => c.id)"
    )
    boxes = browser.execute_script(
        "return Array.from(document.querySelectorAll('input.shade-toggle')).map(b => "
        "({index: b.dataset.shade, checked: b.checked, label: b.parentElement.textContent}))"
    )
    assert [" ".join(b["label"].split()) for b in boxes] == ["CD402 2-25", "CD101 0-99", "CD101 59-67", "CD104 10-100"]
    # The findings covering (nearly) the whole run start off: they would tint every chart over the others' shading.
    assert [b["checked"] for b in boxes] == [True, False, True, False]
    drawn = _drawn(browser, "shade-")
    assert set(drawn) == set(step_charts) and len(step_charts) >= 15
    assert all(names == ["shade-0", "shade-2"] for names in drawn.values()), drawn
    fills = {s["name"]: s["fill"] for c in browser.execute_script(SHAPES_DRAWN) for s in c["shapes"] if s["name"]}
    assert len({fills[f"shade-{k}"] for k in range(4)}) == 4  # one colour per finding
    browser.find_element("css selector", "input.shade-toggle[data-shade='1']").click()
    browser.find_element("css selector", "input.shade-toggle[data-shade='0']").click()
    time.sleep(0.5)
    drawn = _drawn(browser, "shade-")
    assert all(names == ["shade-1", "shade-2"] for names in drawn.values()), drawn


def test_onset_lines_on_every_step_chart_with_labels_that_do_not_overlap(browser: Any, demo: tuple[Any, Path]) -> None:
    diagnosis, page = demo
    load(browser, page)
    onsets = [f for f in diagnosis.findings if f.onset_step is not None]
    drawn = _drawn(browser, "onset-")
    scalar_charts = [c for c in drawn if c.startswith("chart-scalar-")]
    assert len(scalar_charts) >= 8  # the scalar charts are step charts too
    assert all(names == [f"onset-{k}" for k in range(len(onsets))] for names in drawn.values()), drawn
    labels = browser.execute_script(
        """return Array.from(document.querySelectorAll('.plot.js-plotly-plot')).map(el => ({
             id: el.id,
             plot: el.querySelector('.bglayer rect, .draglayer .nsewdrag').getBoundingClientRect().toJSON(),
             figure: el.getBoundingClientRect().toJSON(),
             labels: Array.from(el.querySelectorAll('g.annotation')).map(a => ({
               text: a.textContent, box: a.getBoundingClientRect().toJSON()}))}))
           .filter(c => c.labels.length)"""
    )
    assert {c["id"] for c in labels} == set(drawn)
    for chart in labels:
        assert sorted(label["text"] for label in chart["labels"]) == sorted(f.code for f in onsets)
        boxes = [label["box"] for label in chart["labels"]]
        for i, a in enumerate(boxes):
            assert a["bottom"] <= chart["plot"]["top"] + 1, (chart["id"], a)  # above the plot area
            assert chart["figure"]["left"] <= a["left"] and a["right"] <= chart["figure"]["right"] + 1
            for b in boxes[i + 1 :]:
                apart = a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"]
                assert apart or b["bottom"] <= a["top"], (chart["id"], a, b)


def test_the_channel_table_has_the_text_outputs_state_column(browser: Any, demo: tuple[Any, Path]) -> None:
    from collapse_doctor.report.html.page import channel_state

    diagnosis, page = demo
    load(browser, page)
    table = browser.execute_script(
        "const t = document.querySelector('#overview .card:nth-child(2) table');"
        "const head = Array.from(t.rows[0].cells).map(c => c.innerText);"
        "const i = head.indexOf('state');"
        "return {head: head, states: Array.from(t.rows).slice(1).map(r => r.cells[i].innerText)};"
    )
    assert "state" in table["head"]
    assert (
        table["states"]
        == [channel_state(row) for row in diagnosis.channel_table()]
        == ["ranking", "floor 91%", "ranking"]
    )


FLAT_CHARTS = """
return Array.from(document.querySelectorAll('.plot.js-plotly-plot')).filter(el => {
  const step = JSON.parse(document.getElementById('report-data').textContent).charts.find(c => c.id === el.id).steps;
  if (!step) { return false; }
  return el.data.filter(t => t.hoverinfo !== 'skip').every(t => new Set((t.y || []).filter(v => v !== null)).size < 2);
}).map(el => el.id);
"""


def test_no_chart_for_a_constant_series_and_no_series_drawn_twice(browser: Any, demo: tuple[Any, Path]) -> None:
    _, page = demo
    load(browser, page)
    assert browser.execute_script(FLAT_CHARTS) == []
    lines = browser.execute_script("return Array.from(document.querySelectorAll('ul.flat li')).map(l => l.innerText)")
    assert "Channel weights, constant over the run (not drawn): format 1, correct 1, length 1." in lines
    assert "clip_ratio, clip_ratio_high, clip_ratio_low: constant at 0 over the run (not drawn)." in lines
    assert browser.execute_script("return document.getElementById('chart-weights')") is None
    # The callback's collapse_doctor/* series are drawn from the rollouts already: named in one line, not redrawn.
    titles = browser.execute_script(
        "return Array.from(document.querySelectorAll('#scalars figure h3')).map(h => h.innerText)"
    )
    assert titles and not {
        "advantage_std",
        "channel_rel_gain",
        "channel_signal_share",
        "channel_weight",
        "channel_zero_var_share",
    } & set(titles)
    assert any(
        line.startswith("Not drawn again: collapse_doctor/advantage_std, collapse_doctor/rel_gain/*") for line in lines
    )
    every = browser.execute_script("return Array.from(document.querySelectorAll('figure h3')).map(h => h.innerText)")
    assert len(every) == len(set(every))


def test_the_table_of_contents_stays_in_view(browser: Any, demo: tuple[Any, Path]) -> None:
    _, page = demo
    load(browser, page)
    links = browser.execute_script("return Array.from(document.querySelectorAll('nav a')).map(a => a.innerText)")
    assert links[:2] == ["Findings", "Run"] and "Scalars" in links and links[-1] == "Examples"
    assert _box(browser, "nav")["height"] < 48  # one line at 1400 px
    for where in ("document.getElementById('scalars').offsetTop", "document.documentElement.scrollHeight"):
        browser.execute_script(f"window.scrollTo(0, {where})")
        time.sleep(0.2)
        nav = _box(browser, "nav")
        assert abs(nav["top"]) <= 1 and nav["bottom"] < 60, nav
        inside = browser.execute_script(
            "return Array.from(document.querySelectorAll('nav a, nav input')).every(a => {"
            "const r = a.getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight "
            "&& r.right <= window.innerWidth && document.elementFromPoint(r.left + 2, r.top + r.height / 2)"
            ".closest('nav') !== null; })"
        )
        assert inside
    browser.execute_script("window.scrollTo(0, 0)")
    browser.find_element("css selector", "nav a[href='#scalars']").click()
    time.sleep(0.3)
    assert browser.execute_script("return document.querySelector('nav a.current').innerText") == "Scalars"
    assert _box(browser, "#scalars h2")["top"] >= _box(browser, "nav")["bottom"]  # the heading is not under it
