"""What the command modules share: exit codes, library errors as one line, the terminal settings (``-q``, ``-v``,
``--color``) and the lines said on stderr, the progress bar, and the scan-and-write that ``scan`` and ``report``
both run.

Streams: a command's results go to stdout; everything else (warnings, progress, ``wrote PATH`` lines, notes) goes
to stderr (:func:`note`, :func:`warn`, :func:`wrote`), errors included (:func:`err`)."""

from __future__ import annotations

import contextvars
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import typer

from collapse_doctor.core.errors import CollapseDoctorError

if TYPE_CHECKING:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.pipeline.compare import GateResult
    from collapse_doctor.pipeline.scan import ScanResult
    from collapse_doctor.report.outputs import OutputRequest

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit code after SIGTERM (143), as a shell reports a process the signal ended."""
EXIT_INTERRUPTED = 128 + signal.SIGINT
"""The exit code after Ctrl-C (130), except ``watch``'s (0: Ctrl-C is how a watch ends)."""
INTERRUPTED = threading.Event()
"""Set by the app's Ctrl-C handler: an error raised after it is the interrupt's doing (an import it cut short leaves
a module half initialised, and the next use of it fails), so :func:`user_errors` reports the interrupt instead."""


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM: unwinds like Ctrl-C, so every output's temp file is removed."""


def err(message: str) -> None:
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
        err(f"error: {exc.one_line()}")
        raise typer.Exit(EXIT_ERROR) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:
        if INTERRUPTED.is_set() and not debug:
            raise KeyboardInterrupt from exc  # exit 130 with its one line, not an internal error
        if debug:
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        err(f"error: internal error: {type(exc).__name__}: {detail} (rerun with --debug for the traceback)")
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
        self._enabled = sys.stderr.isatty() and not os.environ.get("CI") and not terminal().quiet
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


COLOR_CHOICES = ("auto", "always", "never")
"""``--color``: ``auto`` (a terminal, unless NO_COLOR; FORCE_COLOR forces it), ``always`` or ``never``."""
QUIET, NORMAL, VERBOSE = -1, 0, 1
"""Verbosity: ``-q`` (the verdict line and errors only), the default, ``-v`` (evidence and skipped checks in full)."""


@dataclass(frozen=True)
class Terminal:
    """How a command talks to the terminal: its verbosity (``-q``/``-v``) and its ``--color`` choice."""

    verbosity: int = NORMAL
    color: str = "auto"

    @property
    def quiet(self) -> bool:
        return self.verbosity <= QUIET

    @property
    def verbose(self) -> bool:
        return self.verbosity >= VERBOSE

    def color_choice(self, environ: Any = None) -> bool | None:
        """``True`` colour (even off a terminal), ``False`` plain, ``None`` colour on a terminal only.

        ``--color always|never`` beats the environment. With ``auto``: ``NO_COLOR`` (any non-empty value) means
        plain, else ``FORCE_COLOR`` (any non-empty value, force-color.org) means colour, else a terminal decides;
        NO_COLOR wins over FORCE_COLOR, as in rich and CMake.

        >>> Terminal(color="auto").color_choice({"NO_COLOR": "1", "FORCE_COLOR": "1"})
        False
        >>> Terminal(color="auto").color_choice({"FORCE_COLOR": "1"}), Terminal(color="never").color_choice({})
        (True, False)
        >>> Terminal(color="always").color_choice({"NO_COLOR": "1"}), Terminal().color_choice({"FORCE_COLOR": ""})
        (True, None)
        """
        environ = os.environ if environ is None else environ
        if self.color == "always":
            return True
        if self.color == "never" or environ.get("NO_COLOR"):
            return False
        return True if environ.get("FORCE_COLOR") else None

    def color_for(self, stream: IO[str]) -> bool | None:
        """:meth:`color_choice` for a renderer writing to ``stream``: ``auto`` is plain off a terminal."""
        choice = self.color_choice()
        if choice is None:
            isatty = getattr(stream, "isatty", None)
            return None if callable(isatty) and isatty() else False
        return choice


_TERMINAL: contextvars.ContextVar[Terminal | None] = contextvars.ContextVar("terminal", default=None)
_ROOT_TERMINAL: contextvars.ContextVar[Terminal | None] = contextvars.ContextVar("root_terminal", default=None)


def terminal() -> Terminal:
    """The running command's terminal settings (set by :func:`using_terminal`)."""
    return _TERMINAL.get() or Terminal()


def set_root_terminal(settings: Terminal) -> None:
    """What ``collapse-doctor -q|-v|--color WHEN COMMAND`` gave before the command: the command's defaults."""
    _ROOT_TERMINAL.set(settings)


def resolve_terminal(quiet: bool, verbose: bool, color: str | None) -> Terminal:
    """The command's ``-q``, ``-v`` and ``--color`` over those given before the command; bad usage is a UsageError."""
    from collapse_doctor.core.errors import UsageError

    root = _ROOT_TERMINAL.get() or Terminal()
    if quiet and verbose:
        raise UsageError("-q/--quiet and -v/--verbose cannot be used together", hint="choose one")
    if color is not None and color.strip().lower() not in COLOR_CHOICES:
        raise UsageError(f"--color {color!r} is not one of {', '.join(COLOR_CHOICES)}")
    verbosity = QUIET if quiet else VERBOSE if verbose else root.verbosity
    return Terminal(verbosity=verbosity, color=color.strip().lower() if color is not None else root.color)


@contextmanager
def using_terminal(settings: Terminal) -> Iterator[Terminal]:
    """Run a command with ``settings`` as its :func:`terminal`."""
    token = _TERMINAL.set(settings)
    try:
        yield settings
    finally:
        _TERMINAL.reset(token)


def note(message: str) -> None:
    """A line for the user that is not a result (progress, waiting, a plan): stderr, not with ``-q``."""
    if not terminal().quiet:
        err(message)


def warn(message: str) -> None:
    """``warning: MESSAGE`` on stderr (not with ``-q``)."""
    note(f"warning: {message}")


def wrote(path: object, what: str = "", size: int | None = None) -> None:
    """``wrote PATH (SIZE): WHAT`` on stderr, for every file a command writes (not with ``-q``)."""
    from collapse_doctor.core.text_safety import printable

    shown = f" ({file_size(size)})" if size is not None else ""
    note(f"wrote {printable(path)}{shown}" + (f": {what}" if what else ""))


def file_size(size: int) -> str:
    """``1.2 MB``, ``35.0 kB``.

    >>> file_size(35_000), file_size(1_234_567)
    ('35.0 kB', '1.2 MB')
    """
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def size_of(path: Any) -> int | None:
    """The size of a regular file written, else ``None`` (stdout, a device, object storage)."""
    try:
        return int(path.stat().st_size) if path.is_file() else None
    except (OSError, AttributeError):
        return None


def color() -> bool | None:
    """The running command's colour choice (:meth:`Terminal.color_choice`): ``--color``, NO_COLOR, FORCE_COLOR."""
    return terminal().color_choice()


def color_for(stream: IO[str]) -> bool | None:
    """:func:`color` for a renderer writing to ``stream``: plain text too when it is not a terminal (``auto``)."""
    return terminal().color_for(stream)


def render_text(diagnosis: Diagnosis) -> None:
    """Print a diagnosis on stdout, with the command's colour and verbosity (its warnings are said on stderr)."""
    from collapse_doctor.core.text_safety import printable
    from collapse_doctor.report.text import render_text

    for warning in diagnosis.run.warnings:
        warn(printable(warning))
    settings = terminal()
    render_text(diagnosis, sys.stdout, color=color_for(sys.stdout), verbosity=settings.verbosity, warnings=False)


def scan_and_write(
    paths: list[str],
    options: ScanOptions,
    request: OutputRequest,
    *,
    stdout: IO[str] | None,
    gate: Callable[[list[ScanResult]], list[GateResult]] | None = None,
) -> tuple[int, list[ScanResult], list[GateResult]]:
    """Discover once, check the outputs, scan every run, write the outputs: the exit code, the results and the gates
    (``scan`` and ``report``). ``gate`` judges the results against a baseline before anything is written, so every
    output carries the gate's verdict and exit code (``scan --baseline``)."""
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
    gates = gate(results) if gate is not None else []
    lines = [(n, e.one_line()) for n, e in failures]
    several = len(results) + len(failures) > 1
    for result in results:  # warnings are not results: stderr, before the report
        run = result.diagnosis.run
        for warning in run.warnings:
            warn(printable(f"run {run.name or '?'}: {warning}" if several else warning))
    code = write_outputs(results, request, stdout=stdout, failures=lines, gates=gates)
    for name, error in failures:
        err(f"error: run {printable(name)}: {error.one_line()}")
    return code, results, gates
