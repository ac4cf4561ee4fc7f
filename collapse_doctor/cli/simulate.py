"""``collapse-doctor simulate``: a synthetic run with known ground truth."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import note, user_errors
from collapse_doctor.cli.options import DebugOption, choice_argument, terminal_options

SCENARIOS = ("healthy", "single-reward", "saturating-format", "tied-sums", "collinear", "outlier-groups")
"""pipeline.simulate's scenarios (not imported: it imports NumPy and pyarrow, and --help stays fast)."""


@terminal_options("quiet")
def simulate(
    scenario: Annotated[str, choice_argument("SCENARIO", choices=SCENARIOS, help="The synthetic run to write.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output Parquet file.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps.")] = 400,
    groups: Annotated[int, typer.Option("--groups", min=1, help="Prompts (groups) per step.")] = 64,
    group_size: Annotated[int, typer.Option("--group-size", min=2, help="Completions per prompt.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    onset_step: Annotated[
        int | None, typer.Option("--onset-step", help="Step where the scenario's failure starts.")
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Write a synthetic multi-reward run with known ground truth (in the file's metadata).

    Scenarios: healthy, single-reward, saturating-format, tied-sums, collinear, outlier-groups.

    Example: collapse-doctor simulate saturating-format -o sat.parquet
    """
    with user_errors(debug):
        from collapse_doctor.pipeline.simulate import write_simulation

        started = time.perf_counter()
        summary = write_simulation(
            output,
            scenario,
            steps=steps,
            groups=groups,
            group_size=group_size,
            seed=seed,
            onset_step=onset_step,
        )
        truth = summary.ground_truth
        onset = truth.get("onset_step")
        affected = ", ".join(truth.get("affected_channels") or []) or "none"
        # The Parquet file is the result (on stdout with `-o -`): what was written is said on stderr.
        note(
            f"wrote {summary.path}: scenario {scenario}, {summary.rows:,} rows, {summary.steps} steps, "
            f"channels {', '.join(summary.channels)}; ground truth: "
            + (f"onset step {onset}" if onset is not None else "no onset (healthy)")
            + f", affected {affected}; "
            f"{time.perf_counter() - started:.1f} s"
        )
