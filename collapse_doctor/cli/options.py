"""The options several commands share, declared once.

The options every command that reads a run shares (input columns, weights, device, detector selection,
``--run``...) are declared once, in :data:`SHARED_OPTIONS`; :func:`shared_options` adds a group of them to
a command's signature and hands the command one :class:`~collapse_doctor.core.options.ScanOptions`.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from collapse_doctor.cli.common import user_errors
from collapse_doctor.core.options import ScanOptions

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.pipeline.compare import GateSettings

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
MaxCompletionLengthOption = Annotated[
    int | None,
    typer.Option(
        "--max-completion-length",
        min=1,
        metavar="TOKENS",
        help="The run's generation length cap: rows whose completion_length (tokens) reaches it were cut"
        " (without a truncated column).",
    ),
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
    typer.Option("--algo", help="Estimator the run used: auto (from logged advantages) or a verl adv_estimator name."),
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

INPUT, LENGTHS, VERDICT, DETECTORS, RUNS, SCALE = "input", "lengths", "verdict", "detectors", "runs", "scale"
"""The groups of shared options: how to read the run (and where), what its completion lengths mean (the length
cap: for the detectors, not for ``advantages``), how to judge it, which detectors, which run, where to compute
(Ray)."""


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
    SharedOption("max_completion_length", LENGTHS, MaxCompletionLengthOption),
    SharedOption("run_name", RUNS, RunOption),
)
"""Every shared option, declared once, in the order ``--help`` lists them."""


def scan_options(values: Mapping[str, Any]) -> ScanOptions:
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
    inside :func:`~collapse_doctor.cli.common.user_errors`, parsing the options included, so a bad value is one
    line and exit code 2.
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
                options = scan_options({o.name: values.pop(o.name) for o in declared})
                command(**values, options=options)

        run.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        return run

    return decorate


def check_gate_margins(
    zero_adv_margin: float | None, rel_gain_margin: float | None, *, gated: bool, needs: str, hint: str
) -> None:
    """``--zero-adv-margin`` and ``--rel-gain-margin``: only with a gate (``needs``: the option that asks for one,
    ``scan --baseline`` or ``compare --gate``), each a number from 0 to 1."""
    if not gated:
        if zero_adv_margin is not None or rel_gain_margin is not None:
            from collapse_doctor.core.errors import UsageError

            raise UsageError(f"--zero-adv-margin and --rel-gain-margin need {needs}", hint=hint)
        return
    from collapse_doctor.pipeline.compare import check_margin

    check_margin(zero_adv_margin, "--zero-adv-margin")
    check_margin(rel_gain_margin, "--rel-gain-margin")


def gate_settings(config: Config, zero_adv_margin: float | None, rel_gain_margin: float | None) -> GateSettings:
    """The gate of a run's resolved config: the command line's margins over its ``[tool.collapse-doctor.gate]``."""
    from collapse_doctor.pipeline.compare import GateSettings

    return GateSettings.resolve(
        config.gate, fail_on=config.fail_on, zero_advantage_margin=zero_adv_margin, rel_gain_margin=rel_gain_margin
    )
