"""Screenshots of the first screen of the HTML report and of the comparison page, for docs/report.md.

Run:  .venv/bin/python benchmarks/screenshots.py [--out docs/images]

Writes the report of ``sample_logs/demo-grpo`` and the comparison of ``sample_logs/demo-grpo`` with
``sample_logs/demo-gdpo`` under benchmarks/data/ (git-ignored), opens each in headless Chromium (selenium +
chromedriver, as the browser tests) with a 1400x900 viewport, waits until every chart is drawn, and saves what a
reader sees before scrolling as ``report-first-screen.png`` and ``compare-first-screen.png``. It prints each page's
height at 1400 px wide.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
WIDTH, HEIGHT = 1400, 900
READY_TIMEOUT_S = 60.0


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("headless Chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT + 200}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    # The viewport itself 1400x900, whatever the window around it.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


def first_screen(driver: Any, page: Path, out: Path) -> int:
    """Save the first screen of ``page`` to ``out``; returns the page's height in CSS pixels."""
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not driver.execute_script("return window.__reportReady === true"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{page}: the page did not finish drawing in {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.2)
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    out.write_bytes(base64.b64decode(shot["data"]))
    return int(driver.execute_script("return document.documentElement.scrollHeight"))


def main() -> None:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.compare import compare_runs
    from collapse_doctor.report.html.compare_html import write_comparison_html
    from collapse_doctor.report.outputs import make_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the pages name the inputs as a reader types them: sample_logs/demo-grpo
    DATA.mkdir(parents=True, exist_ok=True)
    options = ScanOptions(device="cpu")
    demo = [str(Path("sample_logs") / "demo-grpo"), str(Path("sample_logs") / "demo-gdpo")]
    report = DATA / "screenshot-report.html"
    make_report([demo[0]], report, options)
    comparison, inputs = compare_runs(demo, options)
    compare = DATA / "screenshot-compare.html"
    write_comparison_html(compare, comparison, inputs=inputs)
    driver = browser()
    try:
        for page, name in ((report, "report-first-screen.png"), (compare, "compare-first-screen.png")):
            height = first_screen(driver, page, args.out / name)
            print(f"{args.out / name}: {page.name} is {height:,} px tall at {WIDTH} px wide")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
