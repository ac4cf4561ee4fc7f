"""The ``collapse-doctor`` command line: parse options, call one library function, render, exit.

Heavy modules (torch, pyarrow) are imported inside the commands so that ``--help`` stays fast.
Exit codes: 0 success, 1 findings at or above ``--fail-on`` (scan), 2 usage, input or internal error.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from collapse_doctor import __version__
from collapse_doctor.errors import CollapseDoctorError

app = typer.Typer(
    name="collapse-doctor",
    help="Find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")]
StepColOption = Annotated[str | None, typer.Option("--step-col", help="Column holding the training step.")]
GroupColOption = Annotated[
    str | None, typer.Option("--group-col", help="Column holding the group (prompt) id within a step.")
]
RewardColsOption = Annotated[
    str | None, typer.Option("--reward-cols", help="Comma-separated reward columns (default: discovered).")
]
GroupSizeOption = Annotated[
    int | None,
    typer.Option("--group-size", min=1, help="Rebuild groups as consecutive blocks of N rollouts per step."),
]
WeightsOption = Annotated[
    str | None, typer.Option("--weights", help="Channel weights, e.g. format=1,correct=0.5 (default 1.0).")
]
DeviceOption = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]


def _err(message: str) -> None:
    typer.echo(message, err=True)


@contextmanager
def user_errors(debug: bool) -> Iterator[None]:
    """Turn library errors into one line on stderr and exit code 2 (a traceback only with --debug)."""
    debug = debug or os.environ.get("COLLAPSE_DOCTOR_DEBUG") == "1"
    try:
        yield
    except CollapseDoctorError as exc:
        if debug:
            raise
        _err(f"error: {exc.one_line()}")
        raise typer.Exit(EXIT_ERROR) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:
        if debug:
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        _err(f"error: internal error: {type(exc).__name__}: {detail} (rerun with --debug for the traceback)")
        raise typer.Exit(EXIT_ERROR) from None


class DelayedProgress:
    """A progress bar on stderr that appears only on a terminal and only after ``delay`` seconds."""

    def __init__(self, description: str, *, delay: float = 1.0) -> None:
        self._description = description
        self._delay = delay
        self._started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        self._enabled = sys.stderr.isatty() and not os.environ.get("CI")

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        if self._progress is None:
            if time.monotonic() - self._started < self._delay:
                return
            from rich.console import Console
            from rich.progress import Progress

            self._progress = Progress(console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _split(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


def _read_options(
    weights: str | None,
    device: str,
    step_col: str | None,
    group_col: str | None,
    reward_cols: str | None,
    group_size: int | None,
) -> dict[str, Any]:
    """The input and device options that every command reading a run passes to the library."""
    from collapse_doctor.schema import parse_weights

    return {
        "weights": parse_weights(weights),
        "device": device,
        "step_col": step_col,
        "group_col": group_col,
        "reward_cols": _split(reward_cols),
        "group_size": group_size,
    }


def _version(value: bool) -> None:
    if value:
        typer.echo(f"collapse-doctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it."""


@app.command()
def advantages(
    paths: Annotated[list[str], typer.Argument(help="Parquet file(s), directories or globs of one run.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output Parquet file.")],
    convention: Annotated[str, typer.Option("--convention", help="trl, verl or paper.")] = "trl",
    scale: Annotated[str, typer.Option("--scale", help="GRPO scaling: group, batch or none.")] = "group",
    weights: WeightsOption = None,
    device: DeviceOption = "auto",
    step_col: StepColOption = None,
    group_col: GroupColOption = None,
    reward_cols: RewardColsOption = None,
    group_size: GroupSizeOption = None,
    debug: DebugOption = False,
) -> None:
    """Recompute GRPO and GDPO advantages of every rollout and write them to a Parquet file.

    The output has the input rows in input order: step, group_id, any prompt/completion/advantage
    columns, reward/<channel>, adv/grpo, adv/gdpo and adv/<channel> (per-channel group z-scores).
    """
    with user_errors(debug):
        from collapse_doctor.export import export_advantages

        progress = DelayedProgress("recomputing advantages")
        try:
            summary = export_advantages(
                paths,
                output,
                convention=convention,
                scale=scale,
                on_progress=progress,
                **_read_options(weights, device, step_col, group_col, reward_cols, group_size),
            )
        finally:
            progress.close()
        for warning in summary.warnings:
            _err(f"warning: {warning}")
        channels = ", ".join(f"{c} (w={summary.weights[c]:g})" for c in summary.channels)
        typer.echo(
            f"wrote {summary.output}: {summary.rows:,} rows, {summary.steps:,} steps; channels {channels}; "
            f"convention {summary.convention}, scale {summary.scale}, device {summary.device}, "
            f"{summary.seconds:.1f} s"
        )


OutputPath = Annotated[Path | None, typer.Option(help="Write to this file (atomically).")]


def _write_output(path: Path, text: str, inputs: list[Path]) -> None:
    from collapse_doctor.io.atomic import atomic_path

    with atomic_path(path, inputs=inputs) as tmp:
        tmp.write_text(text, encoding="utf-8")


@app.command()
def scan(
    paths: Annotated[list[str], typer.Argument(help="Parquet file(s), directories or globs of one run.")],
    weights: WeightsOption = None,
    algo: Annotated[
        str,
        typer.Option("--algo", help="Aggregation the run used: auto (from logged advantages), grpo or gdpo."),
    ] = "auto",
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="Exit 1 on findings at or above: never, info, warning (default), critical."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the diagnosis as JSON to this file.")] = None,
    junit_out: Annotated[Path | None, typer.Option("--junit", help="Write a JUnit XML report to this file.")] = None,
    markdown_out: Annotated[
        Path | None,
        typer.Option("--markdown", help="Write a Markdown summary (for PR comments) to this file."),
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", help="stdout format: text, json or github (workflow annotations).")
    ] = "text",
    config: Annotated[Path | None, typer.Option("--config", help="Config file (TOML) with thresholds.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Run only these detector codes (CD101,CD3...).")] = None,
    ignore: Annotated[str | None, typer.Option("--ignore", help="Skip these detector codes.")] = None,
    device: DeviceOption = "auto",
    step_col: StepColOption = None,
    group_col: GroupColOption = None,
    reward_cols: RewardColsOption = None,
    group_size: GroupSizeOption = None,
    debug: DebugOption = False,
) -> None:
    """Diagnose a run: verdict, per-channel table, findings with evidence and remedy; exit code for CI.

    Exit codes: 0 nothing at or above --fail-on, 1 findings at or above it, 2 bad input or usage.
    """
    with user_errors(debug):
        from collapse_doctor.diagnosis import diagnose

        if output_format not in ("text", "json", "github"):
            from collapse_doctor.errors import UsageError

            raise UsageError(f"--format {output_format!r} is not one of text, json, github")
        progress = DelayedProgress("scanning")
        try:
            diagnosis = diagnose(
                paths,
                algo=algo,
                config=config,
                fail_on=fail_on,
                only=_split(only),
                ignore=_split(ignore),
                on_progress=progress,
                **_read_options(weights, device, step_col, group_col, reward_cols, group_size),
            )
        finally:
            progress.close()
        inputs = [Path(s) for s in diagnosis.run.sources]
        from collapse_doctor.report.ci import github_annotations, junit_xml, markdown_summary

        if json_out is not None:
            _write_output(json_out, diagnosis.to_json() + "\n", inputs)
        if junit_out is not None:
            _write_output(junit_out, junit_xml(diagnosis), inputs)
        if markdown_out is not None:
            _write_output(markdown_out, markdown_summary(diagnosis), inputs)
        if output_format == "json":
            typer.echo(diagnosis.to_json())
        elif output_format == "github":
            typer.echo(github_annotations(diagnosis), nl=False)
            summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary_file:
                with open(summary_file, "a", encoding="utf-8") as handle:
                    handle.write(markdown_summary(diagnosis))
        else:
            from collapse_doctor.report.text import render_text

            plain = bool(os.environ.get("NO_COLOR")) or not sys.stdout.isatty()
            render_text(diagnosis, sys.stdout, color=False if plain else None)
        code = diagnosis.exit_code()
    raise typer.Exit(code)


@app.command()
def explain(
    code: Annotated[str | None, typer.Argument(help="Detector code, e.g. CD101 (omit to list all).")] = None,
    debug: DebugOption = False,
) -> None:
    """What a detector checks, why it matters, its evidence and the remedy."""
    with user_errors(debug):
        from collapse_doctor.detectors import REGISTRY
        from collapse_doctor.errors import UsageError

        if code is None:
            for known in sorted(REGISTRY):
                detector = REGISTRY[known]
                summary = detector.explain().splitlines()[0]
                typer.echo(f"{known}  {detector.name:26s} {summary}")
            return
        key = code.strip().upper()
        if key not in REGISTRY:
            raise UsageError(f"unknown detector code {code!r}", hint=f"known codes: {', '.join(sorted(REGISTRY))}")
        detector = REGISTRY[key]
        typer.echo(f"{key} {detector.name} (default severity {detector.default_severity.label})")
        typer.echo("")
        typer.echo(detector.explain())
        if detector.thresholds:
            typer.echo("")
            typer.echo(f"Thresholds ([tool.collapse-doctor.thresholds.{key}])")
            for name, value in detector.thresholds.items():
                typer.echo(f"    {name} = {value:g}")


@app.command()
def simulate(
    scenario: Annotated[str, typer.Argument(help="Scenario name (see the list below).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output Parquet file.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps.")] = 400,
    groups: Annotated[int, typer.Option("--groups", min=1, help="Prompts (groups) per step.")] = 64,
    group_size: Annotated[int, typer.Option("--group-size", min=1, help="Completions per prompt.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    onset_step: Annotated[
        int | None, typer.Option("--onset-step", help="Step where the scenario's failure starts.")
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Write a synthetic multi-reward run with known ground truth (in the file's metadata).

    Scenarios: healthy, single-reward, saturating-format, tied-sums, collinear, outlier-groups.
    """
    with user_errors(debug):
        from collapse_doctor.simulate import write_simulation

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
        typer.echo(
            f"wrote {summary.path}: scenario {scenario}, {summary.rows:,} rows, {summary.steps} steps, "
            f"channels {', '.join(summary.channels)}; ground truth: onset step {onset}, affected {affected}; "
            f"{time.perf_counter() - started:.1f} s"
        )


def main(argv: list[str] | None = None) -> Callable[..., Any] | None:
    """Console-script entry point."""
    try:
        return app(args=argv)
    except BrokenPipeError:
        # The reader went away (`collapse-doctor explain | head`): stop quietly, like other CLI tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_OK)


if __name__ == "__main__":  # pragma: no cover
    main()
