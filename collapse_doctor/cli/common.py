"""What the command modules share: exit codes, library errors as one line, the progress bar, colour, and the
scan-and-write that ``scan`` and ``report`` both run."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def color() -> bool | None:
    """``False`` with ``NO_COLOR`` set (plain text), else ``None`` (colour on a terminal only)."""
    return False if os.environ.get("NO_COLOR") else None


def color_for(stream: IO[str]) -> bool | None:
    """:func:`color` for a renderer writing to ``stream``: plain text too when it is not a terminal."""
    return False if color() is False or not stream.isatty() else None


def render_text(diagnosis: Diagnosis) -> None:
    """Print a diagnosis for the terminal: plain text when NO_COLOR is set or stdout is not a terminal."""
    from collapse_doctor.report.text import render_text

    render_text(diagnosis, sys.stdout, color=color_for(sys.stdout))


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
    code = write_outputs(results, request, stdout=stdout, failures=lines, gates=gates)
    for name, error in failures:
        err(f"error: run {printable(name)}: {error.one_line()}")
    return code, results, gates
