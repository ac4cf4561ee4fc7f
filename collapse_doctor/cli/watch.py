"""``collapse-doctor watch``: follow a run while it trains, each new finding once."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from collapse_doctor.cli.common import EXIT_FINDINGS, EXIT_OK, Terminated, err
from collapse_doctor.cli.options import DETECTORS, INPUT, LENGTHS, RUNS, shared_options
from collapse_doctor.core.options import ScanOptions


@shared_options(INPUT, LENGTHS, DETECTORS, RUNS)
def watch(
    paths: Annotated[list[str], typer.Argument(help="Log or rollout directory (or files) of a run being trained.")],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls (> 0).")] = 30.0,
    fail_on: Annotated[
        str,
        typer.Option("--fail-on", help="Exit 1 at the first finding at or above: never, info, warning, critical."),
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
    typer.echo(f"watching {', '.join(paths)} every {interval:g} s (fail-on {fail_on}); Ctrl-C to stop")
    state = WatchState()
    try:
        follow(
            paths,
            options,
            interval=interval,
            fail_on=fail_on,
            max_polls=max_polls,
            on_finding=lambda diagnosis, finding: typer.echo(finding_line(diagnosis, finding)),
            on_withdrawn=lambda diagnosis, finding: typer.echo(withdrawn_line(diagnosis, finding)),
            on_note=err,
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
