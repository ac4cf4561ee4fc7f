"""The options several commands share, declared once.

The options every command that reads a run shares (input columns, weights, device, detector selection,
``--run``...) are declared once, in :data:`SHARED_OPTIONS`; :func:`shared_options` adds a group of them to
a command's signature and hands the command one :class:`~collapse_doctor.core.options.ScanOptions`.

The terminal options (``-q/--quiet``, ``-v/--verbose``, ``--color``) are declared once too and added by
:func:`terminal_options` (which :func:`shared_options` applies): they may follow the command (``scan RUN -q``) or
precede it (``collapse-doctor -q scan RUN``, the app's callback), the command's own winning. An option that takes
one of a fixed set of values lists them in ``--help`` (``<auto|cpu|cuda>``) and completes them in the shell
(:func:`choice_option`); the values are checked by the library, whose errors name the option and the choices.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from collapse_doctor.cli.common import COLOR_CHOICES, Terminal, resolve_terminal, user_errors, using_terminal
from collapse_doctor.core.options import ALGORITHMS, ScanOptions

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.pipeline.compare import GateSettings


def completer(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """Shell completion of one of ``choices``: those that start with what is typed."""

    def complete(incomplete: str) -> list[str]:
        return [choice for choice in choices if choice.startswith(incomplete)]

    return complete


def choices_metavar(choices: Sequence[str]) -> str:
    """How ``--help`` shows a fixed set of values: ``<auto|cpu|cuda>``.

    >>> choices_metavar(["text", "json"])
    '<text|json>'
    """
    return f"<{'|'.join(choices)}>"


def choice_option(*names: str, choices: Sequence[str], help: str, metavar: str | None = None) -> Any:
    """A ``typer.Option`` that takes one of ``choices``: listed in ``--help``, completed in the shell.

    The value stays a string checked by the library (its error names the option and the choices, one line)."""
    return typer.Option(
        *names, metavar=metavar or choices_metavar(choices), help=help, autocompletion=completer(choices)
    )


def choice_argument(name: str, *, choices: Sequence[str], help: str) -> Any:
    """A ``typer.Argument`` that takes one of ``choices``: named in ``--help``, completed in the shell."""
    return typer.Argument(metavar=name, help=f"{help} One of: {', '.join(choices)}.", autocompletion=completer(choices))


FAIL_ON_CHOICES = ("never", "info", "warning", "critical")
SCALE_CHOICES = ("group", "batch", "none")
DEVICE_CHOICES = ("auto", "cpu", "cuda")

RunPathsArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="PATH...",
        help="Rollout files (Parquet, TRL completions, verl/NeMo-RL JSONL), log directories or globs of one run.",
    ),
]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")]
QuietOption = Annotated[bool, typer.Option("-q", "--quiet", help="Only the verdict line and errors on the terminal.")]
VerboseOption = Annotated[
    bool, typer.Option("-v", "--verbose", help="Evidence and skipped checks in full, and every note.")
]
ColorOption = Annotated[
    str | None,
    choice_option(
        "--color",
        choices=COLOR_CHOICES,
        help="Colour the text: auto (on a terminal, default; NO_COLOR turns it off, FORCE_COLOR on), always or"
        " never. It beats both variables.",
    ),
]
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
DeviceOption = Annotated[
    str,
    choice_option(
        "--device",
        choices=DEVICE_CHOICES,
        metavar="<auto|cpu|cuda[:N]>",
        help="Where to compute: auto (a GPU when there is one), cpu or cuda (cuda:N: that GPU).",
    ),
]
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
    choice_option(
        "--algo",
        choices=ALGORITHMS,
        help="Estimator the run used: auto (from the logged advantages), or one of verl's adv_estimator names.",
    ),
]
FailOnOption = Annotated[
    str | None,
    choice_option(
        "--fail-on",
        choices=FAIL_ON_CHOICES,
        help="Exit 1 on findings at or above: never, info, warning (default), critical.",
    ),
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


def shared_options(
    *groups: str, terminal: Sequence[str] = ("quiet", "verbose", "color")
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add the :data:`SHARED_OPTIONS` of ``groups`` and ``--debug`` to a command; it gets one ``options``.

    The decorated command declares a keyword-only ``options: ScanOptions`` parameter: the group's options
    take its place in the command's signature (so in its ``--help``), then the ``terminal`` options
    (:data:`TERMINAL_OPTIONS`: those that make sense for the command), ``--debug`` comes last. The command runs
    inside :func:`~collapse_doctor.cli.common.user_errors`, parsing the options included, so a bad value is one
    line and exit code 2.
    """
    declared = [option for option in SHARED_OPTIONS if option.group in groups]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = _keyword_parameters(command)
        at = [p.name for p in own].index("options")
        shared = [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation, default=o.default)
            for o in declared
        ]
        debug = inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, annotation=DebugOption, default=False)
        parameters = [*own[:at], *shared, *own[at + 1 :], *_terminal_parameters(terminal), debug]

        @functools.wraps(command)
        def run(**values: Any) -> None:
            with user_errors(values.pop("debug")):
                settings = _terminal_of(values, terminal)
                options = scan_options({o.name: values.pop(o.name) for o in declared})
                with using_terminal(settings):
                    command(**values, options=options)

        return _with_signature(run, parameters)

    return decorate


TERMINAL_OPTIONS = ("quiet", "verbose", "color")
"""The terminal options every command that prints more than its result takes (:func:`terminal_options`)."""


def _keyword_parameters(command: Callable[..., None]) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(command, include_extras=True)
    return [
        p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(command).parameters.values()
    ]


_TERMINAL_DEFAULTS: dict[str, Any] = {"quiet": False, "verbose": False, "color": None}


def _terminal_parameters(names: Sequence[str]) -> list[inspect.Parameter]:
    annotations = {"quiet": QuietOption, "verbose": VerboseOption, "color": ColorOption}
    return [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[name], default=_TERMINAL_DEFAULTS[name]
        )
        for name in TERMINAL_OPTIONS
        if name in names
    ]


def _terminal_of(values: dict[str, Any], names: Sequence[str]) -> Terminal:
    """The terminal settings of a command's ``values`` (its own ``names`` popped), over those before the command."""
    given = {name: values.pop(name) if name in names else _TERMINAL_DEFAULTS[name] for name in TERMINAL_OPTIONS}
    return resolve_terminal(given["quiet"], given["verbose"], given["color"])


def _with_signature(run: Callable[..., None], parameters: list[inspect.Parameter]) -> Callable[..., None]:
    run.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return run


def terminal_options(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add the terminal options ``names`` (of :data:`TERMINAL_OPTIONS`: ``-q/--quiet``, ``-v/--verbose``,
    ``--color``) to a command that declares ``debug`` (and no shared options), before ``--debug``: the command
    runs with them as :func:`~collapse_doctor.cli.common.terminal`; a bad value is one line and exit code 2."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = _keyword_parameters(command)
        at = [p.name for p in own].index("debug")
        parameters = [*own[:at], *_terminal_parameters(names), *own[at:]]

        @functools.wraps(command)
        def run(**values: Any) -> None:
            with user_errors(values["debug"]):
                settings = _terminal_of(values, names)
            with using_terminal(settings):
                command(**values)

        return _with_signature(run, parameters)

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
