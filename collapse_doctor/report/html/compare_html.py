"""The offline HTML page of a comparison (``collapse-doctor compare --html OUT``), in the report's style.

One page: the conclusion first (each later run against the first, in the regression gate's words), the runs side
by side (verdicts, signal budgets, findings by run, gates), then their per-step series
overlaid on shared axes, one colour per run everywhere (rel_gain and signal share per channel, zero-advantage
share, advantage std, every scalar the runs logged). The report's CSS and script and the embedded plotly.js are
reused, nothing is fetched; every string from the logs (run labels, channel names, titles) is HTML-escaped, and
escaped again for plotly, which renders names as SVG text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.core.findings import VERDICTS, severity_counts
from collapse_doctor.core.numbers import pct, share_pct
from collapse_doctor.core.text_safety import printable
from collapse_doctor.pipeline.compare import ComparedRun, Comparison, run_series
from collapse_doctor.report.compare_text import conclusion_sentence, run_letter
from collapse_doctor.report.html.figures import Chart, Section, base_layout, display_index, esc, numbers, plot_text
from collapse_doctor.report.html.page import _fmt, _rich, channel_state, html_page

RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
"""One colour per run, the same on every chart and in the tables."""


def run_color(k: int) -> str:
    return RUN_COLORS[k % len(RUN_COLORS)]


def _x(run: ComparedRun, steps: np.ndarray, align: str) -> np.ndarray:
    """A run's x values: its steps, or their fraction of its own step span (``align="fraction"``)."""
    steps = np.asarray(steps, dtype=np.float64)
    if align == "step":
        return steps
    first, last = run.diagnosis.run.first_step, run.diagnosis.run.last_step
    if first is None or last is None or last == first:
        return np.zeros_like(steps)
    return (steps - first) / (last - first)


def _trace(comparison: Comparison, k: int, steps: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    run = comparison.runs[k]
    keep = display_index(np.asarray(values, dtype=np.float64))
    x = _x(run, steps, comparison.align)[keep]
    return {
        "type": "scatter",
        "mode": "lines",
        "x": numbers(x) if comparison.align == "fraction" else [int(v) for v in x.tolist()],
        "y": numbers(np.asarray(values, dtype=np.float64)[keep]),
        "name": plot_text(f"{run_letter(k)}: {printable(run.label)}"),
        "legendgroup": f"run{k}",
        "line": {"color": run_color(k), "width": 1.8},
    }


def _layout(comparison: Comparison, y_title: str, *, percent: bool = False) -> dict[str, Any]:
    x_title = "training step" if comparison.align == "step" else "fraction of training"
    # Hover values rounded as the tables round them: whole percents, else 3 significant digits.
    yaxis: dict[str, Any] = {"title": {"text": plot_text(y_title)}, "zeroline": False, "hoverformat": ".3g"}
    if percent:
        yaxis["tickformat"] = yaxis["hoverformat"] = ".0%"
    xaxis: dict[str, Any] = {"title": {"text": x_title}}
    if comparison.align == "fraction":
        xaxis["tickformat"] = xaxis["hoverformat"] = ".0%"
    return base_layout(xaxis=xaxis, yaxis=yaxis, hovermode="x unified", margin={"l": 64, "r": 16, "t": 24, "b": 90})


def chart_sections(comparison: Comparison) -> list[Section]:
    """Every chart section of the page, in order (a chart appears when some run has its data)."""
    per_run = [run_series(r.diagnosis) for r in comparison.runs]
    steps = [r.diagnosis.series.steps for r in comparison.runs]
    out: list[Section] = []

    def overlay(name: str, channel: str | None) -> list[dict[str, Any]]:
        traces = []
        for k, series in enumerate(per_run):
            values = series.get(name)
            if isinstance(values, dict):
                values = values.get(channel) if channel is not None else None
            if values is not None and len(values):
                traces.append(_trace(comparison, k, steps[k], values))
        return traces

    channels = comparison.channels
    for key, title, intro, y_title, percent in (
        (
            "rel_gain",
            "rel_gain per channel",
            "Mean within-group max - min of each channel, per step: how much it still ranks the completions.",
            "rel_gain",
            False,
        ),
        (
            "signal_share",
            "Signal share per channel",
            "Each channel's share of the within-group variance, under each run's own algorithm.",
            "variance share",
            True,
        ),
    ):
        section = Section(key.replace("_", "-"), title, intro)
        for j, channel in enumerate(channels):
            traces = overlay(key, channel)
            if traces:
                section.charts.append(
                    Chart(
                        f"chart-{key.replace('_', '-')}-{j}",
                        f"{title.split(' per ')[0]}: {printable(channel)}",
                        traces,
                        _layout(comparison, y_title, percent=percent),
                        span=3 if len(channels) > 1 else 6,
                    )
                )
        if not section.charts:
            section.missing = "No run has rollouts: these series need them."
        out.append(section)
    signal = Section("signal", "Signal", "Zero-advantage share and advantage std per step, under each run's algorithm.")
    for key, title, y_title, percent in (
        ("zero_advantage_share", "Zero-advantage share of rollouts", "share of rollouts", True),
        ("adv_std", "Advantage std", "advantage std", False),
    ):
        traces = overlay(key, None)
        if traces:
            signal.charts.append(
                Chart(f"chart-{key.replace('_', '-')}", title, traces, _layout(comparison, y_title, percent=percent))
            )
    if not signal.charts:
        signal.missing = "No run has rollouts: these series need them."
    out.append(signal)
    scalars = _scalar_section(comparison)
    if scalars is not None:
        out.append(scalars)
    return out


def _scalar_section(comparison: Comparison) -> Section | None:
    names = sorted({n for r in comparison.runs if r.diagnosis.scalars is not None for n in r.diagnosis.scalars.series})
    if not names:
        return None
    section = Section("scalars", "Scalar logs", "What the trainers logged themselves, each run on its own steps.")
    for j, name in enumerate(names):
        traces = []
        for k, run in enumerate(comparison.runs):
            scalars = run.diagnosis.scalars
            points = scalars.get(name) if scalars is not None else None
            if points is not None and len(points.steps):
                traces.append(_trace(comparison, k, points.steps, points.values))
        section.charts.append(
            Chart(f"chart-scalar-{j}", printable(name), traces, _layout(comparison, printable(name)), span=3)
        )
    return section


def _swatch(k: int) -> str:
    return f'<span class="swatch" style="background:{run_color(k)}"></span>'


def _runs_table(comparison: Comparison) -> str:
    rows = []
    for k, run in enumerate(comparison.runs):
        d = run.diagnosis
        signal = d.run.signal
        zero = pct(signal["zero_advantage_rollout_share"]) if signal is not None else "-"
        rows.append(
            f'<tr><td class="name">{_swatch(k)}<b>{run_letter(k)}</b> <code>{esc(printable(run.label))}</code></td>'
            f'<td><span class="verdict {esc(d.verdict)}">{esc(VERDICTS[d.verdict])}</span></td>'
            f"<td>{esc(d.run.algorithm.upper())} <span class='muted'>({esc(printable(d.run.algorithm_source))})</span>"
            f'</td><td class="num">{d.run.steps:,}</td><td class="num">{esc(zero)}</td>'
            f"<td>{esc(severity_counts(f.severity for f in d.findings) or 'no findings')}</td></tr>"
        )
    return (
        '<table><thead><tr><th>run</th><th>verdict</th><th>algorithm</th><th class="num">steps</th>'
        '<th class="num">zero-advantage rollouts</th><th>findings</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _channels_table(comparison: Comparison) -> str:
    rows = []
    tables = [{row["channel"]: row for row in r.diagnosis.channel_table()} for r in comparison.runs]
    for channel in comparison.channels:
        for k, (run, table) in enumerate(zip(comparison.runs, tables, strict=True)):
            row = table.get(channel)
            name = f'<td class="name">{esc(printable(channel))}</td>' if k == 0 else "<td></td>"
            if row is None:
                rows.append(
                    f'<tr>{name}<td>{_swatch(k)}{run_letter(k)}</td><td colspan="6" class="muted">'
                    "not in this run</td></tr>"
                )
                continue
            algo = "gdpo" if run.diagnosis.run.algorithm == "gdpo" else "grpo"
            rows.append(
                f"<tr>{name}<td>{_swatch(k)}{run_letter(k)}</td>"
                f'<td class="num">{_fmt(row.get("weight"))}</td>'
                f'<td class="num">{_fmt(row.get("rel_gain_peak"), 2)} -> {_fmt(row.get("rel_gain_now"), 2)}</td>'
                f'<td class="num">{esc(share_pct(row.get(f"signal_share_{algo}")))}</td>'
                f'<td class="num">{esc(pct(row.get("zero_variance_share")))}</td>'
                f'<td class="state {esc(row.get("state") or "")}">{esc(channel_state(row))}</td>'
                f'<td class="num">{_fmt(row.get("reward_mean"), 3)}</td></tr>'
            )
    return (
        '<table><thead><tr><th>channel</th><th>run</th><th class="num">weight</th>'
        '<th class="num">rel_gain peak -> now</th><th class="num">variance share</th>'
        '<th class="num">constant groups</th><th>state</th><th class="num">mean reward</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _findings_table(comparison: Comparison) -> str:
    if not comparison.findings:
        return '<p class="muted">No finding in any run.</p>'
    head = "".join(f"<th>{_swatch(k)}{run_letter(k)}</th>" for k in range(len(comparison.runs)))
    rows = []
    for match in comparison.findings:
        cells = []
        for f in match.findings:
            if f is None:
                cells.append('<td class="muted">-</td>')
            else:
                onset = f" @ step {f.onset_step}" if f.onset_step is not None else ""
                if f.recovered_step is not None:
                    onset += f", ended @ step {f.recovered_step}"
                cells.append(
                    f'<td><span class="sev {esc(f.severity.label)}">{esc(f.severity.label)}</span>{esc(onset)}</td>'
                )
        where = "every run" if match.shared else "only " + ", ".join(run_letter(i) for i in match.present)
        title = _rich(printable(match.title))
        if match.titles_differ:  # one code and channels, worded by another state in each run
            title = " / ".join(
                f"{run_letter(i)}: {_rich(printable(f.condition))}"
                for i, f in enumerate(match.findings)
                if f is not None
            )
        rows.append(
            f"<tr><td><code>{esc(match.code)}</code></td><td>{title}</td>{''.join(cells)}<td>{esc(where)}</td></tr>"
        )
    return (
        f"<table><thead><tr><th>code</th><th>finding</th>{head}<th>in</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _gates(comparison: Comparison) -> str:
    parts = []
    for gate in comparison.gates:
        rows = "".join(
            f"<tr><td>{esc(printable(c.subject))}</td><td class='num'>{esc(_gate_cell(c.baseline, c.name))}</td>"
            f"<td class='num'>{esc(_gate_cell(c.run, c.name))}</td>"
            f"<td class='num'>{esc(_gate_cell(c.limit, c.name))}</td>"
            f"<td>{_RESULT[c.failed]}</td><td>{esc(printable(c.detail))}</td></tr>"
            for c in gate.criteria
        )
        parts.append(
            f'<div class="card"><h3>Gate: <code>{esc(printable(gate.run))}</code> against baseline '
            f"<code>{esc(printable(gate.baseline))}</code> (fail-on {esc(gate.settings.fail_on)})</h3>"
            "<table><thead><tr><th>criterion</th><th class='num'>baseline</th><th class='num'>run</th>"
            f"<th class='num'>limit</th><th>result</th><th>detail</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<p><b>{esc(gate.summary())}</b></p></div>"
        )
    return "".join(parts)


_RESULT = {True: '<b style="color: var(--critical)">FAILED</b>', False: '<span style="color: var(--ok)">ok</span>'}


def _conclusion(comparison: Comparison) -> str:
    """The answer first: each later run against the first in the gate's words (red where the gate fails it)."""
    gated = bool(comparison.gates)
    lines = []
    for k, conclusion in enumerate(comparison.conclusions, start=1):
        # Numbers as the page's tables show them (the scan report's page: 2 significant digits for rel_gain).
        sentence = conclusion_sentence(
            conclusion, run_letter(0), run_letter(k), gated=gated, number=lambda v: _fmt(v, 2)
        )
        color = "var(--critical)" if conclusion.gate_failed else "var(--ok)"
        lines.append(
            f'<p class="finding conclusion" data-verdict="{esc(conclusion.verdict)}" '
            f'data-gate="{"fails" if conclusion.gate_failed else "passes"}" '
            f'style="border-left-color: {color}; padding-left: 10px; font-size: 15px">{_rich(printable(sentence))}</p>'
        )
    names = " &middot; ".join(
        f"{_swatch(k)}<b>{run_letter(k)}</b> <code>{esc(printable(r.label))}</code>" + (" (baseline)" if not k else "")
        for k, r in enumerate(comparison.runs)
    )
    how = "this gate decides the exit code" if gated else "what <code>--gate</code> would say; compare exits 0"
    level = esc(comparison.conclusions[0].fail_on) if comparison.conclusions else ""
    return (
        f'<section id="conclusion"><h2>Conclusion</h2><div class="card">{"".join(lines)}'
        f'<p class="muted">{names}<br>Each run against the baseline by the regression gate\'s criteria (fail-on '
        f"{level}; {how}); what could not be compared counts against the run.</p></div></section>"
    )


def _gate_cell(value: Any, name: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return pct(value) if name == "zero_advantage_share" else _fmt(value, 2)
    return printable(value)


def build_comparison_html(comparison: Comparison) -> str:
    """Render ``comparison`` as one offline HTML page (a pure function of it)."""
    from collapse_doctor.core.version import __version__

    sections = chart_sections(comparison)
    charts = [c for s in sections for c in s.charts]
    payload = {
        "charts": [{"id": c.id, "data": c.data, "layout": c.layout, "steps": c.steps_axis} for c in charts],
        "histograms": None,
    }
    how = "by step" if comparison.align == "step" else "by fraction of training"
    links = ['<a href="#conclusion">Conclusion</a>', '<a href="#runs">Runs</a>', '<a href="#findings">Findings</a>']
    links += [f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections]
    body = [
        '<header class="top"><div class="inner">'
        f"<h1><span>collapse-doctor: {len(comparison.runs)} runs compared</span></h1>"
        f'<div class="muted">aligned {esc(how)}; one colour per run on every chart</div></div></header>',
        f'<nav id="toc"><div class="inner"><div class="links">{"".join(links)}</div></div></nav>',
        "<main>",
        _conclusion(comparison),
        f'<section id="runs"><h2>Runs</h2><div class="card">{_runs_table(comparison)}</div>',
        f'<h2>Channels</h2><div class="card">{_channels_table(comparison)}</div>',
        _gates(comparison),
        "</section>",
        f'<section id="findings"><h2>Findings by run</h2><p class="section-intro">Matched by code and channels; '
        f'severity and onset step in each run.</p><div class="card">{_findings_table(comparison)}</div></section>',
        *(_section(s) for s in sections),
        f"<footer>collapse-doctor {esc(__version__)}. Offline page: plotly.js is embedded, nothing is fetched."
        "</footer>",
        "</main>",
    ]
    title = "collapse-doctor compare: " + " vs ".join(printable(r.label) for r in comparison.runs)
    return html_page(title, body, payload)


def _section(section: Section) -> str:
    parts = [f'<section id="{esc(section.id)}"><h2>{esc(section.title)}</h2>']
    parts.append(f'<p class="section-intro">{esc(section.intro)}</p>')
    if section.missing:
        parts.append(f'<p class="missing">{esc(section.missing)}</p>')
    parts.append('<div class="grid">')
    parts += [
        f'<figure class="chart" style="grid-column: span {int(c.span)}"><h3>{esc(c.title)}</h3>'
        f'<p class="note">{esc(c.note)}</p><div class="plot" id="{esc(c.id)}"></div></figure>'
        for c in section.charts
    ]
    parts.append("</div></section>")
    return "".join(parts)


def write_comparison_html(output: str | Path, comparison: Comparison, *, inputs: Sequence[Path] = ()) -> int:
    """Render and write the page atomically (never over one of ``inputs``); returns the size written in bytes."""
    from collapse_doctor.io.storage.atomic import atomic_path

    text = build_comparison_html(comparison).encode("utf-8", errors="backslashreplace")
    with atomic_path(output, inputs=inputs) as tmp:
        tmp.write_bytes(text)
    return len(text)
