"""The self-contained, offline HTML report of a Diagnosis (``collapse-doctor report --html``).

:func:`build_report` renders a Diagnosis (and the optional :class:`ReportExtras` gathered during the
scan) into one HTML page: plotly.js embedded once, the figures as JSON data, no network fetch. Every
string that comes from the logs is HTML-escaped. :func:`write_report` writes it atomically.
The CLI writes it through :mod:`collapse_doctor.report.outputs` like every other output
(:func:`~collapse_doctor.report.outputs.make_report` is the one call from Python).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np

from collapse_doctor.core.findings import VERDICTS, severity_counts
from collapse_doctor.core.numbers import pct, share_pct
from collapse_doctor.core.result import signal_sentence
from collapse_doctor.core.text_safety import printable, shortened
from collapse_doctor.report.html.collect import ExampleGroup, ReportExtras
from collapse_doctor.report.html.figures import (
    FINDING_COLORS,
    Chart,
    Section,
    StepFigures,
    channel_color,
    esc,
    histogram_payload,
    sections,
)

if TYPE_CHECKING:
    from collapse_doctor.core.findings import Finding
    from collapse_doctor.core.result import Diagnosis

PREVIEW_CHARS = 90
"""Text longer than this shows a preview and expands on click."""
_CODE_SPAN = re.compile(r"`([^`]+)`")


PLOTLY_BUNDLE = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"
"""plotly.js with the cartesian trace types only (see vendor/README.md): a third of the full bundle."""
PLOTLY_TRACE_TYPES = frozenset(
    {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie"}
    | {"scatter", "scatterternary", "violin"}
)
"""Trace types in :data:`PLOTLY_BUNDLE`."""


def plotly_js() -> str:
    """The plotly.js source to embed: the vendored cartesian bundle, else the plotly package's full one."""
    try:
        return PLOTLY_BUNDLE.read_text(encoding="utf-8")
    except OSError:
        import plotly.offline

        return str(plotly.offline.get_plotlyjs())


def build_report(diagnosis: Diagnosis, extras: ReportExtras | None = None) -> str:
    """Render ``diagnosis`` as one HTML page (a pure function of its inputs)."""
    from collapse_doctor.core.version import __version__

    chart_sections = sections(diagnosis, extras)
    charts = [c for s in chart_sections for c in s.charts]
    payload: dict[str, Any] = {
        "charts": [
            {"id": c.id, "data": c.data, "layout": c.layout, "steps": c.steps_axis}
            | ({"xspan": span} if (span := c.x_span()) is not None else {})
            for c in charts
        ],
        "histograms": None,
    }
    if extras is not None and extras.histograms is not None and len(extras.histograms.steps):
        payload["histograms"] = histogram_payload(diagnosis, extras.histograms)
    marked = StepFigures(diagnosis)
    body = [
        _header(diagnosis, VERDICTS[diagnosis.verdict]),
        _nav(chart_sections, bool(extras is not None and extras.examples), marked if charts else None),
        "<main>",
        _findings(diagnosis, marked),
        _overview(diagnosis),
        *(_section(s, payload["histograms"]["steps"] if payload["histograms"] else []) for s in chart_sections),
        _examples(diagnosis, extras),
        f"<footer>collapse-doctor {esc(__version__)}. Offline report: plotly.js is embedded, nothing is fetched."
        "</footer>",
        "</main>",
    ]
    title = f"collapse-doctor: {VERDICTS[diagnosis.verdict]} - {', '.join(diagnosis.run.sources[:1])}"
    return html_page(title, body, payload)


def html_page(title: str, body: Sequence[str], payload: Mapping[str, Any]) -> str:
    """A whole offline page in the report's style: ``body`` (HTML), then the charts' data (``payload``),
    plotly.js and the report's script. Shared by the report and ``compare --html``."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{_css()}</style>",
            "</head>",
            "<body>",
            *body,
            f'<script type="application/json" id="report-data">{_script_json(dict(payload))}</script>',
            # plotly.js last: the header, findings and tables show before it is parsed.
            f"<script>{plotly_js()}</script>",
            f"<script>{_script()}</script>",
            "</body>",
            "</html>",
        ]
    )


def write_report(
    output: str | Path,
    diagnosis: Diagnosis,
    extras: ReportExtras | None = None,
    *,
    inputs: Sequence[Path] | None = None,
) -> int:
    """Render and write the report atomically, never over one of ``inputs`` (default: the run's sources).

    Returns the size written in bytes.
    """
    from collapse_doctor.io.storage.atomic import atomic_path

    text = build_report(diagnosis, extras).encode("utf-8", errors="backslashreplace")  # undecodable file names
    if inputs is None:
        inputs = [Path(s) for s in diagnosis.run.sources]
    with atomic_path(output, inputs=inputs) as tmp:
        tmp.write_bytes(text)
    return len(text)


def run_report_paths(output: str | Path, runs: Sequence[str]) -> list[Path]:
    """Where the reports of several runs go: ``OUT`` becomes an index, each run ``<OUT stem>-<run>.html`` beside
    it (run names made file-safe, numbered where two would collide).

    >>> [p.name for p in run_report_paths("out/report.html", ["exp/a", "exp/b", "exp:a"])]
    ['report-exp-a.html', 'report-exp-b.html', 'report-exp-a-3.html']
    """
    output = Path(output)
    out: list[Path] = []
    taken: set[str] = set()
    for index, run in enumerate(runs, start=1):
        slug = re.sub(r"[^A-Za-z0-9._]+", "-", run).strip("-.")[:80] or f"run{index}"
        name = f"{output.stem}-{slug}"
        if name in taken:
            name = f"{name}-{index}"
        taken.add(name)
        out.append(output.with_name(name + (output.suffix or ".html")))
    return out


def build_index(diagnoses: Sequence[Diagnosis], pages: Sequence[Path]) -> str:
    """A small page that lists several runs (verdict, findings, signal budget) and links each run's report."""
    from collapse_doctor.core.findings import worst_verdict

    rows = "".join(
        f'<tr><td><a href="{esc(quote(page.name))}">{esc(printable(d.run.name or page.stem))}</a></td>'
        f'<td><span class="verdict {esc(d.verdict)}">{esc(VERDICTS[d.verdict])}</span></td>'
        f"<td>{esc(severity_counts(f.severity for f in d.findings) or 'no findings')}</td>"
        f"<td>{esc(signal_sentence(d.run.signal))}</td></tr>"
        for d, page in zip(diagnoses, pages, strict=True)
    )
    key = worst_verdict(d.verdict for d in diagnoses)
    worst = VERDICTS[key]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>collapse-doctor: {esc(worst)} - {len(diagnoses)} runs</title>",
            f"<style>{_css()}</style></head><body>",
            f'<header class="top"><div class="inner"><h1><span class="verdict {esc(key)}">{esc(worst)}</span>'
            f"<span>collapse-doctor: {len(diagnoses)} runs</span></h1></div></header>",
            "<main><table><thead><tr><th>run</th><th>verdict</th><th>findings</th><th>signal budget</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></main></body></html>",
        ]
    )


# -- page parts ------------------------------------------------------------------------------------
def _css() -> str:
    from collapse_doctor.report.html.assets import CSS

    return CSS


def _script() -> str:
    from collapse_doctor.report.html.assets import SCRIPT

    return SCRIPT


def _script_json(payload: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' can end it or open a comment."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _rich(text: str) -> str:
    """Escape text from a finding; `backticked` spans (channel names) become <code>."""
    return _CODE_SPAN.sub(r"<code>\1</code>", esc(text))


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return "-" if not math.isfinite(number) else f"{number:.{digits}g}"
    if isinstance(value, dict):
        return ", ".join(f"{esc(k)}={_fmt(v, digits)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v, digits) for v in value)
    return esc(str(value))


def _header(diagnosis: Diagnosis, verdict: str) -> str:
    """The verdict and the signal budget first (the text output's first line), then what the verdict rests on, the
    inputs' root and what ``--fail-on`` makes of the findings."""
    summary = severity_counts(f.severity for f in diagnosis.findings) or "no findings"
    exit_text = diagnosis.gate_summary().replace(" -> ", ", ")
    root, _ = inputs_summary(diagnosis.run.sources)
    clause = diagnosis.coverage_clause()  # what the verdict rests on, when some checks could not run
    rests = f'<div class="muted">the verdict rests on {esc(clause)}</div>' if clause else ""
    name = f" run {_short_code(diagnosis.run.name, 60, tag='')}" if diagnosis.run.name else ""
    return (
        '<header class="top"><div class="inner">'
        f'<h1><span class="verdict {esc(diagnosis.verdict)}">{esc(verdict)}</span>'
        f'<span id="budget" class="budget">{esc(signal_sentence(diagnosis.run.signal))}</span></h1>'
        f'<div class="muted">collapse-doctor report{name} · {_short_code(root, 100)} · {esc(summary)}; fail-on '
        f"{esc(diagnosis.config.fail_on)}: {exit_text}</div>{rests}"
        "</div></header>"
    )


def _short_code(text: str, width: int, tag: str = "code") -> str:
    """``text`` cut in the middle to ``width`` characters, whole in its tooltip (a sweep's deep paths); in ``tag``
    (none: plain text, in a ``span`` when cut)."""
    shown = shortened(text, width)
    if shown == text:
        return f"<{tag}>{esc(text)}</{tag}>" if tag else esc(text)
    return f'<{tag or "span"} title="{esc(printable(text))}">{esc(shown)}</{tag or "span"}>'


def _nav(chart_sections: list[Section], examples: bool, marked: StepFigures | None) -> str:
    """The table of contents, kept in view at the top of the window, with one shading toggle per marked finding
    (``marked``: the step charts' findings; ``None`` without step charts)."""
    links = ['<a href="#findings">Findings</a>', '<a href="#overview">Run</a>']
    links += [f'<a href="#{esc(s.id)}" title="{esc(s.title)}">{esc(s.short or s.title)}</a>' for s in chart_sections]
    if examples:
        links.append('<a href="#examples">Examples</a>')
    toggles = []
    for k, finding in marked.marked() if marked is not None else []:
        if finding.step_range is None:
            continue
        on = marked.shade_on(finding) if marked is not None else False
        first, last = finding.step_range
        why = "" if on else " (off at first: it covers nearly the whole run)"
        toggles.append(
            f'<label class="shade" title="shade the steps of {esc(finding.code)} on every step chart{why}">'
            f'<input type="checkbox" class="shade-toggle" data-shade="{k}"{" checked" if on else ""}>'
            f'<span class="swatch" style="background:{FINDING_COLORS[k]}"></span>{esc(finding.code)} '
            f'<span class="muted">{first}-{last}</span></label>'
        )
    shading = f'<div class="toggles"><span class="muted">shade:</span>{"".join(toggles)}</div>' if toggles else ""
    return f'<nav id="toc"><div class="inner"><div class="links">{"".join(links)}</div>{shading}</div></nav>'


def _overview(diagnosis: Diagnosis) -> str:
    run = diagnosis.run
    size = (
        str(run.group_size_min)
        if run.group_size_min == run.group_size_max
        else f"{run.group_size_min}-{run.group_size_max}"
    )
    rows = [("run", _short_code(run.name, 60, tag=""))] if run.name else []
    rows += [
        ("inputs", _inputs(run.sources)),
        ("steps", f"{run.steps:,} (steps {_fmt(run.first_step)} to {_fmt(run.last_step)})"),
        ("algorithm", f"{esc(run.algorithm.upper())} <span class='muted'>({esc(run.algorithm_source)})</span>"),
    ]
    if run.rollouts:
        rows.insert(-1, ("rollouts", f"{run.rollouts:,} in {run.groups:,} groups of {esc(size)}"))
        rows.append(("recomputed on", f"{esc(run.device)} in {diagnosis.seconds:.1f} s"))
    else:
        rows.insert(-1, ("rollouts", "none: the input is a scalar log only"))
    if run.scalar_points:
        framework = f" ({esc(run.scalar_framework)})" if run.scalar_framework else ""
        rows.append(("scalar log", f"{run.scalar_points:,} points{framework}"))
    truth = run.ground_truth or {}
    if truth.get("scenario"):
        expected = ", ".join(str(c) for c in truth.get("expected_codes") or []) or "none"
        rows.append(
            (
                "ground truth",
                f"simulated scenario <code>{esc(truth['scenario'])}</code>: onset step "
                f"{_fmt(truth.get('onset_step'))}, expected {esc(expected)}",
            )
        )
    rows += [("not read", esc(note)) for note in run.set_aside]
    rows += [("warning", f"<span style='color:var(--warning)'>{esc(w)}</span>") for w in run.warnings]
    run_table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    channel_table = _channel_table(diagnosis)
    return (
        '<section id="overview"><h2>Run</h2><div class="cards">'
        f'<div class="card"><table class="run">{run_table}</table></div>'
        f'<div class="card"><h3>Channels <span class="muted">(now = median of the last 10% of steps)</span></h3>'
        f"{channel_table}</div>"
        f"{_counterfactual_card(diagnosis)}"
        "</div></section>"
    )


def _counterfactual_card(diagnosis: Diagnosis) -> str:
    """The estimators on the same rewards (``run.counterfactuals``), as the text output merges them."""
    from collapse_doctor.report.text import counterfactual_rows

    table = diagnosis.run.counterfactuals
    if not table:
        return ""
    rows = counterfactual_rows(table)
    body = []
    for row in rows:
        name = esc(" = ".join(row["names"])) + (" <span class='muted'>(run)</span>" if row["own"] else "")
        if "cells" in row:
            cells = "".join(f'<td class="num">{esc(c)}</td>' for c in row["cells"][:2])
            note = f" <span class='muted'>({esc(row['note'])})</span>" if row.get("note") else ""
            body.append(
                f'<tr><td class="name">{name}</td>{cells}<td class="decides">{esc(row["cells"][2])}{note}</td></tr>'
            )
        else:
            body.append(f'<tr><td class="name">{name}</td><td colspan="3" class="muted">{esc(row["note"])}</td></tr>')
    sample = table["sample"]
    return (
        f'<div class="card" id="estimators"><h3>Estimators on the same rewards <span class="muted">'
        f"({sample['groups']:,} groups, up to {sample['groups_per_step']} per step)</span></h3>"
        "<table><tr><th>estimator</th><th class='num'>no gradient</th><th class='num'>tied pairs</th>"
        f"<th>sign decided by</th></tr>{''.join(body)}</table></div>"
    )


def _findings(diagnosis: Diagnosis, marked: StepFigures) -> str:
    """The findings, most severe first: headline, message and remedy in view, the rest one click away."""
    colors = {id(f): FINDING_COLORS[k] for k, f in marked.marked()}
    cards = "".join(
        _finding(f, diagnosis.counterfactual_of(f), colors.get(id(f)), k) for k, f in enumerate(diagnosis.findings)
    )
    if not cards:
        cards = (
            '<p class="muted">No findings: no selected detector could judge this run (see below).</p>'
            if diagnosis.verdict == "inconclusive"
            else '<p class="muted">No findings: no detector found a sustained problem.</p>'
        )
    else:
        cards = f'<div class="findings">{cards}</div>'
    by_reason: dict[str, list[str]] = {}
    for code, reason in diagnosis.skipped.items():
        by_reason.setdefault(reason, []).append(code)
    skipped = ""
    if by_reason:
        lines = "".join(f"<li>{esc(', '.join(codes))}: {esc(reason)}</li>" for reason, codes in by_reason.items())
        skipped = (
            f'<details class="skipped"><summary>{len(diagnosis.skipped)} check(s) skipped</summary>'
            f"<ul>{lines}</ul></details>"
        )
    marks = ""
    if marked.marked() and diagnosis.series.num_steps:
        marks = (
            '<p class="section-intro">On every step chart a finding\'s onset is a dashed line in its colour, labelled '
            "with its code, and its steps are shaded in that colour (the <i>shade</i> boxes at the top turn each "
            "shading on and off).</p>"
        )
    return f'<section id="findings"><h2>Findings ({len(diagnosis.findings)})</h2>{marks}{cards}{skipped}</section>'


def inputs_summary(sources: Sequence[str]) -> tuple[str, str]:
    """The inputs' common folder and what lies under it in one phrase, by kind of file.

    >>> inputs_summary(["runs/a.parquet"])
    ('runs/a.parquet', '1 Parquet file')
    >>> inputs_summary([f"out/rollouts/part-{i}.parquet" for i in range(12)] + ["out/tb/events.out.tfevents.1"])
    ('out/', '12 Parquet parts under rollouts/, 1 event file under tb/')
    >>> inputs_summary(["s3://b/run/x/events.out.tfevents.1", "s3://b/run/y/events.out.tfevents.2"])
    ('s3://b/run/', '2 event files in 2 folders')

    An input of no kind known (a folder of parts read as one dataset, say) is named, not counted as "1 file":

    >>> inputs_summary(["s3://b/run/completions", "s3://b/run/runs/x/events.out.tfevents.1"])
    ('s3://b/run/', 'completions, 1 event file under runs/x/')
    """
    if not sources:
        return "", "none"
    scheme = ""
    if all("://" in s for s in sources) and len({s.split("://", 1)[0] for s in sources}) == 1:
        scheme = sources[0].split("://", 1)[0] + "://"
    paths = [s[len(scheme) :] for s in sources]
    kinds: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        kinds.setdefault(_file_kind(posixpath.basename(path)), []).append(path)
    if len(paths) == 1:
        (singular, _), _ = next(iter(kinds.items()))
        return sources[0], f"1 {singular}"
    root = posixpath.commonpath(paths) if len({p.startswith("/") for p in paths}) == 1 else ""
    root = "" if root in ("", ".") else root.rstrip("/") + "/"
    parts = []
    for (singular, plural), files in kinds.items():
        folders = sorted({posixpath.dirname(f[len(root) :]) for f in files})
        count = f"1 {singular}" if len(files) == 1 else f"{len(files)} {plural}"
        if len(files) == 1 and (singular, plural) == _UNKNOWN:
            parts.append(files[0][len(root) :])  # it may be a folder: its name says more than "1 file"
        elif folders == [""]:
            parts.append(count)
        elif len(folders) == 1:
            parts.append(f"{count} under {folders[0]}/")
        else:
            parts.append(f"{count} in {len(folders)} folders")
    return scheme + root, ", ".join(parts)


_KINDS = (
    (re.compile(r"\.parquet$", re.I), ("Parquet file", "Parquet parts")),
    (re.compile(r"tfevents"), ("event file", "event files")),
    (re.compile(r"\.jsonl(\.gz)?$", re.I), ("JSONL file", "JSONL files")),
    (re.compile(r"^trainer_state\.json$"), ("trainer_state.json", "trainer_state.json files")),
    (re.compile(r"\.json$", re.I), ("JSON file", "JSON files")),
    (re.compile(r"\.csv$", re.I), ("CSV file", "CSV files")),
    (re.compile(r"\.(db|sqlite)$", re.I), ("database", "databases")),
)


_UNKNOWN = ("file", "files")


def _file_kind(name: str) -> tuple[str, str]:
    return next((kind for pattern, kind in _KINDS if pattern.search(name)), _UNKNOWN)


def _inputs(sources: Sequence[str]) -> str:
    """The inputs summarised in one line; the whole list folded under it, each path breaking only after a ``/``."""
    root, phrase = inputs_summary(sources)
    if len(sources) <= 1:
        return _path(root)
    items = "".join(f"<li>{_path(s[len(root) :] if s.startswith(root) else s)}</li>" for s in sources)
    return (
        f'<details class="inputs"><summary>{_path(root)}: {esc(phrase)}</summary>'
        f'<ul class="files">{items}</ul></details>'
    )


def _path(path: str) -> str:
    """A path whose folder and file names never break inside (one ``span.seg`` each; a line may break after /)."""
    segments = re.findall(r"[^/]*/|[^/]+$", path) or [path]
    return '<code class="path">' + "<wbr>".join(f'<span class="seg">{esc(seg)}</span>' for seg in segments) + "</code>"


def _channel_table(diagnosis: Diagnosis) -> str:
    """The channel table of ``scan``; a scalar-only run has reward mean and std instead of rel_gain and shares."""
    rollouts = bool(diagnosis.run.rollouts or diagnosis.run.channel_series)  # the per-group table's columns
    if rollouts:
        head = ["rel_gain peak → now", "variance share GRPO / GDPO", "constant groups", "state", "mean reward"]
    else:
        head = ["reward std peak → now", "mean reward"]
    rows = []
    for k, row in enumerate(diagnosis.channel_table()):
        cells = [f'<td class="name">{_swatch(k)}{esc(row["channel"])}</td>', f'<td class="num">{row["weight"]:g}</td>']
        if rollouts:
            cells += [
                f"{_fmt(row['rel_gain_peak'], 2)}{_at(row['rel_gain_peak_step'])} → {_fmt(row['rel_gain_now'], 2)}",
                f"{share_pct(row['signal_share_grpo'])} / {share_pct(row['signal_share_gdpo'])}",
                pct(row["zero_variance_share"]),
                f'<td class="state {esc(row.get("state") or "")}">{esc(channel_state(row))}</td>',
                _fmt(row["reward_mean"], 3),
            ]
        else:
            peak, now = row.get("reward_std_peak"), row.get("reward_std_now")
            cells += [
                f"{_fmt(peak, 2)}{_at(row.get('reward_std_peak_step'))} → {_fmt(now, 2)}",
                _fmt(row["reward_mean"], 3),
            ]
        rows.append(
            "<tr>" + "".join(c if c.startswith("<td") else f'<td class="num">{c}</td>' for c in cells) + "</tr>"
        )
    header = "<tr><th>channel</th><th class='num'>weight</th>" + "".join(
        f"<th>{h}</th>" if h == "state" else f"<th class='num'>{h}</th>" for h in head
    )
    return f"<table>{header}</tr>{''.join(rows)}</table>"


def channel_state(row: Mapping[str, Any]) -> str:
    """A channel's state as the text output's channel table words it (``ceiling 92%``, ``floor 91%``, ``ranking``)."""
    from collapse_doctor.report.text import _state

    return _state(row)


def _at(step: Any) -> str:
    return f" (step {step})" if step is not None else ""


def _actions(finding: Finding) -> str:
    """The remedy's typed actions, one short item each (what `retrain --from-scan` reads from the JSON)."""
    if not finding.actions:
        return ""
    items = "".join(f"<li>{_rich(a.describe())}</li>" for a in finding.actions)
    return f'<ul class="actions" title="applied by collapse-doctor retrain --from-scan scan.json">{items}</ul>'


def _finding(finding: Finding, other_algorithm: str, color: str | None, index: int) -> str:
    """One finding: headline (severity, code, title, steps, its colour on the charts), message and remedy; the
    evidence, the typed actions and the detector's explain text folded under them."""
    from collapse_doctor.judge.detectors import REGISTRY  # the explain text of the finding's detector

    level = finding.severity.label
    where = []
    if finding.onset_step is not None:
        where.append(f"onset step {finding.onset_step}")
    if finding.step_range is not None:
        where.append(f"steps {finding.step_range[0]}-{finding.step_range[1]}")
    if finding.gdpo_resolves is not None:
        where.append(f"{other_algorithm} would resolve it: {'yes' if finding.gdpo_resolves else 'no'}")
    evidence = "".join(f"<span>{esc(k)}: {_fmt(v)}</span>" for k, v in finding.evidence.items())
    explain = ""
    detector = REGISTRY.get(finding.code)
    if detector is not None:
        explain = (
            f"<details><summary>What {esc(finding.code)} checks, why it matters, and the remedy</summary>"
            f'<pre class="explain">{esc(detector.explain())}</pre></details>'
        )
    more = (f'<div class="evidence">{evidence}</div>' if evidence else "") + _actions(finding) + explain
    swatch = f'<span class="swatch" style="background:{color}" title="on the charts"></span>' if color else ""
    return (
        f'<div class="card finding {esc(level)}" id="finding-{index}">'
        f'<div class="headline">{swatch}<span class="sev {esc(level)}">{esc(level)}</span> <b>{esc(finding.code)}</b> '
        f'{_rich(finding.title)}<span class="where">{esc(" · ".join(where))}</span></div>'
        f"<p>{_rich(finding.message)}</p>"
        + (f'<p class="remedy"><b>Remedy:</b> {_rich(finding.remedy)}</p>' if finding.remedy else "")
        + (f"<details><summary>Evidence and actions</summary>{more}</details>" if more else "")
        + "</div>"
    )


def _section(section: Section, slider_steps: list[int]) -> str:
    parts = [f'<section id="{esc(section.id)}"><h2>{esc(section.title)}</h2>']
    parts.append(f'<p class="section-intro">{esc(section.intro)}</p>')
    if section.missing:
        parts.append(f'<p class="missing">{esc(section.missing)}</p>')
    lines = [*section.flat, *([section.not_redrawn] if section.not_redrawn else [])]
    if lines:
        parts.append('<ul class="flat">' + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")
    if section.charts:
        parts.append('<div class="grid">')
        parts += [_chart(c, slider_steps) for c in section.charts]
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)


def _chart(chart: Chart, slider_steps: list[int]) -> str:
    slider = ""
    if chart.id == "chart-hist-step" and slider_steps:
        last = len(slider_steps) - 1
        slider = (
            '<div class="slider"><label for="hist-slider">step <b id="hist-step">'
            f"{slider_steps[last]}</b></label>"
            f'<input type="range" id="hist-slider" min="0" max="{last}" value="{last}" step="1"></div>'
        )
    return (
        f'<figure class="chart" style="grid-column: span {int(chart.span)}"><h3>{esc(chart.title)}</h3>'
        f'<p class="note">{esc(chart.note)}</p>{slider}<div class="plot" id="{esc(chart.id)}" '
        f'style="min-height:{int(chart.layout.get("height", 380))}px"></div></figure>'
    )


def _swatch(k: int) -> str:
    return f'<span class="swatch" style="background:{channel_color(k)}"></span>'


def _text_cell(text: str | None) -> str:
    if text is None:
        return '<td class="text muted">-</td>'
    if len(text) <= PREVIEW_CHARS:
        return f'<td class="text">{esc(text)}</td>'
    return f'<td class="text"><details><summary>{esc(text[:PREVIEW_CHARS])}…</summary>{esc(text)}</details></td>'


def _adv_cell(value: float) -> str:
    if not math.isfinite(value):
        return '<td class="num">-</td>'
    alpha = min(0.45, abs(value) / 2.5 * 0.45)
    color = f"rgba(44,160,44,{alpha:.2f})" if value > 0 else f"rgba(214,39,40,{alpha:.2f})"
    return f'<td class="num" style="background:{color}">{value:+.2f}</td>'


def _examples(diagnosis: Diagnosis, extras: ReportExtras | None) -> str:
    if extras is None:
        return ""
    notes = "".join(f'<p class="missing">{esc(note)}</p>' for note in extras.notes)
    if not extras.examples:
        return f'<section id="examples"><h2>Example groups</h2>{notes}</section>' if notes else ""
    channels = diagnosis.run.channels
    has_text = any(g.completions for g in extras.examples)
    head = (
        "<tr><th>#</th>"
        + ("<th>completion</th>" if has_text else "")
        + "".join(f'<th class="num">{_swatch(k)}{esc(c)}</th>' for k, c in enumerate(channels))
        + '<th class="num">GRPO adv.</th><th class="num">GDPO adv.</th></tr>'
    )
    span = 3 + len(channels) + (1 if has_text else 0)
    cards = [_example_card(group, head, span, has_text) for group in extras.examples]
    note = (
        "Groups where GRPO and GDPO disagree most, at steps around the main finding's onset; advantages "
        "recomputed from the rewards (GRPO: sum, then group z-score; GDPO: per-channel z-scores, weighted sum, "
        "batch z-score)."
    )
    if not has_text:
        note += " The input has no prompt/completion text columns."
    return (
        '<section id="examples"><h2>Example groups</h2>'
        f'<p class="section-intro">{esc(note)}</p>{notes}'
        f'<div class="examples-grid{" text" if has_text else ""}">{"".join(cards)}</div></section>'
    )


def _example_card(group: ExampleGroup, head: str, span: int, has_text: bool) -> str:
    rows = []
    for i in range(len(group.grpo)):
        text = _text_cell(group.completions[i] if i < len(group.completions) else None) if has_text else ""
        rewards = "".join(f'<td class="num">{_fmt(float(v), 3)}</td>' for v in group.rewards[i])
        rows.append(
            f'<tr><td class="num">{i + 1}</td>{text}{rewards}'
            f"{_adv_cell(float(group.grpo[i]))}{_adv_cell(float(group.gdpo[i]))}</tr>"
        )
    if group.more_rows:
        rows.append(f'<tr><td colspan="{span}" class="muted">… {group.more_rows} more rows</td></tr>')
    prompt = ""
    if group.prompt is not None:
        prompt = f"<table><tr><th>prompt</th>{_text_cell(group.prompt)}</tr></table>"
    return (
        '<div class="card examples">'
        f'<h3>step {group.step} · group {esc(group.group)} · <span class="muted">{esc(group.label)}</span></h3>'
        f"{prompt}<table>{head}{''.join(rows)}</table></div>"
    )
