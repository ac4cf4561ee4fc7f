"""``collapse-doctor report``: scan runs and write the offline HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import err, scan_and_write
from collapse_doctor.cli.options import (
    DETECTORS,
    INPUT,
    LENGTHS,
    RUNS,
    SCALE,
    VERDICT,
    RunPathsArgument,
    shared_options,
)
from collapse_doctor.core.options import ScanOptions


@shared_options(INPUT, LENGTHS, VERDICT, DETECTORS, RUNS, SCALE)
def report(
    paths: RunPathsArgument,
    html_out: Annotated[Path, typer.Option("--html", help="Write the self-contained HTML report to this file.")],
    *,
    options: ScanOptions,
) -> None:
    """Scan a run and write one self-contained, offline, interactive HTML report (plotly).

    Same input and detector options as scan, and the same exit codes: 0 nothing at or above
    --fail-on, 1 findings at or above it, 2 bad input or usage.

    Example: collapse-doctor report runs/exp1 --html report.html
    """
    from collapse_doctor.core.findings import VERDICTS, worst_verdict
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.io.storage.atomic import is_stdout
    from collapse_doctor.report.outputs import OutputRequest, written_files

    request = OutputRequest(html=html_out)
    code, results, _ = scan_and_write(paths, options, request, stdout=None)
    to_stdout = is_stdout(html_out)  # the report is on stdout: the summary goes to stderr
    size = "" if to_stdout else f" ({html_out.stat().st_size / 1e6:.1f} MB)"
    if len(results) > 1:
        for what, path in written_files(request, results)[1:]:
            typer.echo(f"wrote {printable(path)}: {what}")
    for result in results:
        diagnosis = result.diagnosis
        for warning in diagnosis.run.warnings:
            err(f"warning: {printable(warning)}")
        if len(results) == 1:
            typer.echo(
                f"wrote {printable(html_out)}{size}: {VERDICTS[diagnosis.verdict]}, "
                f"{len(diagnosis.findings)} finding(s), {diagnosis.run.steps:,} steps",
                err=to_stdout,
            )
    if len(results) > 1:
        worst = VERDICTS[worst_verdict(r.diagnosis.verdict for r in results)]
        typer.echo(f"wrote {printable(html_out)}: index of {len(results)} runs, worst verdict {worst}", err=to_stdout)
    raise typer.Exit(code)
