"""The ``collapse-doctor`` command line: parse options, call one library function, render, exit.

Heavy modules (torch, pyarrow) are imported inside the commands so that ``--help`` stays fast.
Exit codes: 0 success, 1 findings at or above ``--fail-on`` (scan), 2 usage, input or internal error.

The options every command that reads a run shares (input columns, weights, device, detector selection,
``--run``...) are declared once, in :data:`SHARED_OPTIONS`; :func:`shared_options` adds a group of them to
a command's signature and hands the command one :class:`~collapse_doctor.core.options.ScanOptions`. ``scan`` and
``report`` run the same pipeline (:func:`_scan`) and write through the same dispatcher
(:mod:`collapse_doctor.report.outputs`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from collapse_doctor.core.errors import CollapseDoctorError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.version import __version__

if TYPE_CHECKING:
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.pipeline.scan import ScanResult
    from collapse_doctor.report.outputs import OutputRequest

app = typer.Typer(
    name="collapse-doctor",
    help="Find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _plain_argument_help() -> None:
    """Show positional arguments as users type them: ``PATH...`` in the usage line and the help, where Typer
    would show ``{PATH...}...`` and ``PATH... <list[str]>`` (its type label is Python's, not the user's)."""
    from typer.core import TyperArgument

    def usage_name(self: TyperArgument) -> str:
        name = self.display_name_raw
        if self.nargs != 1 and not name.endswith("..."):
            name += "..."
        return name if self.required else f"[{name}]"

    TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]
    TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


_plain_argument_help()

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

RunPathsArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="PATH...",
        help="Rollout files (Parquet, TRL completions, verl/NeMo-RL JSONL), log directories or globs of one run.",
    ),
]
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
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="Scale out on Ray: shards of a run, or a sweep's runs, as Ray tasks. No ADDRESS: a local instance;"
        " auto, HOST:PORT or ray://HOST:PORT: that cluster (the ray extra).",
    ),
]
RunOption = Annotated[
    str | None,
    typer.Option("--run", help="With several runs under a log directory: the one to read (default: all)."),
]
AlgoOption = Annotated[
    str,
    typer.Option("--algo", help="Aggregation the run used: auto (from logged advantages), grpo or gdpo."),
]
FailOnOption = Annotated[
    str | None,
    typer.Option("--fail-on", help="Exit 1 on findings at or above: never, info, warning (default), critical."),
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="Config file (TOML) with thresholds.")]
OnlyOption = Annotated[str | None, typer.Option("--only", help="Run only these detector codes (CD101,CD3...).")]
IgnoreOption = Annotated[str | None, typer.Option("--ignore", help="Skip these detector codes.")]
BaselineOption = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        metavar="GOOD_RUN",
        help="Gate against this known-good run (PATH or PATH@RUN): exit 1 only when the run regressed against it.",
    ),
]
ZeroAdvMarginOption = Annotated[
    float | None,
    typer.Option(
        "--zero-adv-margin", help="Gate: allowed growth of the zero-advantage share, absolute (default 0.05)."
    ),
]
RelGainMarginOption = Annotated[
    float | None,
    typer.Option("--rel-gain-margin", help="Gate: allowed drop of a channel's rel_gain now, relative (default 0.25)."),
]

INPUT, VERDICT, DETECTORS, RUNS, SCALE = "input", "verdict", "detectors", "runs", "scale"
"""The groups of shared options: how to read the run (and where), how to judge it, which detectors, which run,
where to compute (Ray)."""


@dataclass(frozen=True)
class SharedOption:
    """One option shared by several commands: its parameter (a keyword of ``ScanOptions.of``) and group."""

    name: str
    group: str
    annotation: Any
    default: Any = None


SHARED_OPTIONS: tuple[SharedOption, ...] = (
    SharedOption("weights", INPUT, WeightsOption),
    SharedOption("algo", VERDICT, AlgoOption, "auto"),
    SharedOption("fail_on", VERDICT, FailOnOption),
    SharedOption("config", DETECTORS, ConfigOption),
    SharedOption("only", DETECTORS, OnlyOption),
    SharedOption("ignore", DETECTORS, IgnoreOption),
    SharedOption("device", INPUT, DeviceOption, "auto"),
    SharedOption("ray", SCALE, RayOption),
    SharedOption("step_col", INPUT, StepColOption),
    SharedOption("group_col", INPUT, GroupColOption),
    SharedOption("reward_cols", INPUT, RewardColsOption),
    SharedOption("group_size", INPUT, GroupSizeOption),
    SharedOption("run_name", RUNS, RunOption),
)
"""Every shared option, declared once, in the order ``--help`` lists them."""


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
    """A progress bar on stderr that appears only on a terminal and only after ``delay`` seconds.

    Used as a context manager around the call it reports on; leaving it removes the bar.
    """

    def __init__(self, description: str, *, delay: float = 1.0) -> None:
        self._description = description
        self._delay = delay
        self._started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        self._enabled = sys.stderr.isatty() and not os.environ.get("CI")
        self._lock = threading.Lock()  # the runs of a sweep report from several threads

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        with self._lock:
            self._update(done, total)

    def _update(self, done: int, total: int) -> None:
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

    def __enter__(self) -> DelayedProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _scan_options(values: Mapping[str, Any]) -> ScanOptions:
    """The shared options as the command line gave them (text) -> :class:`ScanOptions` (parsed by the library)."""
    from collapse_doctor.core.options import split_list
    from collapse_doctor.core.schema import parse_weights

    parsed = dict(values)
    for key in ("reward_cols", "only", "ignore"):
        if key in parsed:
            parsed[key] = split_list(parsed[key])
    if "weights" in parsed:
        parsed["weights"] = parse_weights(parsed["weights"]) or None
    return ScanOptions.of(**parsed)


def shared_options(*groups: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add the :data:`SHARED_OPTIONS` of ``groups`` and ``--debug`` to a command; it gets one ``options``.

    The decorated command declares a keyword-only ``options: ScanOptions`` parameter: the group's options
    take its place in the command's signature (so in its ``--help``), ``--debug`` comes last. The command runs
    inside :func:`user_errors`, parsing the options included, so a bad value is one line and exit code 2.
    """
    declared = [option for option in SHARED_OPTIONS if option.group in groups]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command).parameters.values()
        ]
        at = [p.name for p in own].index("options")
        shared = [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation, default=o.default)
            for o in declared
        ]
        debug = inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, annotation=DebugOption, default=False)
        parameters = [*own[:at], *shared, *own[at + 1 :], debug]

        @functools.wraps(command)
        def run(**values: Any) -> None:
            with user_errors(values.pop("debug")):
                options = _scan_options({o.name: values.pop(o.name) for o in declared})
                command(**values, options=options)

        run.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        return run

    return decorate


def _color() -> bool | None:
    """``False`` with ``NO_COLOR`` set (plain text), else ``None`` (colour on a terminal only)."""
    return False if os.environ.get("NO_COLOR") else None


def _step_summary() -> Path | None:
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(summary) if summary else None


def _render_text(diagnosis: Diagnosis) -> None:
    """Print a diagnosis for the terminal: plain text when NO_COLOR is set or stdout is not a terminal."""
    from collapse_doctor.report.text import render_text

    plain = _color() is False or not sys.stdout.isatty()
    render_text(diagnosis, sys.stdout, color=False if plain else None)


def _scan(
    paths: list[str], options: ScanOptions, request: OutputRequest, *, stdout: IO[str] | None
) -> tuple[int, list[ScanResult]]:
    """Discover once, check the outputs, scan every run, write the outputs: the exit code and the results."""
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.pipeline.scan import RunsFailed, ScanHooks, plan_scan, run_scan
    from collapse_doctor.report.outputs import write_outputs

    plan = plan_scan(paths, options)
    request.check(plan.files, runs=[run.name for run in plan.runs])
    failures: list[tuple[str, CollapseDoctorError]] = []
    with DelayedProgress("scanning") as progress:
        try:
            results = run_scan(plan, ScanHooks(on_progress=progress, collector=request.collector()))
        except RunsFailed as exc:  # the other runs' outputs are written, then the failures, exit 2
            if not exc.results:
                raise
            results, failures = exc.results, exc.failures
    code = write_outputs(results, request, stdout=stdout, failures=[(n, e.one_line()) for n, e in failures])
    for name, error in failures:
        _err(f"error: run {printable(name)}: {error.one_line()}")
    return code, results


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
@shared_options(INPUT, SCALE)
def advantages(
    paths: RunPathsArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Output Parquet file.")],
    convention: Annotated[str, typer.Option("--convention", help="trl, verl or paper.")] = "trl",
    scale: Annotated[
        str | None,
        typer.Option("--scale", help="GRPO scaling: group, batch or none (default: what the logged advantages match)."),
    ] = None,
    *,
    options: ScanOptions,
) -> None:
    """Recompute GRPO and GDPO advantages of every rollout and write them to a Parquet file.

    The output has the input rows in input order: step, group_id, any prompt/completion/advantage
    columns, reward/<channel>, adv/grpo, adv/gdpo and adv/<channel> (per-channel group z-scores).
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
    from collapse_doctor.io.storage.atomic import is_stdout

    for warning in summary.warnings:
        _err(f"warning: {printable(warning)}")
    channels = ", ".join(f"{printable(c)} (w={summary.weights[c]:g})" for c in summary.channels)
    # With `-o -` the Parquet file is on stdout: the summary goes to stderr.
    typer.echo(
        f"wrote {printable(summary.output)}: {summary.rows:,} rows, {summary.steps:,} steps; channels {channels}; "
        f"convention {summary.convention}, scale {summary.scale} ({printable(summary.scale_source)}), "
        f"device {summary.device}, {summary.seconds:.1f} s",
        err=is_stdout(output),
    )


@app.command()
@shared_options(INPUT, VERDICT, DETECTORS, RUNS, SCALE)
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
        str, typer.Option("--format", help="stdout format: text, json or github (workflow annotations).")
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
    """
    from collapse_doctor.report.outputs import OutputRequest

    request = OutputRequest(
        format=output_format,
        json=json_out,
        junit=junit_out,
        markdown=markdown_out,
        html=html_out,
        step_summary=_step_summary(),
        color=_color(),
        summary_only=summary_only,
    )
    if baseline is None:
        if zero_adv_margin is not None or rel_gain_margin is not None:
            from collapse_doctor.core.errors import UsageError

            raise UsageError("--zero-adv-margin and --rel-gain-margin need --baseline", hint="scan RUN --baseline GOOD")
        code, results = _scan(paths, options, request, stdout=sys.stdout)
        _report_written(request, results)
        raise typer.Exit(code)
    from collapse_doctor.pipeline.compare import check_margin, load_runs

    check_margin(zero_adv_margin, "--zero-adv-margin")
    check_margin(rel_gain_margin, "--rel-gain-margin")
    # The baseline first: a bad baseline fails before the run is scanned.
    # Its files are inputs too: no output of the scan may overwrite them.
    base_args, base_results = load_runs([baseline], options.with_(run_name=None), minimum=1, outputs=request.files())
    _, results = _scan(paths, options, request, stdout=sys.stdout)
    _report_written(request, results)
    code = _gate_runs(
        base_args[0].label,
        base_results[0].diagnosis,
        results,
        zero_adv_margin,
        rel_gain_margin,
        to_stderr=output_format != "text",
    )
    raise typer.Exit(code)


def _gate_runs(
    baseline_label: str,
    baseline: Diagnosis,
    results: list[ScanResult],
    zero_adv_margin: float | None,
    rel_gain_margin: float | None,
    *,
    to_stderr: bool,
) -> int:
    """Judge every scanned run against the baseline, print each gate, return the exit code (1: a regression)."""
    from collapse_doctor.pipeline.compare import ComparedRun, GateSettings, regression_gate
    from collapse_doctor.report.compare_text import render_gate

    config = results[0].diagnosis.config
    settings = GateSettings.resolve(
        config.gate, fail_on=config.fail_on, zero_advantage_margin=zero_adv_margin, rel_gain_margin=rel_gain_margin
    )
    out = sys.stderr if to_stderr else sys.stdout
    plain = _color() is False or not out.isatty()
    code = EXIT_OK
    for result in results:
        diagnosis = result.diagnosis
        label = diagnosis.run.name or describe_run(diagnosis)
        gate = regression_gate(ComparedRun(baseline_label, baseline), ComparedRun(label, diagnosis), settings)
        out.write("\n")
        render_gate(gate, out, color=False if plain else None)
        code = max(code, gate.exit_code)
    return code


def describe_run(diagnosis: Diagnosis) -> str:
    from collapse_doctor.report.ci import describe_sources

    return describe_sources(diagnosis.run.sources)


def _report_written(request: OutputRequest, results: list[ScanResult]) -> None:
    """One ``wrote PATH (SIZE): WHAT`` line on stderr per file written (stdout stays the scan's own output)."""
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.report.outputs import written_files

    for what, path in written_files(request, results):
        try:
            size = f" ({_size(path.stat().st_size)})" if path.is_file() else ""
        except OSError:
            size = ""
        _err(f"wrote {printable(path)}{size}: {what}")


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


@app.command()
@shared_options(INPUT, VERDICT, DETECTORS, RUNS, SCALE)
def report(
    paths: RunPathsArgument,
    html_out: Annotated[Path, typer.Option("--html", help="Write the self-contained HTML report to this file.")],
    *,
    options: ScanOptions,
) -> None:
    """Scan a run and write one self-contained, offline, interactive HTML report (plotly).

    Same input and detector options as scan, and the same exit codes: 0 nothing at or above
    --fail-on, 1 findings at or above it, 2 bad input or usage.
    """
    from collapse_doctor.core.findings import VERDICTS, worst_verdict
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.io.storage.atomic import is_stdout
    from collapse_doctor.report.outputs import OutputRequest, written_files

    request = OutputRequest(html=html_out)
    code, results = _scan(paths, options, request, stdout=None)
    to_stdout = is_stdout(html_out)  # the report is on stdout: the summary goes to stderr
    size = "" if to_stdout else f" ({html_out.stat().st_size / 1e6:.1f} MB)"
    if len(results) > 1:
        for what, path in written_files(request, results)[1:]:
            typer.echo(f"wrote {printable(path)}: {what}")
    for result in results:
        diagnosis = result.diagnosis
        for warning in diagnosis.run.warnings:
            _err(f"warning: {printable(warning)}")
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


@app.command()
@shared_options(INPUT, VERDICT, DETECTORS, SCALE)
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
    output_format: Annotated[str, typer.Option("--format", help="stdout format: text or json.")] = "text",
    align: Annotated[
        str, typer.Option("--align", help="Align the runs by step (default) or by fraction of training.")
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
    """
    from collapse_doctor.core.errors import UsageError
    from collapse_doctor.pipeline.compare import GateSettings, check_margin, compare_runs

    if output_format not in ("text", "json"):
        raise UsageError(f"--format {output_format!r} is not one of text, json")
    if not gate and (zero_adv_margin is not None or rel_gain_margin is not None):
        raise UsageError("--zero-adv-margin and --rel-gain-margin need --gate", hint="compare GOOD NEW --gate")
    check_margin(zero_adv_margin, "--zero-adv-margin")
    check_margin(rel_gain_margin, "--rel-gain-margin")

    def settings(config: Any) -> GateSettings | None:
        if not gate:
            return None
        return GateSettings.resolve(
            config.gate, fail_on=config.fail_on, zero_advantage_margin=zero_adv_margin, rel_gain_margin=rel_gain_margin
        )

    outputs = {"--json": json_out, "--html": html_out}
    with DelayedProgress("scanning") as progress:
        comparison, inputs = compare_runs(
            runs, options, align=align, gate=settings, outputs=outputs, on_progress=progress
        )
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.io.storage.atomic import atomic_path, is_stdout
    from collapse_doctor.report.compare_text import render_comparison
    from collapse_doctor.report.html.compare_html import write_comparison_html

    text = comparison.to_json() + "\n"
    if json_out is not None and not is_stdout(json_out):
        with atomic_path(json_out, inputs=inputs) as tmp:
            tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
        _err(f"wrote {printable(json_out)}: comparison JSON of {len(comparison.runs)} runs")
    if html_out is not None:
        write_comparison_html(html_out, comparison, inputs=inputs)
        if not is_stdout(html_out):
            _err(f"wrote {printable(html_out)}: comparison HTML of {len(comparison.runs)} runs")
    if output_format == "json" or (json_out is not None and is_stdout(json_out)):
        sys.stdout.write(text)
    elif html_out is None or not is_stdout(html_out):
        plain = _color() is False or not sys.stdout.isatty()
        render_comparison(comparison, sys.stdout, color=False if plain else None)
    sys.stdout.flush()
    raise typer.Exit(max((g.exit_code for g in comparison.gates), default=EXIT_OK))


@app.command()
@shared_options(INPUT, DETECTORS, RUNS)
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
    """
    from collapse_doctor.pipeline.watch import MIN_INTERVAL, WatchState, finding_line
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
            on_note=_err,
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


@app.command()
def explain(
    code: Annotated[
        str | None,
        typer.Argument(metavar="CODE", help="Detector code, e.g. CD101, or a prefix such as CD1 (omit to list all)."),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """What a detector checks, why it matters, its evidence and the remedy."""
    with user_errors(debug):
        from collapse_doctor.judge.detectors import REGISTRY

        if code is None:
            for known in sorted(REGISTRY):
                detector = REGISTRY[known]
                summary = detector.explain().splitlines()[0]
                named = f" ({detector.name})."  # the name column already says it
                if summary.endswith(named):
                    summary = summary[: -len(named)] + "."
                typer.echo(f"{known}  {detector.name:26s} {summary}")
            return
        from collapse_doctor.judge.detectors.base import codes_matching

        # The codes and prefixes --only takes (CD101, CD1, CD1XX); a bare "X" names no code here.
        matched = codes_matching(code) if code.strip().upper().rstrip("X") else []
        if not matched:
            from collapse_doctor.core.errors import UsageError

            raise UsageError(f"unknown detector code {code!r}", hint=f"known codes: {', '.join(sorted(REGISTRY))}")
        for i, key in enumerate(matched):
            detector = REGISTRY[key]
            if i:
                typer.echo("\n" + "-" * 72 + "\n")
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
    scenario: Annotated[str, typer.Argument(help="Scenario name (listed above).")],
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
        from collapse_doctor.io.storage.atomic import is_stdout

        typer.echo(
            f"wrote {summary.path}: scenario {scenario}, {summary.rows:,} rows, {summary.steps} steps, "
            f"channels {', '.join(summary.channels)}; ground truth: "
            + (f"onset step {onset}" if onset is not None else "no onset (healthy)")
            + f", affected {affected}; "
            f"{time.perf_counter() - started:.1f} s",
            err=is_stdout(output),  # with `-o -` the Parquet file is on stdout
        )


@app.command()
def retrain(
    algo: Annotated[
        str | None, typer.Option("--algo", help="grpo, gdpo or gdpo-dynamic (default: config reward_mode, else gdpo).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Local model directory or hub id.")] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", help="JSONL or Parquet prompts (a 'prompt' column).")
    ] = None,
    reward: Annotated[
        list[str] | None,
        typer.Option("--reward", help="Reward channel name=module:function (repeat per channel)."),
    ] = None,
    weights: WeightsOption = None,
    config: Annotated[Path | None, typer.Option("--config", help="Training settings (JSON or TOML).")] = None,
    from_scan: Annotated[
        Path | None, typer.Option("--from-scan", help="Apply the remedies of a `scan --json` result.")
    ] = None,
    from_scan_run: Annotated[
        str | None,
        typer.Option("--from-scan-run", help="With a scan of several runs: the run (source or directory name) to use."),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Where checkpoints, rollouts and TensorBoard go.")
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1, help="Training steps.")] = None,
    scale: Annotated[str, typer.Option("--scale", help="grpo scale_rewards: group, batch or none.")] = "group",
    max_completion_length: Annotated[
        int | None, typer.Option("--max-completion-length", min=1, help="Tokens per completion.")
    ] = None,
    save_steps: Annotated[int, typer.Option("--save-steps", min=1, help="Checkpoint every N steps.")] = 50,
    write_every: Annotated[
        int, typer.Option("--write-every", min=1, help="Write a rollout Parquet file every N steps.")
    ] = 10,
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="Stop (checkpoint, exit 1) at a finding at or above: info, warning, critical."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in --output-dir.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and the resolved TRL GRPOConfig; train nothing.")
    ] = False,
    demo: Annotated[bool, typer.Option("--demo", help="Built-in tiny model and task (CPU, no download).")] = False,
    demo_task: Annotated[
        str, typer.Option("--demo-task", help="With --demo: copy (digit copying, default) or sums.")
    ] = "copy",
    debug: DebugOption = False,
) -> None:
    """Corrective fine-tune on TRL's GRPOTrainer (grpo, gdpo, gdpo-dynamic), monitored by the doctor.

    Writes OUTPUT/rollouts/*.parquet (scan them any time) and OUTPUT/tensorboard; scans the run at the end.
    Exit codes: 0 done, 1 --fail-on findings, 2 usage or input error, 130 interrupted (resume with --resume).
    """
    with user_errors(debug):
        from collapse_doctor.core.schema import parse_weights
        from collapse_doctor.retrain.plan import RetrainOptions

        if fail_on is not None:
            from collapse_doctor.core.config import check_fail_on

            fail_on = check_fail_on(fail_on)
            fail_on = None if fail_on == "never" else fail_on
        options = RetrainOptions(
            output_dir=output_dir or Path("runs") / (algo or "retrain"),
            algo=algo,
            model=model,
            dataset=dataset,
            rewards=tuple(reward or ()),
            weights=parse_weights(weights),
            config=config,
            from_scan=from_scan,
            from_scan_run=from_scan_run,
            max_steps=max_steps,
            resume=resume,
            demo=demo,
            demo_task=demo_task,
            fail_on=fail_on,
            scale=scale,
            max_completion_length=max_completion_length,
            save_steps=save_steps,
            write_every=write_every,
            seed=seed,
        )
        from collapse_doctor.retrain.run import plan_retrain, run_retrain

        plan, differences = plan_retrain(options)
        for line in plan.describe():
            typer.echo(line)
        if dry_run:
            import json

            typer.echo("GRPOConfig (values that differ from TRL's defaults):")
            typer.echo(json.dumps(differences, indent=2, default=str))
            return
        result = run_retrain(options)
        seconds = f"{result.seconds:.0f} s"
        typer.echo(f"trained {result.steps} steps in {seconds}; rollouts in {result.rollouts_dir}")
        if result.stop_reason:
            typer.echo(f"stopped: {result.stop_reason}")
            for finding in result.fail_on_findings:
                typer.echo(f"  {finding}")
        if result.interrupted:
            typer.echo(
                f"a checkpoint was saved; continue with: collapse-doctor retrain ... --resume "
                f"--output-dir {result.output_dir}"
            )
        if result.diagnosis is not None:
            _render_text(result.diagnosis)
        code = result.exit_code()
    raise typer.Exit(code)


def _is_a(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is a click exception called ``name``: Typer may use its own copy of click's classes."""
    return any(cls.__name__ == name for cls in type(exc).__mro__)


EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit code after SIGTERM (143), as a shell reports a process the signal ended."""


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM: unwinds like Ctrl-C, so every output's temp file is removed."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(EXIT_TERMINATED)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the app runs, SIGTERM raises :class:`Terminated` (the previous handler is restored after)."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> None:
    """Run the app and exit with its code; usage errors become one line, like every other error.

    Click's own report of a usage error is a usage line, a hint line and the error; here it is
    ``error: <what>. Hint: see `collapse-doctor COMMAND --help``` and exit code 2. SIGTERM unwinds like
    Ctrl-C (temp files removed) and exits 143.
    """
    try:
        with _sigterm_unwinds():
            from collapse_doctor.engine.cluster import normalise_ray_flag

            args = normalise_ray_flag(sys.argv[1:] if argv is None else argv)
            code = app(args=args, prog_name="collapse-doctor", standalone_mode=False)
    except Terminated:
        _err("terminated (SIGTERM)")
        sys.exit(EXIT_TERMINATED)
    except BrokenPipeError:
        # The reader went away (`collapse-doctor explain | head`): stop quietly, like other CLI tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_OK)
    except Exception as exc:
        if _is_a(exc, "NoArgsIsHelpError"):  # a bare command: its help, as before
            exc.show()  # type: ignore[attr-defined]
            sys.exit(EXIT_ERROR)
        if _is_a(exc, "UsageError"):
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else app.info.name
            _err(f"error: {exc.format_message().rstrip('.')}. Hint: see `{where} --help`")  # type: ignore[attr-defined]
            sys.exit(EXIT_ERROR)
        if _is_a(exc, "ClickException"):
            _err(f"error: {exc.format_message()}")  # type: ignore[attr-defined]
            sys.exit(getattr(exc, "exit_code", EXIT_ERROR))
        if _is_a(exc, "Abort"):  # Ctrl-C outside a command's own handling
            _err("aborted")
            sys.exit(130)
        raise
    sys.exit(code if isinstance(code, int) else EXIT_OK)


FULL_TEARDOWN_COMMANDS = frozenset({"retrain"})
"""Commands whose libraries (TRL, accelerate, TensorBoard writers) may still flush things at exit."""


def run(argv: list[str] | None = None) -> None:
    """The ``collapse-doctor`` executable: :func:`main`, then a fast exit.

    Once torch is imported, the interpreter's normal teardown takes about half a second (longer than a
    whole scan of a small run). Outputs are written and closed by then, so the process flushes its
    streams and leaves with ``os._exit``; commands in :data:`FULL_TEARDOWN_COMMANDS` exit normally.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        main(args)
        code = EXIT_OK
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
        if not isinstance(exc.code, int | None):
            _err(str(exc.code))
    if "torch" not in sys.modules or FULL_TEARDOWN_COMMANDS.intersection(args):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
