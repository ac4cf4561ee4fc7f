"""``collapse-doctor scan``: diagnose runs and write every output; with ``--baseline``, gate against a good run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from collapse_doctor.cli.common import color, color_for, scan_and_write, size_of, terminal, wrote
from collapse_doctor.cli.options import (
    DETECTORS,
    INPUT,
    LENGTHS,
    RUNS,
    SCALE,
    VERDICT,
    BaselineOption,
    RelGainMarginOption,
    RunPathsArgument,
    ZeroAdvMarginOption,
    check_gate_margins,
    choice_option,
    gate_settings,
    shared_options,
)
from collapse_doctor.core.options import ScanOptions

if TYPE_CHECKING:
    from collapse_doctor.pipeline.scan import ScanResult
    from collapse_doctor.report.outputs import OutputRequest


@shared_options(INPUT, LENGTHS, VERDICT, DETECTORS, RUNS, SCALE)
def scan(
    paths: RunPathsArgument,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the diagnosis as JSON to this file.")] = None,
    junit_out: Annotated[Path | None, typer.Option("--junit", help="Write a JUnit XML report to this file.")] = None,
    markdown_out: Annotated[
        Path | None,
        typer.Option("--markdown", help="Write a Markdown summary (for PR comments) to this file."),
    ] = None,
    html_out: Annotated[
        Path | None, typer.Option("--html", help="Write the offline HTML report (as `report --html`) to this file.")
    ] = None,
    output_format: Annotated[
        str,
        choice_option(
            "--format",
            choices=("text", "json", "github"),
            help="stdout format: text, json or github (workflow annotations).",
        ),
    ] = "text",
    summary_only: Annotated[
        bool,
        typer.Option("--summary-only", help="Several runs: print the summary table (one line per run) only."),
    ] = False,
    baseline: BaselineOption = None,
    zero_adv_margin: ZeroAdvMarginOption = None,
    rel_gain_margin: RelGainMarginOption = None,
    *,
    options: ScanOptions,
) -> None:
    """Diagnose a run: verdict, per-channel table, findings with evidence and remedy; exit code for CI.

    Exit codes: 0 nothing at or above --fail-on, 1 findings at or above it, 2 bad input or usage.
    With --baseline GOOD_RUN: 1 when the run regressed against the baseline (see docs/ci.md), else 0.

    Example: collapse-doctor scan runs/exp1 --json scan.json
    """
    from collapse_doctor.report.outputs import OutputRequest

    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    request = OutputRequest(
        format=output_format,
        json=json_out,
        junit=junit_out,
        markdown=markdown_out,
        html=html_out,
        step_summary=Path(step_summary) if step_summary else None,
        color=color(),
        summary_only=summary_only,
        verbosity=terminal().verbosity,
        warnings=False,  # said on stderr (scan_and_write)
    )
    check_gate_margins(
        zero_adv_margin,
        rel_gain_margin,
        gated=baseline is not None,
        needs="--baseline",
        hint="scan RUN --baseline GOOD",
    )
    if baseline is None:
        code, results, _ = scan_and_write(paths, options, request, stdout=sys.stdout)
        _report_written(request, results)
        raise typer.Exit(code)
    from collapse_doctor.pipeline.compare import GateResult, load_runs
    from collapse_doctor.report.compare_outputs import gate_runs, write_gates

    # The baseline first: a bad baseline fails before the run is scanned.
    # Its files are inputs too: no output of the scan may overwrite them.
    base_args, base_results = load_runs([baseline], options.with_(run_name=None), minimum=1, outputs=request.files())

    def gate(results: list[ScanResult]) -> list[GateResult]:
        settings = gate_settings(results[0].diagnosis.config, zero_adv_margin, rel_gain_margin)
        return gate_runs(base_args[0].label, base_results[0].diagnosis, [r.diagnosis for r in results], settings)

    code, results, gates = scan_and_write(paths, options, request, stdout=sys.stdout, gate=gate)
    _report_written(request, results)
    # The gate is the result of a text scan (stdout); beside JSON or annotations on stdout it is a note (stderr).
    if output_format == "text":
        write_gates(gates, sys.stdout, color=color_for(sys.stdout), verbosity=terminal().verbosity)
    elif not terminal().quiet:
        write_gates(gates, sys.stderr, color=color_for(sys.stderr), verbosity=terminal().verbosity)
    raise typer.Exit(code)


def _report_written(request: OutputRequest, results: list[ScanResult]) -> None:
    """One ``wrote PATH (SIZE): WHAT`` line on stderr per file written (stdout stays the scan's own output)."""
    from collapse_doctor.report.outputs import written_files

    for what, path in written_files(request, results):
        wrote(path, what, size_of(path))
