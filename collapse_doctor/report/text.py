"""Terminal rendering of a Diagnosis (rich; plain text when not a terminal or with NO_COLOR).

On a terminal the text is laid out at its width: prose wraps under its indent, and each table keeps a row on one
line, narrower widths choosing narrower layouts (short headers, columns dropped) and cutting a long name with "…".
Off a terminal (a log, a CI page, a pipe) prose is never wrapped: each logical line comes out whole, and tables are
laid out at ``COLUMNS`` when it is set, else :data:`PLAIN_WIDTH`.

Verbosity: ``-1`` the verdict line only, ``0`` the report (evidence cut to :data:`EVIDENCE_SHOWN` items, skipped
checks counted on one line), ``1`` evidence and skipped checks in full."""

from __future__ import annotations

import math
import os
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from collapse_doctor.core.estimators import display_name
from collapse_doctor.core.findings import VERDICT_ORDER, VERDICTS, Finding, Severity, severity_counts, worst_verdict
from collapse_doctor.core.numbers import fixed, pct, share_pct
from collapse_doctor.core.result import LACKS_SERIES, REQUIREMENTS, Diagnosis, signal_sentence
from collapse_doctor.core.text_safety import describe_sources, printable, shortened

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
"""The width tables are laid out at off a terminal, when ``COLUMNS`` does not say (prose is not wrapped there)."""
QUIET, NORMAL, VERBOSE = -1, 0, 1
"""Verbosity: the verdict line only, the report, the report with evidence and skipped checks in full."""
EVIDENCE_SHOWN = 6
"""The most evidence items a finding shows without ``-v`` (it then counts the rest)."""


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return fixed(value, digits)
    return str(value)


def evidence_text(finding: Finding, *, limit: int | None = None) -> str:
    """A finding's evidence on one line, ``key=value, ...``; ``limit``: at most that many items, then how many
    more there are."""
    parts = []
    items = list(finding.evidence.items())
    shown = items if limit is None else items[:limit]
    for key, value in shown:
        if isinstance(value, float):
            parts.append(f"{key}={value:.3g}")
        elif isinstance(value, dict):
            inner = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
            parts.append(f"{key}={{{inner}}}")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{key}=[{', '.join(map(str, value))}]")
        else:
            parts.append(f"{key}={value}")
    more = len(items) - len(shown)
    return printable(", ".join(parts)) + (f" (+{more} more: -v shows all)" if more else "")


def _evidence(finding: Finding) -> str:
    return evidence_text(finding)


def wraps(console: Console) -> bool:
    """Whether prose is wrapped at the console's width (a terminal), or each logical line comes out whole."""
    return bool(getattr(console, "wraps", True))


def _indented(console: Console, text: str, style: str = "", indent: int = 6) -> Text:
    """Wrap under an indent ourselves (rich's wrapping pads lines with trailing spaces); off a terminal, one line."""
    if not wraps(console):
        return Text(" " * indent + text, style=style)
    lines = textwrap.wrap(
        text,
        width=max(40, console.width - 1),
        initial_indent=" " * indent,
        subsequent_indent=" " * indent,
        break_on_hyphens=False,  # keep `collapse-doctor`, `per-group`, `--weights` whole
    )
    return Text("\n".join(lines), style=style)


def verdict_line(diagnosis: Diagnosis, *, named: bool = False) -> Text:
    """The first line: the verdict, what it rests on, the signal budget (``named``: after the run's name)."""
    head = Text()
    if named:
        head.append(f"run {printable(shortened(diagnosis.run.name or '?', NAME_WIDTH))}: ")
    head.append(VERDICTS[diagnosis.verdict], style=_VERDICT_STYLE[diagnosis.verdict])
    clause = diagnosis.coverage_clause()
    if clause:
        head.append(f" ({clause})")
    head.append(f"  {signal_sentence(diagnosis.run.signal)}")
    return head


def render_text(
    diagnosis: Diagnosis,
    file: IO[str] | None = None,
    *,
    color: bool | None = None,
    json_written: bool = False,
    verbosity: int = NORMAL,
    warnings: bool = True,
    named: bool = False,
    width: int | None = None,
    terminal: bool | None = None,
) -> None:
    """Print the verdict, run summary, channel table and findings (``json_written``: this scan writes its JSON
    already, so the remedies' ``--from-scan`` needs no hint about writing it).

    ``verbosity``: :data:`QUIET` prints the verdict line alone (after the run's name with ``named``), :data:`VERBOSE`
    the evidence and skipped checks in full. ``warnings``: the run card lists the run's warnings (the CLI says them
    on stderr instead). ``width`` and ``terminal`` as for :func:`console_for`."""
    console = console_for(file, color, width=width, terminal=terminal)
    run = diagnosis.run
    summary = severity_counts(f.severity for f in diagnosis.findings) or "no findings"

    # Off a terminal one line (a log or CI page shows it whole); on one, wrapped at its width.
    console.print(verdict_line(diagnosis, named=named), soft_wrap=not wraps(console))
    if verbosity <= QUIET:
        return
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
    for warning in run.warnings if warnings else ():
        console.print(f"  warning: {printable(warning)}", style="yellow")
    console.print()

    if run.rollouts == 0 and run.scalar_points and not run.channel_series:
        _scalar_channels(console, diagnosis)
    else:
        _rollout_channels(console, diagnosis)
        _counterfactuals(console, diagnosis)
    _findings(console, diagnosis, json_written=json_written, verbose=verbosity >= VERBOSE)


class _ReportConsole(Console):
    """rich's console, except that a reader who went away (``scan RUN | head``) is a BrokenPipeError for the caller
    to handle (the command keeps its own exit code), not rich's ``SystemExit(1)``; ``wraps``: prose is wrapped at
    the width (a terminal), else each logical line comes out whole."""

    wraps = True

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def _is_terminal(file: IO[str] | None) -> bool:
    isatty = getattr(sys.stdout if file is None else file, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # closed
        return False


def plain_width() -> int:
    """The width of tables off a terminal: ``COLUMNS`` when it is a number, else :data:`PLAIN_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PLAIN_WIDTH


def console_for(
    file: IO[str] | None, color: bool | None, *, width: int | None = None, terminal: bool | None = None
) -> Console:
    """A console for a report on ``file``.

    ``color``: ``True`` colour (ANSI, even off a terminal: ``--color always``), ``False`` plain, ``None`` colour on
    a terminal only; nothing here reads NO_COLOR or FORCE_COLOR (the caller decides). ``terminal`` (default: whether
    ``file`` is one) decides the layout: on a terminal prose wraps at ``width`` (default: the terminal's), off it
    each logical line is whole and tables are laid out at ``width`` or :func:`plain_width`.
    """
    tty = _is_terminal(file) if terminal is None else terminal
    ansi = tty if color is None else color
    console = _ReportConsole(
        file=file,
        width=width if width is not None or tty else plain_width(),
        no_color=not ansi,
        force_terminal=ansi,
        highlight=False,
        soft_wrap=not tty,  # off a terminal rich wraps nothing: a log shows each line whole
        emoji=False,
        markup=False,  # channel names and messages come from logs: never interpret them as markup
    )
    console.wraps = tty
    return console


def render_summary(
    diagnoses: Sequence[Diagnosis],
    file: IO[str] | None = None,
    *,
    color: bool | None = None,
    failures: Sequence[tuple[str, str]] = (),
    width: int | None = None,
    terminal: bool | None = None,
) -> None:
    """One line per run (a sweep): run, verdict, signal budget, worst finding and its onset; worst runs first, after
    the runs that could not be scanned (``failures``: ``(run, error)``)."""
    console = console_for(file, color, width=width, terminal=terminal)
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
        table.add_column(column, justify="right" if column in ("no gradient", "onset") else "left", **ONE_LINE)
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
    print_table(console, fit_table(console, [lambda: (table, 3)]))


def _table() -> Table:
    return Table(
        title=None,
        box=box.SIMPLE_HEAD,
        safe_box=True,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
    )


ONE_LINE: dict[str, Any] = {"no_wrap": True, "overflow": "ellipsis"}
"""Column settings that keep a table's row on one line: a cell too long for its column ends in "…"."""
MIN_FLEXIBLE = 12
"""The narrowest a table's flexible column (a channel name, a finding's title) is cut to before a narrower layout
is tried."""
Layout = Callable[[], tuple[Table, int | None]]
"""Builds a table in one layout: the table and its flexible column (cut to fit), if any."""


def _natural_width(table: Table) -> tuple[int, list[int]]:
    """The width a table takes unconstrained, and each column's (cells on one line; 3 characters between columns:
    the padding either side and the box's blank separator)."""
    widths = [
        max(
            [cell_len(column.header if isinstance(column.header, str) else str(column.header))]
            + [cell_len(str(cell)) for cell in column.cells]
        )
        for column in table.columns
    ]
    return sum(widths) + 3 * max(0, len(widths) - 1), widths


def fit_table(console: Console, layouts: Sequence[Layout]) -> Table:
    """The first of ``layouts`` (widest first) whose rows fit the console's width on one line each; on a terminal
    else the first whose flexible column can be cut to fit down to :data:`MIN_FLEXIBLE`, else the last one, cut to
    fit (every column keeps its cells on one line: :data:`ONE_LINE`). Off a terminal nothing is cut: else the last
    layout whole, its rows longer than the width (:func:`print_table` prints them so)."""
    built = [build() for build in layouts]
    for table, _ in built:  # a layout that fits whole
        if _natural_width(table)[0] <= console.width:
            return table
    if not wraps(console):  # a log or a CI page: a name whole rather than cut with "…"
        return built[-1][0]
    for k, (table, flexible) in enumerate(built):  # else the widest whose flexible column can be cut to fit
        if flexible is None:
            continue
        natural, widths = _natural_width(table)
        room = widths[flexible] - (natural - console.width)
        if room >= MIN_FLEXIBLE or k == len(built) - 1:
            table.columns[flexible].max_width = max(room, 4)
            return table
    return built[-1][0]


def _table_width(console: Console, table: Table) -> int:
    """The width a table is laid out at: the console's; off a terminal at least the table's own, so that no cell is
    cut (a row that fits no layout comes out whole, longer than the width)."""
    if wraps(console):
        return console.width
    natural, widths = _natural_width(table)
    return max(console.width, natural + 2 * len(widths))  # the margin: never a cell cut by a miscount


def print_table(console: Console, table: Table) -> None:
    """A table, laid out at the console's width (whether or not prose wraps there); off a terminal no cell is cut."""
    if _table_width(console, table) <= console.width:
        console.print(table, soft_wrap=False)
    else:
        print_table_with_folds(console, table, [])


def print_table_with_folds(console: Console, table: Table, folds: Sequence[Text | None]) -> None:
    """A table whose rows each keep one line, with ``folds[i]`` (a detail too long for a cell) printed under row
    ``i``, wrapped at the console's width on a terminal."""
    width = _table_width(console, table)
    lines = console.render_lines(table, console.options.update(width=width), pad=False)
    head = len(lines) - len(folds)  # the header and its rule
    for k, line in enumerate(lines):
        row = Text()
        for segment in line:
            if not segment.control:
                row.append(segment.text, segment.style)
        row.rstrip()  # a left-justified last column's padding
        console.print(row, soft_wrap=True)
        fold = folds[k - head] if k >= head else None
        if fold is not None:
            console.print(_indented(console, fold.plain.strip(), style=str(fold.style)))


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


def peak_to_now(peak: Any, step: Any, now: Any, *, steps: str = "full") -> str:
    """``1.00 (step 7) -> 0.75`` (``steps="full"``), ``1.00 @7 -> 0.75`` (``"short"``) or ``1.00 -> 0.75``
    (``"none"``).

    >>> peak_to_now(1.0, 7, 0.75), peak_to_now(1.0, 7, 0.75, steps="short"), peak_to_now(1.0, None, 0.75)
    ('1.00 (step 7) -> 0.75', '1.00 @7 -> 0.75', '1.00 -> 0.75')
    """
    at = "" if step is None or steps == "none" else f" (step {step})" if steps == "full" else f" @{step}"
    return f"{_num(peak)}{at} -> {_num(now)}"


LAYOUTS = ("full", "short", "narrow", "narrowest")
"""The layouts of a channel table, widest first: every column under its full header; short headers and the peak's
step as ``@N``; no peak step; only the columns that say what a channel does (name, rel_gain, share, state)."""


def _columns_of(layout: str, full: Sequence[tuple[str, str, str]], dropped: Sequence[str]) -> list[tuple[str, str]]:
    """``(key, header)`` of each column in ``layout``: ``full`` holds ``(key, header, short header)``; ``dropped``
    the keys the narrowest layout leaves out."""
    keep = [c for c in full if layout != "narrowest" or c[0] not in dropped]
    return [(key, header if layout == "full" else short) for key, header, short in keep]


def _channel_layouts(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str]],
    cells: Callable[[Mapping[str, Any], str], dict[str, str]],
    dropped: Sequence[str],
) -> list[Layout]:
    """One table builder per layout of :data:`LAYOUTS`; ``cells(row, steps)`` gives a row's cells by key."""

    def build(layout: str) -> tuple[Table, int | None]:
        table = _table()
        shown = _columns_of(layout, columns, dropped)
        for key, header in shown:
            table.add_column(header, justify="left" if key in ("channel", "state") else "right", **ONE_LINE)
        steps = {"full": "full", "short": "short"}.get(layout, "none")
        for row in rows:
            by_key = cells(row, steps)
            table.add_row(*(by_key[key] for key, _ in shown))
        return table, 0

    return [lambda layout=layout: build(layout) for layout in LAYOUTS]  # type: ignore[misc]


def _scalar_channels(console: Console, diagnosis: Diagnosis) -> None:
    every = diagnosis.channel_table()
    if not every:
        return
    rows, hidden = _shown(every, diagnosis)
    monitor = any(row["rel_gain_peak"] is not None for row in rows)  # a collapse-doctor retrain log
    columns = [("channel", "channel", "channel"), ("weight", "weight", "w")]
    if monitor:
        columns += [("rel_gain", "rel_gain peak -> now", "rel_gain"), ("constant", "constant groups", "const")]
    columns += [("std", "reward std peak -> now", "reward std"), ("mean", "mean reward", "mean")]

    def cells(row: Mapping[str, Any], steps: str) -> dict[str, str]:
        return {
            "channel": printable(row["channel"]),
            "weight": f"{row['weight']:g}",
            "rel_gain": peak_to_now(row["rel_gain_peak"], row["rel_gain_peak_step"], row["rel_gain_now"], steps=steps),
            "constant": pct(row["zero_variance_share"]),
            "std": peak_to_now(row["reward_std_peak"], row["reward_std_peak_step"], row["reward_std_now"], steps=steps),
            "mean": _num(row["reward_mean"]),
        }

    table = fit_table(console, _channel_layouts(rows, columns, cells, dropped=("weight", "constant")))
    console.print(Text("Channels, from the scalar log (now = median of the last 10% of points)", style="bold"))
    print_table(console, table)
    _left_out(console, hidden)
    console.print()


ROLLOUT_COLUMNS = (
    ("channel", "channel", "channel"),
    ("weight", "weight", "w"),
    ("rel_gain", "rel_gain peak -> now", "rel_gain peak -> now"),
    ("share", "variance share GRPO/GDPO", "var GRPO/GDPO"),
    ("constant", "constant", "const"),
    ("state", "state", "state"),
    ("mean", "mean reward", "mean"),
)
"""The rollout channel table's columns: ``(key, header, short header)``."""


def _rollout_channels(console: Console, diagnosis: Diagnosis) -> None:
    rows, hidden = _shown(diagnosis.channel_table(), diagnosis)

    def cells(row: Mapping[str, Any], steps: str) -> dict[str, str]:
        gap = " / " if steps == "full" else "/"
        return {
            "channel": printable(row["channel"]),
            "weight": f"{row['weight']:g}",
            "rel_gain": peak_to_now(row["rel_gain_peak"], row["rel_gain_peak_step"], row["rel_gain_now"], steps=steps),
            "share": f"{share_pct(row['signal_share_grpo'])}{gap}{share_pct(row['signal_share_gdpo'])}",
            "constant": pct(row["zero_variance_share"]),
            "state": _state(row),
            "mean": _num(row["reward_mean"]),
        }

    layouts = _channel_layouts(rows, ROLLOUT_COLUMNS, cells, dropped=("weight", "constant", "mean"))
    table = fit_table(console, layouts)
    console.print(Text("Channels (now = median of the last 10% of steps)", style="bold"))
    print_table(console, table)
    _left_out(console, hidden)
    console.print()


DECIDERS_SHOWN = 4
"""Channels named in the table's "sign decided by" cell (the ones that decide most); the JSON has every one."""


def counterfactual_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The counterfactual table's estimators with equal rounded shares merged into one row (``"GRPO = RLOO"``: on
    these rewards they zero, tie and decide alike), the run's own first; ``"own"`` marks it, ``"cells"`` holds the
    shares as shown, ``"note"`` what was not computed."""
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    rows = sorted(table["estimators"], key=lambda row: not row["own"])
    for row in rows:
        name = display_name(row["algorithm"])
        if "not_computed" in row:
            merged[("not", row["estimator"])] = {"names": [name], "own": row["own"], "note": row["not_computed"]}
            continue
        decides = row["decides"]
        shown = list(decides.items())
        if len(shown) > DECIDERS_SHOWN:  # the channels that decide most, in the channels' order
            top = sorted(shown, key=lambda item: -item[1])[:DECIDERS_SHOWN]
            shown = [item for item in shown if item in top]
        more = len(decides) - len(shown)
        cells = (
            pct(row["zero_advantage_share"]),
            pct(row["tied_pair_share"]) if row["tied_pair_share"] is not None else "-",
            ", ".join(f"{printable(c)} {pct(v)}" for c, v in shown) + (f", {more:,} more" if more else ""),
        )
        key = (*cells, row.get("note") or "")  # rows merge only with the same note
        entry = merged.setdefault(key, {"names": [], "own": False, "cells": cells, "note": row.get("note")})
        entry["names"].append(name)
        entry["own"] = entry["own"] or row["own"]
    return list(merged.values())


def _counterfactuals(console: Console, diagnosis: Diagnosis) -> None:
    table = diagnosis.run.counterfactuals
    if not table:
        return
    sample = table["sample"]
    rows = counterfactual_rows(table)
    computed = [row for row in rows if "cells" in row]
    if not computed:
        return

    def build(with_decides: bool) -> tuple[Table, int | None]:
        t = _table()
        t.add_column("estimator", **ONE_LINE)
        t.add_column("no gradient", justify="right", **ONE_LINE)
        t.add_column("tied pairs", justify="right", **ONE_LINE)
        if with_decides:
            t.add_column("sign decided by", **ONE_LINE)
        for row in computed:
            names = " = ".join(row["names"]) + (" (run)" if row["own"] else "")
            t.add_row(names, *(row["cells"] if with_decides else row["cells"][:2]))
        return t, 0

    console.print(
        Text(
            f"Estimators on the same rewards ({sample['groups']:,} groups, up to {sample['groups_per_step']} per step)",
            style="bold",
        )
    )
    print_table(console, fit_table(console, [lambda: build(True), lambda: build(False)]))
    notes = [f"{' = '.join(row['names'])}: {row['note']}" for row in rows if row.get("note")]
    for note in notes:
        console.print(_indented(console, note, indent=2))
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


def _findings(console: Console, diagnosis: Diagnosis, *, json_written: bool, verbose: bool = False) -> None:
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
        steps = f"[{', '.join(where)}]" if where else ""
        if steps and (not wraps(console) or line.cell_len + 2 + len(steps) <= console.width):
            line.append(f"  {steps}", style="dim")
            steps = ""
        _print_head(console, line)
        if steps:  # the row would wrap: its steps fold under it
            console.print(Text(" " * 6 + steps, style="dim"))
        console.print(_indented(console, printable(finding.message)))
        if finding.evidence:
            evidence = evidence_text(finding, limit=None if verbose else EVIDENCE_SHOWN)
            console.print(_indented(console, f"evidence: {evidence}", style="dim"))
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
    if verbose:
        for code, reason in diagnosis.skipped.items():
            console.print(_indented(console, f"skipped {code}: {printable(reason)}", style="dim", indent=2))
    elif diagnosis.skipped:
        console.print(_indented(console, skipped_line(diagnosis), style="dim", indent=2))


def _print_head(console: Console, line: Text) -> None:
    """A finding's first line: on a terminal a title too long for it wraps under itself (17 columns in)."""
    if not wraps(console) or line.cell_len <= console.width:
        console.print(line, soft_wrap=True)
        return
    lines = line.wrap(console, max(40, console.width - 17))
    for k, piece in enumerate(lines):
        console.print(Text(" " * 17) + piece if k else piece, soft_wrap=True)


_SKIPPED_BECAUSE = {
    "rollouts": "need rollouts",
    "channel_series": "need rollouts or the callback's channel series",
    "logged_advantage": "need a logged advantage column",
    "scalars": "need a scalar log",
    "group_baseline": "not for the run's estimator: no group baseline",
}


def skipped_line(diagnosis: Diagnosis) -> str:
    """The skipped checks on one line, by why: ``skipped 5 checks: CD502, CD506 (a series the scalar log lacks);
    CD507, CD511 (too little data); -v says why each``."""
    requirement = {reason: key for key, reason in REQUIREMENTS.items()}
    groups: dict[str, list[str]] = {}
    for code, reason in diagnosis.skipped.items():
        key = requirement.get(reason)
        why = (
            _SKIPPED_BECAUSE[key]
            if key in _SKIPPED_BECAUSE
            else "a series the scalar log lacks"
            if reason.startswith(LACKS_SERIES)
            else "too little data or not judged"
        )
        groups.setdefault(why, []).append(code)
    count = len(diagnosis.skipped)
    parts = "; ".join(f"{', '.join(codes)} ({why})" for why, codes in groups.items())
    return f"skipped {count} check{'s' if count != 1 else ''}: {parts}; -v says why each"
