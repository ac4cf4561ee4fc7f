"""How a comparison's conclusion is worded and where it goes: the first lines of the text, the top of the page, the
gates of ``scan --baseline``; numbers rounded as in the scan report.

The diagnoses are the pipeline tests' hand-built ones, so every number in a sentence follows from the values set.
"""

from __future__ import annotations

import io
import re

from collapse_doctor.core.findings import Severity
from collapse_doctor.pipeline.compare import ComparedRun, GateSettings, compare, conclude, regression_gate
from collapse_doctor.report.compare_outputs import write_gates
from collapse_doctor.report.compare_text import conclusion_sentence, render_comparison
from collapse_doctor.report.html.compare_html import build_comparison_html
from tests.unit.pipeline.test_compare_conclusion import diagnosis, finding


def sentence(base_values: dict[str, object], run_values: dict[str, object], *, gated: bool = True) -> str:
    base, run = diagnosis(**base_values), diagnosis(**run_values)
    gate = regression_gate(ComparedRun("A", base), ComparedRun("B", run), GateSettings())
    return conclusion_sentence(conclude(gate), "A", "B", gated=gated)


def test_worse_gives_both_values_rounded_as_the_scan_report() -> None:
    """0.1049 and 0.3051 are shares: whole percents; rel_gain 0.8123 -> 0.4051 in two decimals (the terminal)."""
    text = sentence(
        {"zero_share": 0.1049, "rel_gain_now": {"format": 0.8123}},
        {"zero_share": 0.3051, "rel_gain_now": {"format": 0.4051}, "findings": (finding("CD402", "format", "x"),)},
    )
    assert text == (
        "B is worse than A: verdict healthy -> at risk, zero-advantage share 10% -> 31%, `format` rel_gain"
        " 0.81 -> 0.41, new CD402 (`format`, `x`); the gate fails B"
    )


def test_no_worse_better_and_ungated_wording() -> None:
    assert sentence({}, {}) == "B is no worse than A on every measure compared; the gate passes B"
    assert sentence({}, {}, gated=False) == "B is no worse than A on every measure compared; --gate would pass B"
    better = sentence(
        {"zero_share": 0.30, "findings": (finding("CD102"),)},
        {"zero_share": 0.10},
    )
    assert better == (
        "B is better than A: verdict at risk -> healthy, zero-advantage share 30% -> 10%, CD102 gone; the gate passes B"
    )


def test_what_could_not_be_compared_is_said_and_counted_against_the_run() -> None:
    renamed = sentence(
        {"rel_gain_now": {"format": 0.8, "length": 0.4, "style": 0.3}}, {"rel_gain_now": {"format": 0.8}}
    )
    assert renamed == (
        "B cannot be cleared against A: `length` and `style` rel_gain not compared (no such channel in B),"
        " which counts against B; the gate fails B"
    )
    both = sentence(
        {"zero_share": 0.1, "rel_gain_now": {"format": 0.8, "length": 0.4}},
        {"zero_share": 0.3, "rel_gain_now": {"format": 0.8}},
    )
    assert both == (
        "B is worse than A: zero-advantage share 10% -> 30%; counted against B: `length` rel_gain not compared"
        " (no such channel in B); the gate fails B"
    )
    neither = sentence({"zero_share": None}, {"zero_share": None})
    assert neither == (
        "B is no worse than A on every measure compared; zero-advantage share not compared"
        " (no rollouts in either run); the gate passes B"
    )


def test_findings_below_the_level_escalated_and_eased() -> None:
    text = sentence(
        {"findings": (finding("CD104", severity=Severity.INFO), finding("CD201", severity=Severity.WARNING))},
        {"findings": (finding("CD104", severity=Severity.WARNING), finding("CD201", severity=Severity.CRITICAL))},
    )
    assert "CD104 info -> warning, CD201 warning -> critical; the gate fails B" in text


def test_the_text_opens_with_the_conclusion_of_every_later_run_wrapped_without_trailing_spaces() -> None:
    base = diagnosis(zero_share=0.10, rel_gain_now={"a-very-long-channel-name-" * 2: 0.8, "format": 0.8})
    runs = [base, diagnosis(zero_share=0.40, rel_gain_now={"format": 0.2}), diagnosis(zero_share=0.10)]
    out = io.StringIO()
    render_comparison(compare(runs, ["base", "worse", "same"]), out, color=False, terminal=True, width=110)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("B is worse than A: zero-advantage share 10% -> 40%, `format` rel_gain 0.80 -> 0.20")
    head = "\n".join(lines[: lines.index("")])
    assert "--gate would fail B" in head and "C cannot be cleared against A" in head
    assert lines[lines.index("") + 1] == "Compare 3 runs (aligned by step)"
    first = lines[: lines.index("")]
    assert all(len(line) <= 110 and line == line.rstrip() for line in first)
    # A measure stays on one line ("10% -> 40%" is never split), continuation lines are indented.
    assert all(line.startswith(("B ", "C ", "  ")) for line in first)
    assert not any(line.endswith("->") or line.lstrip().startswith("->") for line in first)


def test_scan_baseline_prints_the_conclusion_before_each_gate() -> None:
    base, run = diagnosis(zero_share=0.10), diagnosis(zero_share=0.30)
    gates = [regression_gate(ComparedRun("good.parquet", base), ComparedRun("new.parquet", run), GateSettings())]
    out = io.StringIO()
    write_gates(gates, out, color=False)
    text = out.getvalue()
    assert text.startswith(
        "\nThe run is worse than the baseline: zero-advantage share 10% -> 30%; the gate fails the run\n"
    )
    assert text.index("the gate fails the run") < text.index("Regression gate (fail-on warning)")


def test_the_page_opens_with_the_conclusion_and_rounds_its_numbers() -> None:
    base = diagnosis(zero_share=0.1049, rel_gain_now={"format": 0.81234, "length": 0.4})
    run = diagnosis(zero_share=0.3051, rel_gain_now={"format": 0.40567, "length": 0.4})
    page = build_comparison_html(compare([base, run], ["base/run", "new/run"], gate=GateSettings()))
    main = page.split("<main>", 1)[1].lstrip()
    assert main.startswith('<section id="conclusion">')
    conclusion = re.search(r'<p class="finding conclusion"[^>]*data-gate="fails"[^>]*>(.*?)</p>', main)
    assert conclusion is not None
    # The page's rounding, as the scan report's page: 2 significant digits for rel_gain, whole percents.
    assert conclusion.group(1) == (
        "B is worse than A: zero-advantage share 10% -&gt; 31%, <code>format</code> rel_gain 0.81 -&gt; 0.41;"
        " the gate fails B"
    )
    assert "0.81234" not in page and "0.40567" not in page.split('id="report-data"')[0]
    tables = page.split('<section id="runs">', 1)[1].split('<section id="findings">', 1)[0]
    assert ">1 -> 0.81<" in tables and ">1 -> 0.41<" in tables and "0.406" not in tables  # peak -> now per run
    assert re.search(r"<td class='num'>0\.61</td>", tables)  # the gate's limit 0.81234 * 0.75, to 2 digits
