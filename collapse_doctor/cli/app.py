"""The ``collapse-doctor`` command line: parse options, call one library function, render, exit.

Heavy modules (torch, pyarrow) are imported inside the commands so that ``--help`` stays fast.
Exit codes: 0 success, 1 findings at or above ``--fail-on`` (scan), 2 usage, input or internal error.

This module is the entry point: the Typer app, the root callback (``--version``), :func:`main` (click's usage
errors as one line, SIGTERM) and :func:`run`. Each command is a function in its own module of this package
(:mod:`~collapse_doctor.cli.scan`, :mod:`~collapse_doctor.cli.report`, ...), registered here in
:data:`COMMANDS`; the options several commands share are declared once in :mod:`~collapse_doctor.cli.options`,
what else they share is in :mod:`~collapse_doctor.cli.common`. ``scan`` and ``report`` run the same pipeline
(:func:`~collapse_doctor.cli.common.scan_and_write`) and write through the same dispatcher
(:mod:`collapse_doctor.report.outputs`).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Annotated

import typer

from collapse_doctor.cli.advantages import advantages
from collapse_doctor.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    INTERRUPTED,
    Terminal,
    Terminated,
    err,
    resolve_terminal,
    set_root_terminal,
    user_errors,
)
from collapse_doctor.cli.compare import compare
from collapse_doctor.cli.explain import explain
from collapse_doctor.cli.options import ColorOption, QuietOption, VerboseOption
from collapse_doctor.cli.report import report
from collapse_doctor.cli.retrain import retrain
from collapse_doctor.cli.scan import scan
from collapse_doctor.cli.schema import schema
from collapse_doctor.cli.simulate import simulate
from collapse_doctor.cli.startup import before_command
from collapse_doctor.cli.watch import watch
from collapse_doctor.core.version import __version__

app = typer.Typer(
    name="collapse-doctor",
    help="Find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
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

COMMANDS = (advantages, scan, report, compare, watch, explain, simulate, retrain, schema)
"""Every command (one module each), in the order ``--help`` lists them."""

for command in COMMANDS:
    app.command()(command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"collapse-doctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    color: ColorOption = None,
) -> None:
    """Find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.

    -q, -v and --color may also follow the command (collapse-doctor scan RUN -q); there they win.
    """
    set_root_terminal(Terminal())  # nothing left from an earlier invocation in this process
    with user_errors(False):
        set_root_terminal(resolve_terminal(quiet, verbose, color))


def _is_a(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is a click exception called ``name``: Typer may use its own copy of click's classes."""
    return any(cls.__name__ == name for cls in type(exc).__mro__)


SUGGESTION_CUTOFF = 0.75
"""How close an option must be to an unknown one to be suggested (click's 0.6 offers ``--verbose`` for ``--bogus``)."""


def _usage_message(exc: Exception) -> str:
    """Click's message of a usage error; an unknown option suggests only a close one (``--jsno``: ``--json``)."""
    if not _is_a(exc, "NoSuchOption"):
        return str(exc.format_message())  # type: ignore[attr-defined]
    import difflib

    name = str(getattr(exc, "option_name", ""))
    close = difflib.get_close_matches(name, list(getattr(exc, "possibilities", None) or ()), 1, SUGGESTION_CUTOFF)
    return f"No such option: {name}" + (f" (did you mean {close[0]}?)" if close else "")


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


INTERRUPT_GRACE = 5.0
"""Seconds a Ctrl-C has to unwind the command before the process ends anyway (exit 130)."""


def _end_now(code: int, message: str) -> None:
    """End the process at once: temp files of outputs removed, one line on stderr, streams flushed."""
    from collapse_doctor.io.storage.atomic import remove_temp_files

    remove_temp_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if message:
        with contextlib.suppress(OSError):
            os.write(2, f"{message}\n".encode())
    os._exit(code)


@dataclass
class _Interrupts:
    count: int = 0
    deferred: bool = False
    """An interrupt that landed in the import machinery, raised again a moment later."""


@contextmanager
def _interrupts_end_the_command() -> Iterator[_Interrupts]:
    """While the app runs, Ctrl-C unwinds the command as Python's own handler does (KeyboardInterrupt: temp files
    removed, watch's summary, exit 130 or watch's 0), and ends the process anyway when unwinding does not finish
    within :data:`INTERRUPT_GRACE` seconds or on a second Ctrl-C: an interrupt that lands in a finalizer is
    swallowed, and one that lands in an import can leave a thread of the reader waiting forever on its lock."""
    import threading

    interrupts = _Interrupts()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if not interrupts.deferred:
            interrupts.count += 1
        INTERRUPTED.set()
        if interrupts.count > 1 and not interrupts.deferred:
            _end_now(EXIT_INTERRUPTED, "interrupted (Ctrl-C, twice)")
        if not interrupts.deferred:
            watchdog = threading.Timer(INTERRUPT_GRACE, _end_now, (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"))
            watchdog.daemon = True
            watchdog.start()
        if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            # Raised here it would be swallowed ("Exception ignored in ... _get_module_lock"): raise it on the main
            # thread again in a moment, once the import machinery is left
            interrupts.deferred = True
            threading.Timer(0.05, _thread.interrupt_main).start()
            return
        interrupts.deferred = False
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield interrupts
        return
    try:
        yield interrupts
    finally:
        # After an interrupt the process is ending: another Ctrl-C (or the re-raise of a deferred one) while it
        # unwinds ends it at once, with the line already said; otherwise the caller's handler comes back
        if interrupts.count:
            signal.signal(signal.SIGINT, lambda signum, frame: _end_now(EXIT_INTERRUPTED, ""))
        else:
            signal.signal(signal.SIGINT, previous)


def main(argv: list[str] | None = None) -> None:
    """Run the app and exit with its code; usage errors become one line, like every other error.

    Click's own report of a usage error is a usage line, a hint line and the error; here it is
    ``error: <what>. Hint: see `collapse-doctor COMMAND --help``` and exit code 2. SIGTERM unwinds like
    Ctrl-C (temp files removed) and exits 143.
    """
    try:
        with _sigterm_unwinds(), _interrupts_end_the_command() as interrupts:
            from collapse_doctor.engine.cluster import normalise_ray_flag

            args = normalise_ray_flag(sys.argv[1:] if argv is None else argv)
            code = app(args=args, prog_name="collapse-doctor", standalone_mode=False)
        if code == EXIT_INTERRUPTED and interrupts.count:  # Typer turns a KeyboardInterrupt into exit 130, silently
            err("interrupted (Ctrl-C)")
    except Terminated:
        err("terminated (SIGTERM)")
        sys.exit(EXIT_TERMINATED)
    except KeyboardInterrupt:
        err("interrupted (Ctrl-C)")
        sys.exit(EXIT_INTERRUPTED)
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
            err(f"error: {_usage_message(exc).rstrip('.')}. Hint: see `{where} --help`")
            sys.exit(EXIT_ERROR)
        if _is_a(exc, "ClickException"):
            err(f"error: {exc.format_message()}")  # type: ignore[attr-defined]
            sys.exit(getattr(exc, "exit_code", EXIT_ERROR))
        if _is_a(exc, "Abort"):  # Ctrl-C outside a command's own handling (click's word for it)
            err("interrupted (Ctrl-C)")
            sys.exit(EXIT_INTERRUPTED)
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
        before_command(args)  # imports pyarrow: a Ctrl-C can land here, before main's handler is in place
    except KeyboardInterrupt:
        err("interrupted (Ctrl-C)")
        sys.exit(EXIT_INTERRUPTED)
    try:
        main(args)
        code = EXIT_OK
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
        if not isinstance(exc.code, int | None):
            err(str(exc.code))
    # The command is over and its exit code decided: a Ctrl-C during the teardown changes nothing (it would land
    # in a finalizer of the network clients and print an ignored KeyboardInterrupt).
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "torch" not in sys.modules or FULL_TEARDOWN_COMMANDS.intersection(args):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
