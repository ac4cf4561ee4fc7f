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
