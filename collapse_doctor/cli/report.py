"""``collapse-doctor report``: scan runs and write the offline HTML report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import color_for, scan_and_write, size_of, wrote
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
    from collapse_doctor.io.storage.atomic import is_stdout
    from collapse_doctor.report.outputs import OutputRequest, written_files
    from collapse_doctor.report.text import verdict_line

    request = OutputRequest(html=html_out)
    code, results, _ = scan_and_write(paths, options, request, stdout=None)
    # Files written: stderr. The result, each run's verdict line: stdout, unless the page itself is on stdout.
    if len(results) > 1:
        for what, path in written_files(request, results)[1:]:
            wrote(path, what, size_of(path))
        worst = VERDICTS[worst_verdict(r.diagnosis.verdict for r in results)]
        if not is_stdout(html_out):
            wrote(html_out, f"index of {len(results)} runs, worst verdict {worst}", size_of(html_out))
    else:
        d = results[0].diagnosis
        summary = f"{VERDICTS[d.verdict]}, {len(d.findings)} finding(s), {d.run.steps:,} steps"
        if not is_stdout(html_out):
            wrote(html_out, summary, size_of(html_out))
    out = sys.stderr if is_stdout(html_out) else sys.stdout
    from collapse_doctor.report.text import console_for

    console = console_for(out, color_for(out))
    for result in results:
        console.print(verdict_line(result.diagnosis, named=len(results) > 1), soft_wrap=True)
    raise typer.Exit(code)
