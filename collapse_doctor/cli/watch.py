"""``collapse-doctor watch``: follow a run while it trains, each new finding once."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer

from collapse_doctor.cli.common import EXIT_FINDINGS, EXIT_OK, Terminated, note, terminal
from collapse_doctor.cli.options import DETECTORS, FAIL_ON_CHOICES, INPUT, LENGTHS, RUNS, choice_option, shared_options
from collapse_doctor.core.options import ScanOptions

if TYPE_CHECKING:
    from collapse_doctor.core.findings import Finding
    from collapse_doctor.core.result import Diagnosis


@shared_options(INPUT, LENGTHS, DETECTORS, RUNS)
def watch(
    paths: Annotated[list[str], typer.Argument(help="Log or rollout directory (or files) of a run being trained.")],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls (> 0).")] = 30.0,
    fail_on: Annotated[
        str,
        choice_option(
            "--fail-on",
            choices=FAIL_ON_CHOICES,
            help="Exit 1 at the first finding at or above: never, info, warning, critical.",
        ),
    ] = "never",
    *,
    options: ScanOptions,
    max_polls: Annotated[int | None, typer.Option("--max-polls", hidden=True, min=1)] = None,
) -> None:
    """Follow a run while it trains: print each new finding once; --fail-on stops at the first bad one.

    Exit codes: 1 a finding at or above --fail-on, 0 Ctrl-C (with a summary), 2 bad input or usage.

    Example: collapse-doctor watch out/ --interval 30 --fail-on critical
    """
    from collapse_doctor.pipeline.watch import MIN_INTERVAL, WatchState, finding_line, withdrawn_line
    from collapse_doctor.pipeline.watch import watch as follow

    # 0 only with the hidden --max-polls (tests): without a pause the poll loop would spin a core.
    if not math.isfinite(interval) or (interval < MIN_INTERVAL and not (interval == 0 and max_polls is not None)):
        from collapse_doctor.core.errors import UsageError

        raise UsageError(
            f"--interval {interval:g}: expected at least {MIN_INTERVAL:g} seconds between polls",
            hint="e.g. --interval 30",
        )
    from collapse_doctor.core.findings import check_fail_on

    fail_on = check_fail_on(fail_on)  # a bad level is one line, before the watch starts
    note(f"watching {', '.join(paths)} every {interval:g} s (fail-on {fail_on}); Ctrl-C to stop")
    settings = terminal()

    def found(diagnosis: Diagnosis, finding: Finding) -> None:
        # Each new finding is a result (stdout); -q keeps only the summary and the line that stops the watch.
        if settings.quiet:
            return
        typer.echo(finding_line(diagnosis, finding))
        if settings.verbose and finding.evidence:
            from collapse_doctor.report.text import evidence_text

            typer.echo(f"    evidence: {evidence_text(finding)}")

    def withdrawn(diagnosis: Diagnosis, finding: Finding) -> None:
        if not settings.quiet:
            typer.echo(withdrawn_line(diagnosis, finding))

    state = WatchState()
    try:
        follow(
            paths,
            options,
            interval=interval,
            fail_on=fail_on,
            max_polls=max_polls,
            on_finding=found,
            on_withdrawn=withdrawn,
            on_note=note,
            state=state,
        )
    except KeyboardInterrupt:
        typer.echo(f"stopped (Ctrl-C): {state.summary()}")
        raise typer.Exit(EXIT_OK) from None
    except Terminated:
        typer.echo(f"stopped (SIGTERM): {state.summary()}")
        raise
    typer.echo(state.summary())
    if state.failing is not None:
        typer.echo(f"stopping: {state.failing.code} is at or above --fail-on {fail_on}")
        raise typer.Exit(EXIT_FINDINGS)
