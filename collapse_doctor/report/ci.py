"""CI outputs of a Diagnosis: JUnit XML, GitHub workflow annotations, a Markdown summary."""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from xml.etree import ElementTree as ET

from collapse_doctor.core.findings import VERDICTS, Finding, Severity
from collapse_doctor.core.numbers import fixed, pct, share_pct
from collapse_doctor.core.result import Diagnosis, signal_sentence
from collapse_doctor.core.text_safety import describe_sources, printable

if TYPE_CHECKING:
    from collapse_doctor.pipeline.compare import GateResult


def _targets(code: str) -> str:
    """What one finding of a detector is about: ``run``, ``channel`` or ``pair`` (JUnit has a case per target)."""
    from collapse_doctor.judge.detectors import REGISTRY

    detector = REGISTRY.get(code)
    return detector.targets if detector is not None else "run"


def _cases(diagnosis: Diagnosis) -> list[tuple[str, str, list[Finding]]]:
    """(code, case name, findings) per detector, and per channel (or pair) for per-channel detectors."""
    cases: list[tuple[str, str, list[Finding]]] = []
    series = diagnosis.series
    for code, name in diagnosis.detectors.items():
        found = [f for f in diagnosis.findings if f.code == code]
        base = f"{code} {name}"
        targets_of = _targets(code)
        if targets_of != "run" and code not in diagnosis.skipped:
            targets = [" / ".join(p) for p in series.pairs] if targets_of == "pair" else list(series.channels)
            crashed = [f for f in found if f.severity == Severity.ERROR]
            for target in targets:
                names = target.split(" / ")
                mine = [f for f in found if f.channels and f.channels[: len(names)] == tuple(names)]
                cases.append((code, f"{base} [{target}]", mine + crashed))
        else:
            cases.append((code, base, found))
    return cases


def junit_xml(diagnosis: Diagnosis, gate: GateResult | None = None) -> str:
    """One testcase per detector (and channel where it applies): failure at or above fail-on, error on crash.

    With ``gate`` (``scan --baseline``) the gate decides, as it decides the exit code: one testcase per criterion
    (a failure where the run regressed), and the findings are reported in their testcases without failing them.
    """
    suite = _suite(diagnosis, "collapse-doctor", gate)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def junit_runs_xml(
    diagnoses: Sequence[Diagnosis], failures: Sequence[tuple[str, str]] = (), gates: Sequence[GateResult] = ()
) -> str:
    """Several runs: one ``<testsuite name="collapse-doctor: RUN">`` per run inside ``<testsuites>``; a run that
    could not be scanned (``failures``: ``(run, error)``) is a suite with one errored "run scanned" case; ``gates``
    (one per run, in order) as in :func:`junit_xml`."""
    root = ET.Element("testsuites", name="collapse-doctor")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    gated: list[GateResult | None] = list(gates) if gates else [None] * len(diagnoses)
    suites = [
        _suite(d, f"collapse-doctor: {printable(d.run.name or '?')}", g) for d, g in zip(diagnoses, gated, strict=True)
    ]
    for name, error in failures:
        suite = ET.Element(
            "testsuite", name=f"collapse-doctor: {printable(name)}", tests="1", failures="0", errors="1", skipped="0"
        )
        case = ET.SubElement(suite, "testcase", classname="collapse-doctor.run", name="run scanned", time="0")
        ET.SubElement(case, "error", message=printable(error), type="InputError")
        suites.append(suite)
    for suite in suites:
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{sum(d.seconds for d in diagnoses):.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(diagnosis: Diagnosis, name: str, gate: GateResult | None = None) -> ET.Element:
    failing = {id(f) for f in diagnosis.failing()} if gate is None else set()  # the gate decides, not fail-on
    # JUnit's timestamp is when the suite ran (ISO 8601, local time, no zone, as the Ant schema has it)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    suite = ET.Element("testsuite", name=name, timestamp=stamp, hostname=platform.node() or "localhost")
    tests = failures = errors = skipped = 0
    for code, name, found in _cases(diagnosis):
        case = ET.SubElement(suite, "testcase", classname=f"collapse-doctor.{code}", name=name, time="0")
        tests += 1
        if code in diagnosis.skipped:
            ET.SubElement(case, "skipped", message=diagnosis.skipped[code])
            skipped += 1
            continue
        crashed = [f for f in found if f.severity == Severity.ERROR]
        if crashed:
            errors += 1
            element = ET.SubElement(case, "error", message=crashed[0].title, type="DetectorError")
            element.text = crashed[0].message
            continue
        bad = [f for f in found if id(f) in failing]
        if bad:
            failures += 1
            worst = bad[0]
            element = ET.SubElement(
                case, "failure", message=f"{worst.severity.label}: {worst.title}", type=worst.severity.label
            )
            element.text = "\n".join(_describe(f) for f in bad)
        elif found:
            ET.SubElement(case, "system-out").text = "\n".join(_describe(f) for f in found)
    if diagnosis.verdict == "inconclusive" and gate is None:
        case = ET.SubElement(suite, "testcase", classname="collapse-doctor.run", name="run judged", time="0")
        tests += 1
        if diagnosis.exit_code():
            failures += 1
            ET.SubElement(case, "failure", message="no selected detector could judge this run", type="inconclusive")
    baseline = printable(gate.baseline) if gate is not None else ""
    for criterion in gate.criteria if gate is not None else ():
        label = f"{criterion.name}: {printable(criterion.subject)}"
        case = ET.SubElement(suite, "testcase", classname="collapse-doctor.gate", name=label, time="0")
        tests += 1
        if criterion.failed:
            failures += 1
            element = ET.SubElement(case, "failure", message=printable(criterion.detail), type="regression")
            element.text = f"baseline {baseline}: {printable(criterion.detail)}"
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    suite.set("time", f"{diagnosis.seconds:.3f}")
    return suite


def _describe(finding: Finding) -> str:
    where = f" (onset step {finding.onset_step})" if finding.onset_step is not None else ""
    return f"{finding.code} {finding.severity.label}{where}: {finding.message} Remedy: {finding.remedy}"


def _escape_property(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A").replace(":", "%3A").replace(",", "%2C")


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_annotations(diagnosis: Diagnosis) -> str:
    """GitHub Actions workflow commands: ::error for failing findings, ::warning / ::notice for the rest."""
    failing = {id(f) for f in diagnosis.failing()}
    source = diagnosis.run.sources[0] if diagnosis.run.sources else ""
    lines = []
    for finding in diagnosis.findings:
        if id(finding) in failing:
            command = "error"
        elif finding.severity >= Severity.WARNING:
            command = "warning"
        else:
            command = "notice"
        title = _escape_property(f"{finding.code} {finding.title}")
        body = _escape_data(f"{finding.message} Remedy: {finding.remedy}")
        lines.append(f"::{command} file={_escape_property(source)},title={title}::{body}")
    verdict = VERDICTS[diagnosis.verdict]
    if diagnosis.verdict == "inconclusive":
        lines.append(f"::warning title=collapse-doctor::{verdict}: {_escape_data(diagnosis.gate_summary())}")
    clause = diagnosis.coverage_clause()
    rests = f" ({_escape_data(clause)})" if clause else ""
    lines.append(f"::notice title=collapse-doctor::{verdict}{rests}: {len(diagnosis.findings)} finding(s)")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Escape text for a Markdown table cell or paragraph (control characters shown escaped, HTML-escaped, pipes
    escaped)."""
    import html

    return html.escape(printable(text), quote=False).replace("|", "\\|")


def _fmt(value: float | None) -> str:
    return "-" if value is None else fixed(value)


def markdown_summary(diagnosis: Diagnosis, gate: GateResult | None = None) -> str:
    """A Markdown summary for $GITHUB_STEP_SUMMARY or a pull-request comment.

    With ``gate`` (``scan --baseline``) the gate decides: its conclusion (:func:`~collapse_doctor.pipeline.compare.
    conclude`, worded as in the terminal) comes right under the heading and its criteria after the findings."""
    run = diagnosis.run
    icon = {"healthy": "✅", "inconclusive": "❔", "at_risk": "⚠️", "collapsed": "❌"}[diagnosis.verdict]
    clause = diagnosis.coverage_clause()
    verdict = VERDICTS[diagnosis.verdict] + (f" ({_md(clause)})" if clause else "")
    out = [f"## {icon} collapse-doctor: {verdict}", ""]
    if gate is not None:
        out += [markdown_conclusion(gate), ""]
    out += [signal_sentence(run.signal), ""]
    if run.rollouts == 0 and run.scalar_points:
        out += [
            f"`{_md(describe_sources(run.sources))}`: {run.steps:,} steps in the scalar log "
            f"({run.scalar_points:,} points, {_md(run.scalar_framework or 'unrecognised tags')}), no rollouts; "
            f"fail-on `{diagnosis.config.fail_on}`.",
            "",
            "| channel | weight | reward std peak -> now | mean reward |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| {_md(row['channel'])} | {row['weight']:g} | {_fmt(row['reward_std_peak'])} -> "
            f"{_fmt(row['reward_std_now'])} | {_fmt(row['reward_mean'])} |"
            for row in diagnosis.channel_table()
        ]
        return _markdown_findings(diagnosis, out, gate)
    group_size = (
        str(run.group_size_min)
        if run.group_size_min == run.group_size_max
        else f"{run.group_size_min}-{run.group_size_max}"
    )
    out += [
        f"`{_md(describe_sources(run.sources))}`: {run.steps:,} steps, {run.rollouts:,} rollouts, "
        f"group size {group_size}, algorithm {run.algorithm.upper()}; "
        f"fail-on `{diagnosis.config.fail_on}`.",
        "",
        "| channel | weight | rel_gain peak -> now | variance share GRPO / GDPO | constant groups |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in diagnosis.channel_table():
        share = f"{share_pct(row['signal_share_grpo'])} / {share_pct(row['signal_share_gdpo'])}"
        out.append(
            f"| {_md(row['channel'])} | {row['weight']:g} | {_fmt(row['rel_gain_peak'])} -> "
            f"{_fmt(row['rel_gain_now'])} | {share} | {pct(row['zero_variance_share'])} |"
        )
    return _markdown_findings(diagnosis, out, gate)


def markdown_conclusion(gate: GateResult) -> str:
    """The gate's outcome and conclusion as one paragraph: ``**Regression gate against `GOOD`: failed.** The run is
    worse than the baseline: ...; the gate fails the run`` (the sentence that opens `scan --baseline` in a terminal)."""
    from collapse_doctor.pipeline.compare import conclude
    from collapse_doctor.report.compare_text import conclusion_sentence

    sentence = conclusion_sentence(conclude(gate), "the baseline", "the run")
    outcome = "failed ❌" if gate.failed else "passed ✅"
    return f"**Regression gate against `{_md(gate.baseline)}`: {outcome}.** {_md(sentence[:1].upper() + sentence[1:])}"


def _markdown_gate(gate: GateResult) -> list[str]:
    """The gate's criteria as a table, each with its numbers and result, then the gate's summary."""
    from collapse_doctor.report.compare_text import criterion_value

    out = [
        "",
        f"### Regression gate (fail-on `{gate.settings.fail_on}`)",
        "",
        "| criterion | baseline | run | limit | detail | result |",
        "|---|---:|---:|---:|---|---|",
    ]
    for c in gate.criteria:
        share = c.name == "zero_advantage_share"
        cells = [criterion_value(v, share) for v in (c.baseline, c.run, c.limit)]
        result = "**failed**" if c.failed else "ok"
        out.append(f"| {_md(c.subject)} | {' | '.join(_md(v) for v in cells)} | {_md(c.detail)} | {result} |")
    out += ["", _md(gate.summary())]
    return out


def _markdown_findings(diagnosis: Diagnosis, out: list[str], gate: GateResult | None = None) -> str:
    out.append("")
    if not diagnosis.findings:
        out.append("No findings.")
    else:
        out += [
            f"| severity | code | finding | onset | remedy | {diagnosis.run.counterfactual_algorithm} resolves |",
            "|---|---|---|---:|---|---|",
        ]
        for f in diagnosis.findings:
            resolves = {True: "yes", False: "no", None: "-"}[f.gdpo_resolves]
            if f.gdpo_resolves is not None and diagnosis.counterfactual_of(f) != diagnosis.run.counterfactual_algorithm:
                resolves += f" ({diagnosis.counterfactual_of(f)})"  # a finding from before a hybrid switch
            onset = "-" if f.onset_step is None else str(f.onset_step)
            out.append(
                f"| {f.severity.label} | {f.code} | **{_md(f.title)}**: {_md(f.message)} | {onset} | "
                f"{_md(f.remedy)} | {resolves} |"
            )
    if gate is not None:
        out += _markdown_gate(gate)
    return "\n".join(out) + "\n"
