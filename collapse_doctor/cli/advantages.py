"""``collapse-doctor advantages``: recompute GRPO and GDPO advantages into a Parquet file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import DelayedProgress, warn, wrote
from collapse_doctor.cli.options import INPUT, SCALE, SCALE_CHOICES, RunPathsArgument, choice_option, shared_options
from collapse_doctor.core.options import ScanOptions


@shared_options(INPUT, SCALE, terminal=("quiet",))
def advantages(
    paths: RunPathsArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Output Parquet file.")],
    convention: Annotated[
        str,
        choice_option(
            "--convention",
            choices=("trl", "verl", "paper"),
            help="Whose advantage conventions (eps, single-sample groups): trl, verl or paper.",
        ),
    ] = "trl",
    scale: Annotated[
        str | None,
        choice_option(
            "--scale",
            choices=SCALE_CHOICES,
            help="GRPO scaling: group, batch or none (default: what the logged advantages match).",
        ),
    ] = None,
    *,
    options: ScanOptions,
) -> None:
    """Recompute GRPO and GDPO advantages of every rollout and write them to a Parquet file.

    The output has the input rows in input order: step, group_id, any prompt/completion/advantage
    columns, reward/<channel>, adv/grpo, adv/gdpo and adv/<channel> (per-channel group z-scores).

    Example: collapse-doctor advantages runs/exp1 -o adv.parquet --convention verl
    """
    from collapse_doctor.pipeline.export import export_advantages

    with DelayedProgress("recomputing advantages") as progress:
        summary = export_advantages(
            paths,
            output,
            convention=convention,
            scale=scale,
            on_progress=progress,
            device=options.device,
            ray=options.ray,
            **options.read.reader_kwargs(),
        )
    from collapse_doctor.core.text_safety import printable

    for warning in summary.warnings:
        warn(printable(warning))
    channels = ", ".join(f"{printable(c)} (w={summary.weights[c]:g})" for c in summary.channels)
    # The Parquet file is the result; what was written is said on stderr (stdout may hold the file: `-o -`).
    local = Path(str(summary.output))
    size = local.stat().st_size if str(summary.output) != "-" and local.is_file() else None
    wrote(
        summary.output,
        f"{summary.rows:,} rows, {summary.steps:,} steps; channels {channels}; "
        f"convention {summary.convention}, scale {summary.scale} ({printable(summary.scale_source)}), "
        f"device {summary.device}, {summary.seconds:.1f} s",
        size,
    )
