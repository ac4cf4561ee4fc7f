"""``collapse-doctor compare``: runs side by side, optionally gated against the first."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import EXIT_OK, DelayedProgress, color_for, size_of, terminal, wrote
from collapse_doctor.cli.options import (
    DETECTORS,
    INPUT,
    LENGTHS,
    SCALE,
    VERDICT,
    RelGainMarginOption,
    ZeroAdvMarginOption,
    check_gate_margins,
    choice_option,
    gate_settings,
    shared_options,
)
from collapse_doctor.core.options import ScanOptions


@shared_options(INPUT, LENGTHS, VERDICT, DETECTORS, SCALE)
def compare(
    runs: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN...",
            help="Two or more runs, each anything scan takes (file, directory, glob, URL); PATH@NAME picks one run"
            " of a directory that holds several. The first is the baseline of --gate.",
        ),
    ],
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the comparison as JSON to this file ('-': stdout).")
    ] = None,
    html_out: Annotated[
        Path | None, typer.Option("--html", help="Write one offline HTML page with the runs overlaid to this file.")
    ] = None,
    output_format: Annotated[
        str, choice_option("--format", choices=("text", "json"), help="stdout format: text or json.")
    ] = "text",
    align: Annotated[
        str,
        choice_option(
            "--align", choices=("step", "fraction"), help="Align the runs by step (default) or by fraction of training."
        ),
    ] = "step",
    gate: Annotated[
        bool, typer.Option("--gate", help="Judge every later run against the first: exit 1 on a regression.")
    ] = False,
    zero_adv_margin: ZeroAdvMarginOption = None,
    rel_gain_margin: RelGainMarginOption = None,
    *,
    options: ScanOptions,
) -> None:
    """Compare runs side by side: verdicts, signal budgets, channel tables, findings only one run has, onsets.

    Exit codes: 0 compared (with --gate: no run regressed against the first), 1 with --gate a run regressed,
    2 bad input or usage.

    Example: collapse-doctor compare runs/grpo runs/gdpo --gate
    """
    from collapse_doctor.core.errors import UsageError
    from collapse_doctor.pipeline.compare import compare_runs
    from collapse_doctor.report.compare_outputs import write_comparison

    if output_format not in ("text", "json"):
        raise UsageError(f"--format {output_format!r} is not one of text, json")
    check_gate_margins(zero_adv_margin, rel_gain_margin, gated=gate, needs="--gate", hint="compare GOOD NEW --gate")
    # The gate's margins resolve against the first run's config: compare_runs calls this with it.
    settings = functools.partial(gate_settings, zero_adv_margin=zero_adv_margin, rel_gain_margin=rel_gain_margin)
    outputs = {"--json": json_out, "--html": html_out}
    with DelayedProgress("scanning") as progress:
        comparison, inputs = compare_runs(
            runs, options, align=align, gate=settings if gate else None, outputs=outputs, on_progress=progress
        )
    write_comparison(
        comparison,
        inputs,
        json_out=json_out,
        html_out=html_out,
        output_format=output_format,
        stdout=sys.stdout,
        color=color_for(sys.stdout),
        on_written=lambda what, path: wrote(path, what, size_of(path)),
        verbosity=terminal().verbosity,
    )
    raise typer.Exit(max((g.exit_code for g in comparison.gates), default=EXIT_OK))
