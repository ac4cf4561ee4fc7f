"""Terminal rendering of a Diagnosis (rich; plain text when not a terminal or with NO_COLOR)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from collapse_doctor.core.findings import VERDICT_ORDER, VERDICTS, Finding, Severity, severity_counts, worst_verdict
from collapse_doctor.core.numbers import fixed, pct, share_pct
from collapse_doctor.core.result import Diagnosis, signal_sentence
from collapse_doctor.core.text_safety import printable, shortened
from collapse_doctor.report.ci import describe_sources

_VERDICT_STYLE = {
    "healthy": "bold green",
    "inconclusive": "bold magenta",
    "at_risk": "bold yellow",
    "collapsed": "bold red",
}
_SEVERITY_STYLE = {
    Severity.INFO: "cyan",
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
    Severity.ERROR: "bold magenta",
}
PLAIN_WIDTH = 110


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return fixed(value, digits)
    return str(value)


def _evidence(finding: Finding) -> str:
    parts = []
    for key, value in finding.evidence.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.3g}")
        elif isinstance(value, dict):
            inner = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
            parts.append(f"{key}={{{inner}}}")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{key}=[{', '.join(map(str, value))}]")
        else:
            parts.append(f"{key}={value}")
    return printable(", ".join(parts))


def _indented(console: Console, text: str, style: str = "") -> Text:
    """Wrap under a 6-space indent ourselves: rich's wrapping pads lines with trailing spaces."""
    lines = textwrap.wrap(
        text,
        width=max(40, console.width - 1),
        initial_indent=" " * 6,
        subsequent_indent=" " * 6,
        break_on_hyphens=False,  # keep `collapse-doctor`, `per-group`, `--weights` whole
    )
    return Text("\n".join(lines), style=style)


def render_text(
    diagnosis: Diagnosis, file: IO[str] | None = None, *, color: bool | None = None, json_written: bool = False
) -> None:
    """Print the verdict, run summary, channel table and findings (``json_written``: this scan writes its JSON
    already, so the remedies' ``--from-scan`` needs no hint about writing it)."""
    console = console_for(file, color)
    run = diagnosis.run
    summary = severity_counts(f.severity for f in diagnosis.findings) or "no findings"

    head = Text()
    head.append(VERDICTS[diagnosis.verdict], style=_VERDICT_STYLE[diagnosis.verdict])
    clause = diagnosis.coverage_clause()
    if clause:
        head.append(f" ({clause})")
    head.append(f"  {signal_sentence(run.signal)}")
    console.print(head, soft_wrap=True)  # one line: a log or CI page shows it whole
    where = Text()
    if run.name is not None:
        where.append(f"run {printable(shortened(run.name, NAME_WIDTH))}: ")
    where.append(printable(shortened(describe_sources(run.sources), SOURCES_WIDTH)))
    console.print(where)
    console.print(f"{summary}; fail-on {diagnosis.config.fail_on}: {diagnosis.gate_summary()}")
    console.print()

    console.print(Text("Run", style="bold"))
    group_size = (
        str(run.group_size_min)
        if run.group_size_min == run.group_size_max
        else f"{run.group_size_min}-{run.group_size_max}"
    )
    if run.rollouts or not run.scalar_points:
        console.print(
            f"  steps {run.steps:,} ({run.first_step}-{run.last_step}), rollouts {run.rollouts:,}, "
            f"groups {run.groups:,}, group size {group_size}"
        )
    else:
        console.print(f"  steps {run.steps:,} ({run.first_step}-{run.last_step}) in the scalar log; no rollouts")
    if run.scalar_points:
        framework = printable(run.scalar_framework or "unrecognised tags")
        console.print(f"  scalar log {run.scalar_points:,} points ({framework})")
    listed = run.channels[:RUN_LINE_CHANNELS]
    channels = ", ".join(f"{printable(c)} (w={run.weights[c]:g})" for c in listed)
    if len(run.channels) > len(listed):
        channels += f", ... ({len(run.channels):,} channels in all)"
    console.print(f"  channels {channels}")
    algorithm = printable(f"{run.algorithm.upper()} ({run.algorithm_source})")
    if run.rollouts or not run.scalar_points:
        console.print(f"  algorithm {algorithm}; advantages recomputed on {run.device}")
    elif run.channel_series:
        console.print(f"  algorithm {algorithm}; channel checks on the callback's series, nothing recomputed")
    else:
        console.print("  algorithm unknown: no rollouts, so no advantages were recomputed")
    for note in run.set_aside:
        console.print(f"  not read {printable(note)}")
    for warning in run.warnings:
        console.print(f"  warning: {printable(warning)}", style="yellow")
    console.print()

    if run.rollouts == 0 and run.scalar_points and not run.channel_series:
        _scalar_channels(console, diagnosis)
    else:
        _rollout_channels(console, diagnosis)
    _findings(console, diagnosis, json_written=json_written)


class _ReportConsole(Console):
    """rich's console, except that a reader who went away (``scan RUN | head``) is a BrokenPipeError for the caller
    to handle (the command keeps its own exit code), not rich's ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def console_for(file: IO[str] | None, color: bool | None) -> Console:
    """A console for a report: plain (no colour, fixed width) when asked or when ``file`` is not a terminal."""
    plain = color is False
    return _ReportConsole(
        file=file,
        width=PLAIN_WIDTH if plain or (file is not None and not getattr(file, "isatty", lambda: False)()) else None,
        no_color=plain,
        force_terminal=None if not plain else False,
        highlight=False,
        soft_wrap=False,
        emoji=False,
        markup=False,  # channel names and messages come from logs: never interpret them as markup
    )


def render_summary(
    diagnoses: Sequence[Diagnosis],
    file: IO[str] | None = None,
    *,
    color: bool | None = None,
    failures: Sequence[tuple[str, str]] = (),
) -> None:
    """One line per run (a sweep): run, verdict, signal budget, worst finding and its onset; worst runs first, after
    the runs that could not be scanned (``failures``: ``(run, error)``)."""
    console = console_for(file, color)
    order = sorted(
        range(len(diagnoses)),
        key=lambda i: (-VERDICT_ORDER.index(diagnoses[i].verdict), diagnoses[i].run.name or ""),
    )
    worst = VERDICTS[worst_verdict(d.verdict for d in diagnoses)]
    failing = sum(1 for d in diagnoses if d.exit_code())
    head = f"{len(diagnoses) + len(failures)} runs: worst {worst}, {failing} failing the gate"
    if failures:
        head += f", {len(failures)} not scanned (error)"
    console.print(Text(head, style="bold"))
    table = _table()
    for column in ("run", "verdict", "no gradient", "worst finding", "onset"):
        table.add_column(column, justify="right" if column in ("no gradient", "onset") else "left")
    for name, error in failures:
        table.add_row(Text(printable(name)), Text("ERROR", style="bold red"), "-", Text(printable(error)), "-")
    for i in order:
        d = diagnoses[i]
        top = d.findings[0] if d.findings else None
        share = d.run.signal.get("zero_advantage_rollout_share") if d.run.signal else None
        table.add_row(
            Text(printable(shortened(d.run.name or "?", NAME_WIDTH))),
            Text(VERDICTS[d.verdict], style=_VERDICT_STYLE[d.verdict]),
            f"{pct(share)} {str(d.run.signal['algorithm']).upper()}" if d.run.signal else "-",
            Text(printable(f"{top.severity.label} {top.code} {top.title}")) if top else Text("-"),
            str(top.onset_step) if top is not None and top.onset_step is not None else "-",
        )
    console.print(table)


def _table() -> Table:
    return Table(
        title=None,
        box=box.SIMPLE_HEAD,
        safe_box=True,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
    )


NAME_WIDTH, SOURCES_WIDTH = 60, 100
"""The most characters of a run's name and of its inputs' phrase the text shows (cut in the middle: a sweep's
deep paths stay one line; the JSON and the HTML page's tooltips have them whole)."""
RUN_LINE_CHANNELS = 12
"""The most channels the run card's ``channels`` line names (with their weights); it then says how many there are."""
TABLE_CHANNELS = 40
"""The most channels a text table lists (the ones findings name first); the rest are counted below it and are all
in the JSON and the HTML report."""


def _shown(rows: list[dict[str, Any]], diagnosis: Diagnosis) -> tuple[list[dict[str, Any]], int]:
    """The channel rows a text table lists, in their order (the channels findings name first when not all fit),
    and how many are left out."""
    if len(rows) <= TABLE_CHANNELS:
        return rows, 0
    named = {c for f in diagnosis.findings for c in f.channels}
    first = [i for i, row in enumerate(rows) if row["channel"] in named][:TABLE_CHANNELS]
    taken = set(first)
    keep = first + [i for i in range(len(rows)) if i not in taken][: TABLE_CHANNELS - len(first)]
    return [rows[i] for i in sorted(keep)], len(rows) - len(keep)


def _left_out(console: Console, count: int) -> None:
    if count:
        console.print(
            Text(f"  ... and {count:,} more channels (every channel is in --json and report --html)", style="dim")
        )


def _scalar_channels(console: Console, diagnosis: Diagnosis) -> None:
    every = diagnosis.channel_table()
    if not every:
        return
    rows, hidden = _shown(every, diagnosis)
    table = _table()
    monitor = any(row["rel_gain_peak"] is not None for row in rows)  # a collapse-doctor retrain log
    names = ["channel", "weight", "reward std peak -> now", "mean reward"]
    if monitor:
        names[2:2] = ["rel_gain peak -> now", "constant groups"]
    for name in names:
        table.add_column(name, justify="left" if name == "channel" else "right")
    for row in rows:
        peak_at = f" (step {row['reward_std_peak_step']})" if row["reward_std_peak_step"] is not None else ""
        cells = [
            printable(row["channel"]),
            f"{row['weight']:g}",
            f"{_num(row['reward_std_peak'])}{peak_at} -> {_num(row['reward_std_now'])}",
            _num(row["reward_mean"]),
        ]
        if monitor:
            rel_at = f" (step {row['rel_gain_peak_step']})" if row["rel_gain_peak_step"] is not None else ""
            cells[2:2] = [
                f"{_num(row['rel_gain_peak'])}{rel_at} -> {_num(row['rel_gain_now'])}",
                pct(row["zero_variance_share"]),
            ]
        table.add_row(*cells)
    console.print(Text("Channels, from the scalar log (now = median of the last 10% of points)", style="bold"))
    console.print(table)
    _left_out(console, hidden)
    console.print()


def _rollout_channels(console: Console, diagnosis: Diagnosis) -> None:
    table = _table()
    for name, justify in [
        ("channel", "left"),
        ("weight", "right"),
        ("rel_gain peak -> now", "right"),
        ("variance share GRPO/GDPO", "right"),
        ("constant", "right"),
        ("state", "left"),
        ("mean reward", "right"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows, hidden = _shown(diagnosis.channel_table(), diagnosis)
    for row in rows:
        peak_at = f" (step {row['rel_gain_peak_step']})" if row["rel_gain_peak_step"] is not None else ""
        table.add_row(
            printable(row["channel"]),
            f"{row['weight']:g}",
            f"{_num(row['rel_gain_peak'])}{peak_at} -> {_num(row['rel_gain_now'])}",
            f"{share_pct(row['signal_share_grpo'])} / {share_pct(row['signal_share_gdpo'])}",
            pct(row["zero_variance_share"]),
            _state(row),
            _num(row["reward_mean"]),
        )
    console.print(Text("Channels (now = median of the last 10% of steps)", style="bold"))
    console.print(table)
    _left_out(console, hidden)
    console.print()


def _state(row: Mapping[str, Any]) -> str:
    """``ceiling 92%``, ``floor 99%``, ``sparse 8%`` (share of rollouts it applies to) or ``ranking``."""
    state = row.get("state")
    if state == "ceiling":
        return f"ceiling {pct(row['ceiling_share'])}"
    if state == "floor":
        return f"floor {pct(row['floor_share'])}"
    if state == "sparse":
        return f"sparse {pct(row['applies_share'])}"
    if state == "clipped":
        return "clipped (CD104)"
    return str(state or "-")


def _findings(console: Console, diagnosis: Diagnosis, *, json_written: bool) -> None:
    from collapse_doctor.judge.detectors.remedies import FROM_SCAN

    console.print(Text(f"Findings ({len(diagnosis.findings)})", style="bold"))
    if not diagnosis.findings:
        console.print(
            "  none: no selected detector could judge this run (see skipped)"
            if diagnosis.verdict == "inconclusive"
            else "  none: no detector found a sustained problem"
        )
    for finding in diagnosis.findings:
        line = Text("  ")
        line.append(f"{finding.severity.label.upper():8s}", style=_SEVERITY_STYLE[finding.severity])
        line.append(f" {finding.code}  ", style="bold")
        line.append(printable(finding.title))
        where = []
        if finding.onset_step is not None:
            where.append(f"onset step {finding.onset_step}")
        if finding.step_range is not None:
            where.append(f"steps {finding.step_range[0]}-{finding.step_range[1]}")
        if where:
            line.append(f"  [{', '.join(where)}]", style="dim")
        console.print(line)
        console.print(_indented(console, printable(finding.message)))
        if finding.evidence:
            console.print(_indented(console, f"evidence: {_evidence(finding)}", style="dim"))
        if finding.remedy:
            console.print(_indented(console, f"remedy: {printable(finding.remedy)}", style="green"))
        if finding.gdpo_resolves is not None:
            answer = "yes" if finding.gdpo_resolves else "no"
            console.print(_indented(console, f"{diagnosis.counterfactual_of(finding)} would resolve it: {answer}"))
    if not json_written and any(f.actions for f in diagnosis.findings):
        console.print(
            _indented(console, f"(`{FROM_SCAN}` reads this scan's JSON: add `--json scan.json` to this scan)"),
            style="dim",
        )
    by_reason: dict[str, list[str]] = {}
    for code, reason in diagnosis.skipped.items():
        by_reason.setdefault(reason, []).append(code)
    for reason, codes in by_reason.items():
        console.print(f"  skipped {', '.join(codes)}: {printable(reason)}", style="dim")
