"""Terminal rendering of a :class:`~collapse_doctor.pipeline.compare.Comparison` and of a regression gate
(rich; plain text when not a terminal or with NO_COLOR). Runs are columns ``A``, ``B``, ... named once at the top."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from collapse_doctor.core.findings import VERDICTS, Finding, Severity, severity_counts
from collapse_doctor.core.numbers import pct, share_pct
from collapse_doctor.core.text_safety import printable
from collapse_doctor.pipeline.compare import (
    Comparison,
    Conclusion,
    FindingChange,
    GateCriterion,
    GateResult,
    conclude,
)
from collapse_doctor.report.text import (
    ONE_LINE,
    QUIET,
    VERBOSE,
    Layout,
    _num,
    _state,
    _table,
    console_for,
    fit_table,
    peak_to_now,
    print_table,
    print_table_with_folds,
    wraps,
)

_VERDICT_STYLE = {
    "healthy": "bold green",
    "inconclusive": "bold magenta",
    "at_risk": "bold yellow",
    "collapsed": "bold red",
}


def run_letter(index: int) -> str:
    """``A``, ``B``, ..., ``Z``, ``AA``, ...

    >>> run_letter(0), run_letter(25), run_letter(26)
    ('A', 'Z', 'AA')
    """
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


def render_comparison(
    comparison: Comparison,
    file: IO[str] | None = None,
    *,
    color: bool | None = None,
    verbosity: int = 0,
    width: int | None = None,
    terminal: bool | None = None,
) -> None:
    """Print the runs side by side: verdicts and signal budgets, channel tables, findings by run, the gates.

    ``verbosity``: ``-1`` the conclusions only (``-q``), ``1`` each run's skipped checks too (``-v``); ``width``
    and ``terminal`` as for :func:`~collapse_doctor.report.text.console_for`."""
    console = console_for(file, color, width=width, terminal=terminal)
    runs = comparison.runs
    letters = [run_letter(i) for i in range(len(runs))]
    # The answer first: each later run against the first, in the gate's words.
    for k, conclusion in enumerate(comparison.conclusions, start=1):
        chunks = conclusion_chunks(conclusion, letters[0], letters[k], gated=bool(comparison.gates))
        print_conclusion(console, chunks, failed=conclusion.gate_failed)
    if verbosity <= QUIET:
        return
    console.print()
    how = "by step" if comparison.align == "step" else "by fraction of training"
    console.print(Text(f"Compare {len(runs)} runs (aligned {how})", style="bold"))
    for letter, run in zip(letters, runs, strict=True):
        d = run.diagnosis
        line = Text(f"  {letter}  ")
        line.append(VERDICTS[d.verdict], style=_VERDICT_STYLE[d.verdict])
        line.append(f"  {printable(run.label)}")
        console.print(line, soft_wrap=True)  # a long path stays whole on its line
    console.print()
    _budget(console, comparison, letters, verbose=verbosity >= VERBOSE)
    _channels(console, comparison, letters)
    _findings(console, comparison, letters)
    for gate in comparison.gates:
        render_gate(gate, console=console)


WIDE_RUNS = 6
"""The most runs shown one column each; with more, the tables have one row per run (50 columns of a terminal's width
would each be a few characters wide: blank)."""


def _budget(console: Console, comparison: Comparison, letters: Sequence[str], *, verbose: bool = False) -> None:
    runs = [r.diagnosis for r in comparison.runs]

    def signal(key: str) -> list[str]:
        return [pct(d.run.signal[key]) if d.run.signal is not None else "-" for d in runs]

    rows = {
        "verdict": [VERDICTS[d.verdict] for d in runs],
        "algorithm": [printable(d.run.algorithm.upper()) for d in runs],
        "steps": [f"{d.run.steps:,} ({d.run.first_step}-{d.run.last_step})" for d in runs],
        "rollouts": [f"{d.run.rollouts:,}" for d in runs],
        "zero-advantage rollouts": signal("zero_advantage_rollout_share"),
        "silent groups": signal("silent_group_share"),
        "all-pass groups": signal("all_pass_group_share"),
        "all-fail groups": signal("all_fail_group_share"),
        "findings": [severity_counts(f.severity for f in d.findings) or "none" for d in runs],
    }
    table = _table()
    if len(runs) <= WIDE_RUNS:
        table.add_column("", justify="left")
        for letter in letters:
            table.add_column(letter, justify="right")
        for name, cells in rows.items():
            table.add_row(name, *cells)
    else:  # one row per run, under short headers
        short = {"zero-advantage rollouts": "zero adv", "silent groups": "silent", "all-pass groups": "all pass"}
        short |= {"all-fail groups": "all fail"}
        table.add_column("run", justify="left", no_wrap=True)
        for name in rows:
            justify = "left" if name in ("verdict", "algorithm", "findings") else "right"
            table.add_column(short.get(name, name), justify=justify, no_wrap=name != "findings")  # type: ignore[arg-type]
        for i, letter in enumerate(letters):
            table.add_row(letter, *(cells[i] for cells in rows.values()))
    console.print(Text("Verdicts and signal budgets (under each run's own algorithm)", style="bold"))
    print_table(console, fit_table(console, [lambda: (table, None)]))
    for letter, d in zip(letters, runs, strict=True):
        source = printable(d.run.algorithm_source)
        console.print(f"  {letter}: algorithm {printable(d.run.algorithm.upper())} ({source})", style="dim")
        for code, reason in d.skipped.items() if verbose else ():
            console.print(f"  {letter}: skipped {code}: {printable(reason)}", style="dim")
    console.print()


CHANNEL_COLUMNS = (
    ("channel", "channel", "channel"),
    ("run", "run", "run"),
    ("weight", "weight", "w"),
    ("rel_gain", "rel_gain peak -> now", "rel_gain peak -> now"),
    ("share", "variance share", "var"),
    ("constant", "constant", "const"),
    ("state", "state", "state"),
    ("mean", "mean reward", "mean"),
)
"""The compare channel table's columns: ``(key, header, short header)``; the narrowest layout drops weight, constant
and mean reward."""


def _channels(console: Console, comparison: Comparison, letters: Sequence[str]) -> None:
    rows = [{row["channel"]: row for row in r.diagnosis.channel_table()} for r in comparison.runs]

    def build(layout: str) -> tuple[Any, int | None]:
        table = _table()
        keep = [c for c in CHANNEL_COLUMNS if layout != "narrowest" or c[0] not in ("weight", "constant", "mean")]
        shown = [(key, header if layout == "full" else short) for key, header, short in keep]
        for key, header in shown:
            table.add_column(header, justify="left" if key in ("channel", "run", "state") else "right", **ONE_LINE)
        steps = {"full": "full", "short": "short"}.get(layout, "none")
        for channel in comparison.channels:
            for k, (letter, by_channel, run) in enumerate(zip(letters, rows, comparison.runs, strict=True)):
                row = by_channel.get(channel)
                cells = {"channel": printable(channel) if k == 0 else "", "run": letter}
                if row is None:
                    cells |= dict.fromkeys(("weight", "share", "constant", "state", "mean"), "-")
                    cells["rel_gain"] = "not in this run"
                else:
                    algo = "gdpo" if run.diagnosis.run.algorithm == "gdpo" else "grpo"
                    cells |= {
                        "weight": f"{row['weight']:g}",
                        "rel_gain": peak_to_now(
                            row.get("rel_gain_peak"),
                            row.get("rel_gain_peak_step"),
                            row.get("rel_gain_now"),
                            steps=steps,
                        ),
                        "share": share_pct(row.get(f"signal_share_{algo}")),
                        "constant": pct(row.get("zero_variance_share")),
                        "state": _state(row),
                        "mean": _num(row.get("reward_mean")),
                    }
                table.add_row(*(cells[key] for key, _ in shown))
        return table, 0

    layouts: list[Layout] = [lambda layout=layout: build(layout) for layout in ("full", "short", "narrow", "narrowest")]  # type: ignore[misc]
    console.print(
        Text("Channels (now = median of the last 10% of steps; variance share under the run's algorithm)", style="bold")
    )
    print_table(console, fit_table(console, layouts))
    console.print()


def _at(finding: Finding | None) -> str:
    if finding is None:
        return "-"
    onset = f" @{finding.onset_step}" if finding.onset_step is not None else ""
    ended = f", ended @{finding.recovered_step}" if finding.recovered_step is not None else ""
    return f"{finding.severity.label}{onset}{ended}"


def _findings(console: Console, comparison: Comparison, letters: Sequence[str]) -> None:
    console.print(Text(f"Findings by run (matched by code and channels; {len(comparison.findings)})", style="bold"))
    if not comparison.findings:
        console.print("  none in any run")
        console.print()
        return
    wide = len(letters) <= WIDE_RUNS

    def build(with_where: bool) -> tuple[Any, int | None]:
        table = _table()
        table.add_column("code", justify="left", **ONE_LINE)
        table.add_column("finding", justify="left", **ONE_LINE)
        for letter in letters if wide else ():
            table.add_column(letter, justify="left", **ONE_LINE)
        if with_where:
            table.add_column(
                "in", justify="right", **ONE_LINE
            )  # right-justified: no trailing spaces on the last column
        for match in comparison.findings:
            present = match.present
            if wide:
                where = "in every run" if match.shared else "only in " + ", ".join(letters[i] for i in present)
            else:  # no column per run: where it is, with its severity and onset in each
                runs = ", ".join(f"{letters[i]} {_at(match.findings[i])}" for i in present)
                where = f"in every run: {runs}" if match.shared else f"in {len(present)} of {len(letters)}: {runs}"
            title = match.title
            if match.titles_differ:
                title = " / ".join(
                    f"{letters[i]}: {f.condition}" for i, f in enumerate(match.findings) if f is not None
                )
            cells = [_at(f) for f in match.findings] if wide else []
            table.add_row(match.code, printable(title), *cells, *([where] if with_where else []))
        # With a column per run the "in" column goes before a title is cut (it only repeats those columns).
        return table, 1 if not (wide and with_where) else None

    # Narrow: the "in" column goes; then, on a terminal, a long title is cut.
    layouts: list[Layout] = [lambda: build(True)] + ([lambda: build(False)] if wide else [])
    print_table(console, fit_table(console, layouts))
    console.print("  (severity @ onset step, ended @ the step a condition recovered at)", style="dim")
    console.print()


def render_gate(
    gate: GateResult, file: IO[str] | None = None, *, color: bool | None = None, console: Console | None = None
) -> None:
    """Print the gate: each criterion with its numbers and whether it failed, then the verdict of the gate."""
    console = console or console_for(file, color)
    console.print(Text(f"Regression gate (fail-on {gate.settings.fail_on})", style="bold"))
    console.print(f"  run       {printable(gate.run)}", soft_wrap=True)
    console.print(f"  baseline  {printable(gate.baseline)}", soft_wrap=True)

    def build(with_detail: bool) -> tuple[Any, int | None]:
        table = _table()
        for name, justify in [
            ("criterion", "left"),
            ("baseline", "right"),
            ("run", "right"),
            ("limit", "right"),
            ("detail", "left"),
            ("result", "right"),  # right-justified: no trailing spaces on the last column
        ]:
            if name != "detail" or with_detail:
                table.add_column(name, justify=justify, **ONE_LINE)  # type: ignore[arg-type]
        for c in gate.criteria:
            share = c.name == "zero_advantage_share"
            cells: list[str | Text] = [
                printable(c.subject),
                criterion_value(c.baseline, share),
                criterion_value(c.run, share),
                criterion_value(c.limit, share),
                printable(c.detail),
                Text("FAILED", style="bold red") if c.failed else Text("ok", style="green"),
            ]
            table.add_row(*(cells if with_detail else cells[:4] + cells[5:]))
        return table, 0

    table, _ = build(True)
    natural = sum(max([len(str(col.header))] + [len(str(cell)) for cell in col.cells]) for col in table.columns)
    if natural + 3 * (len(table.columns) - 1) <= console.width:
        print_table(console, table)
    else:  # narrow: the detail folds under its row
        folds = [Text("      " + printable(c.detail), style="dim") if c.detail else None for c in gate.criteria]
        print_table_with_folds(console, fit_table(console, [lambda: build(False)]), folds)
    console.print(Text(gate.summary(), style="bold red" if gate.failed else "bold green"))
    console.print()


def criterion_value(value: Any, share: bool) -> str:
    """A gate criterion's number as the terminal shows it (a share in whole percents, else two decimals)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return pct(value) if share else _num(value)
    return printable(value)


# -- the conclusion --------------------------------------------------------------------------------
CHECKS_NAMED = 4
"""The most checks a conclusion names that did not run on the run (it counts the rest)."""


def conclusion_sentence(
    conclusion: Conclusion, baseline: str, run: str, *, gated: bool = True, number: Callable[[Any], str] = _num
) -> str:
    """The conclusion as one sentence, ``run`` and ``baseline`` the names it is shown under (letters, labels):
    the measures that got worse (or, for ``better``, better) with both values, rounded as in the scan report;
    what could not be compared, counted against the run as the gate counts it; then what the gate says.

    ``gated``: the gate decides the exit code (``compare --gate``, ``scan --baseline``); otherwise the sentence
    says what ``--gate`` would do. ``number``: how a rel_gain is shown (the terminal's 2 decimals by default, the
    page's 2 significant digits there); shares are whole percents.
    """
    return " ".join(conclusion_chunks(conclusion, baseline, run, gated=gated, number=number))


def conclusion_chunks(
    conclusion: Conclusion, baseline: str, run: str, *, gated: bool = True, number: Callable[[Any], str] = _num
) -> list[str]:
    """:func:`conclusion_sentence` in the pieces a line may break between (one measure each, with its comma)."""
    worse = [_change(c, number) for c in conclusion.worse] + _findings_changed(conclusion)
    better = [_change(c, number) for c in conclusion.better] + [_eased(f) for f in conclusion.eased_findings]
    against = _not_compared([c for c in conclusion.not_compared if c.counts_against], baseline, run)
    neutral = _not_compared([c for c in conclusion.not_compared if not c.counts_against], baseline, run)
    clauses: list[tuple[str, list[str]]] = []  # (what leads the clause, its items)
    if conclusion.verdict == "worse":
        clauses.append((f"{run} is worse than {baseline}", worse))
        clauses.append((f"counted against {run}", against))
        clauses.append(("better", better))
    elif conclusion.verdict == "not_cleared":
        counts = "counts" if len(against) == 1 else "count"
        clauses.append((f"{run} cannot be cleared against {baseline}", [*against, f"which {counts} against {run}"]))
        clauses.append(("better", better))
    elif conclusion.verdict == "better":
        clauses.append((f"{run} is better than {baseline}", better))
    else:
        clauses.append((f"{run} is no worse than {baseline} on every measure compared", []))
    clauses.append(("", neutral))  # not compared on either side: said, held against neither
    failed = conclusion.gate_failed
    gate = (
        f"the gate {'fails' if failed else 'passes'} {run}"
        if gated
        else f"--gate would {'fail' if failed else 'pass'} {run}"
    )
    chunks: list[str] = []
    for k, (lead, items) in enumerate(clauses):
        if not items and k:
            continue  # a clause with nothing to say, after the head
        pieces = [f"{lead}: {items[0]}" if lead else items[0], *items[1:]] if items else [lead]
        chunks += [f"{piece}," for piece in pieces[:-1]] + [f"{pieces[-1]};"]
    return [*chunks, gate]


def print_conclusion(console: Console, chunks: Sequence[str], *, failed: bool) -> None:
    """The conclusion's chunks (:func:`conclusion_chunks`) wrapped to the console, continuation lines indented,
    lines broken between measures where they fit; off a terminal, one line."""
    if not wraps(console):
        console.print(Text(" ".join(printable(c) for c in chunks), style="bold red" if failed else "bold green"))
        return
    width = max(40, console.width - 1)
    lines = [""]
    for chunk in (printable(c) for c in chunks):
        line, room = lines[-1], width - (2 if len(lines) > 1 else 0)
        if len(line) + bool(line) + len(chunk) <= room:
            lines[-1] = f"{line} {chunk}" if line else chunk
            continue
        if line:
            lines.append("")
        # A measure longer than a line: wrapped at its spaces (the indent is added below, to every later line).
        first = "  " if len(lines) > 1 else ""
        pieces = textwrap.wrap(
            chunk,
            width=width,
            initial_indent=first,
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        lines[-1:] = [pieces[0][len(first) :], *(p[2:] for p in pieces[1:])]
    text = "\n".join(lines[:1] + [f"  {line}" for line in lines[1:]])
    console.print(Text(text, style="bold red" if failed else "bold green"), soft_wrap=True)


def _value(measure: str, value: Any, number: Callable[[Any], str]) -> str:
    if measure == "zero_advantage_share":
        return pct(value)
    if measure == "verdict":
        return VERDICTS.get(str(value), str(value)).lower()
    return number(value)


def _change(change: GateCriterion, number: Callable[[Any], str]) -> str:
    """``zero-advantage share 3% -> 19%``, ```format` rel_gain 0.75 -> 0.56``, ``verdict healthy -> at risk``."""
    values = f"{_value(change.name, change.baseline, number)} -> {_value(change.name, change.run, number)}"
    if change.name == "rel_gain":
        return f"`{change.channel}` rel_gain {values}"
    return f"{change.name.replace('_', '-').replace('-share', ' share')} {values}"


def _finding(f: FindingChange) -> str:
    return f.code + (f" ({', '.join(f'`{c}`' for c in f.channels)})" if f.channels else "")


def _findings_changed(conclusion: Conclusion) -> list[str]:
    """``new CD102 and CD104``; one the baseline has below the gate level, or less severe: ``CD104 info -> warning``."""
    brand_new = [_finding(f) for f in conclusion.new_findings if f.baseline is None]
    out = [f"new {_and(brand_new)}"] if brand_new else []
    for f in (*(f for f in conclusion.new_findings if f.baseline is not None), *conclusion.escalated_findings):
        out.append(f"{_finding(f)} {_severity(f.baseline)} -> {_severity(f.run)}")
    return out


def _eased(f: FindingChange) -> str:
    if f.run is None:
        return f"{_finding(f)} gone"
    return f"{_finding(f)} {_severity(f.baseline)} -> {_severity(f.run)}"


def _severity(severity: Severity | None) -> str:
    return severity.label if severity is not None else "none"


def _not_compared(changes: Sequence[GateCriterion], baseline: str, run: str) -> list[str]:
    """What the gate could not compare, channels of one reason together: ```a` and `b` rel_gain not compared (no
    such channel in B)``."""
    out: list[str] = []
    channels: dict[str, list[str]] = {}
    for c in changes:
        if c.name == "rel_gain":
            channels.setdefault(c.reason, []).append(f"`{c.channel}`")
        elif c.reason == "inconclusive":
            out.append(f"{run} could not be judged (inconclusive)")
        elif c.reason == "not_run":
            named = ", ".join(c.codes[:CHECKS_NAMED]) + (
                f", +{len(c.codes) - CHECKS_NAMED} more" if len(c.codes) > CHECKS_NAMED else ""
            )
            checks = "check" if len(c.codes) == 1 else "checks"
            out.append(f"{len(c.codes)} {checks} of {baseline} not run on {run} ({named})")
        elif c.reason.startswith("no_rollouts"):
            where = {"no_rollouts_run": run, "no_rollouts_baseline": baseline}.get(c.reason, "either run")
            out.append(f"zero-advantage share not compared (no rollouts in {where})")
    why = {"no_channel": f"no such channel in {run}", "no_value": f"no value now in {run}"}
    for reason, names in channels.items():
        out.append(f"{_and(names)} rel_gain not compared ({why.get(reason, reason)})")
    return out


def _and(items: Sequence[str]) -> str:
    """``a, b and c``.

    >>> _and(["a", "b", "c"]), _and(["a"])
    ('a, b and c', 'a')
    """
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def render_conclusion(gate: GateResult, console: Console, *, blank: bool = True) -> None:
    """``scan --baseline``: the gate's conclusion first, of "the run" against "the baseline" (the gate's table
    below names both), then a blank line (``blank``)."""
    chunks = conclusion_chunks(conclude(gate), "the baseline", "the run")
    chunks[0] = chunks[0][:1].upper() + chunks[0][1:]
    print_conclusion(console, chunks, failed=gate.failed)
    if blank:
        console.print()
