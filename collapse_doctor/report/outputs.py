"""Every output of a scan, for one run or several: what to write (:class:`OutputRequest`) and writing it.

``scan``, ``report`` and Python callers go through here, in this order::

    request = OutputRequest(format="text", json=Path("scan.json"), html=Path("report.html"))
    plan = plan_scan(paths, options)
    request.check(plan.files, runs=[run.name for run in plan.runs])  # before any work
    results = run_scan(plan, ScanHooks(collector=request.collector()))
    code = write_outputs(results, request, stdout=sys.stdout)

One run: its diagnosis as JSON, JUnit XML, Markdown, HTML and on stdout (text, JSON or GitHub workflow
annotations). Several runs (a log directory with one subdirectory per run): the JSON holds them side by side
under ``runs`` with the worst verdict and the combined exit code on top, the Markdown summary and the GitHub
annotations are concatenated, the terminal shows them one after another, the JUnit XML holds one
``<testsuite>`` per run in ``<testsuites>``, and ``--html OUT`` writes each run's report beside ``OUT``
(``<OUT stem>-<run>.html``) with ``OUT`` an index page that links them.

Every file is written atomically (:mod:`collapse_doctor.io.storage.atomic`) and never over an input. The library
reads no environment variable: the caller passes GitHub's step-summary file and the colour choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import worst_verdict
from collapse_doctor.core.result import JSON_FORMAT_VERSION, Diagnosis

if TYPE_CHECKING:
    from collapse_doctor.core.options import ReadOptions, ScanOptions
    from collapse_doctor.io.discovery import RunInputs
    from collapse_doctor.pipeline.compare import GateResult
    from collapse_doctor.pipeline.scan import RunCollector, ScanResult
    from collapse_doctor.report.html.collect import ReportExtras

__all__ = [
    "STDOUT_FORMATS",
    "OutputRequest",
    "make_report",
    "runs_dict",
    "runs_json",
    "write_outputs",
    "written_files",
]

STDOUT_FORMATS = ("text", "json", "github")
FILE_OUTPUTS = ("json", "junit", "markdown", "html")
"""The file outputs, in the order they are written (each is the ``--NAME`` option of ``scan``)."""


@dataclass(frozen=True)
class OutputRequest:
    """What a scan writes: the stdout format and the files asked for (``None``: not written)."""

    format: str = "text"
    """What goes to stdout: ``text`` (the terminal report), ``json`` (the diagnosis) or ``github`` (annotations)."""
    json: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None
    html: Path | None = None
    step_summary: Path | None = None
    """GitHub's job summary file (``$GITHUB_STEP_SUMMARY``, read by the caller): with ``format="github"``
    the Markdown summary is appended to it."""
    color: bool | None = None
    """Text on stdout: ``None`` colours a terminal only, ``False`` never (``NO_COLOR``, ``--color never``),
    ``True`` always (``FORCE_COLOR``, ``--color always``)."""
    summary_only: bool = False
    """Text on stdout with several runs: the one-line-per-run summary table only, not each run's detail."""
    verbosity: int = 0
    """Text on stdout: ``-1`` each run's verdict line only (``-q``), ``0`` the report, ``1`` with evidence and
    skipped checks in full (``-v``)."""
    warnings: bool = True
    """Text on stdout: the run card lists the run's warnings (the CLI says them on stderr instead)."""

    def __post_init__(self) -> None:
        if self.format not in STDOUT_FORMATS:
            raise UsageError(f"--format {self.format!r} is not one of {', '.join(STDOUT_FORMATS)}")
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in (*FILE_OUTPUTS, "step_summary") and value is not None and not isinstance(value, Path):
                object.__setattr__(self, spec.name, Path(value))

    def files(self) -> dict[str, Path]:
        """``{"--json": path, ...}``: the files asked for, in the order they are written."""
        return {f"--{name}": path for name in FILE_OUTPUTS if (path := getattr(self, name)) is not None}

    def check(self, inputs: Sequence[Path], *, runs: Sequence[str] = ()) -> None:
        """Fail before any work when an output cannot be written.

        An output must not be one of ``inputs`` (the files the scan reads: ``ScanPlan.files``), its directory
        must exist and it must not be a directory. ``runs`` are the names of the runs to scan: with more than
        one, the per-run report pages beside ``--html`` are checked too.

        >>> from collapse_doctor.core.errors import OutputError
        >>> try:
        ...     OutputRequest(json=Path("run.parquet")).check([Path("run.parquet")])
        ... except OutputError as exc:
        ...     print(exc.one_line())
        run.parquet: refusing to overwrite an input file. Hint: choose another path for --json
        """
        from collapse_doctor.io.storage.atomic import check_outputs

        files: list[tuple[str, Path | None]] = list(self.files().items())
        if self.html is not None and len(runs) > 1:
            from collapse_doctor.report.html.page import run_report_paths

            files += [("--html", page) for page in run_report_paths(self.html, runs)]
        check_outputs(files, inputs)

    def collector(self) -> Callable[[RunInputs, ReadOptions], RunCollector] | None:
        """The per-run collector the outputs need (the HTML report's), for ``ScanHooks(collector=...)``."""
        if self.html is None:
            return None
        from collapse_doctor.report.html.collect import ReportCollector

        return ReportCollector


def _refuse_shared_paths(request: OutputRequest) -> None:
    """Two outputs on one path (after resolving symlinks; ``-`` twice is standard output twice) are refused."""
    from collapse_doctor.io.storage.atomic import refuse_shared_paths

    refuse_shared_paths(request.files().items())


Failure = tuple[str, str]
"""A run of several that could not be scanned: ``(run name, one-line error)``."""
EXIT_ERROR = 2


def runs_dict(
    diagnoses: Sequence[Diagnosis], *, include_series: bool = True, failures: Sequence[Failure] = ()
) -> dict[str, Any]:
    """``{"format_version", "verdict" (worst), "fail_on", "exit_code" (max), "runs": [diagnosis, ...]}``, and
    ``"failed_runs": [{"run", "error"}, ...]`` when some runs could not be scanned (exit code 2)."""
    out = {
        "format_version": JSON_FORMAT_VERSION,
        "verdict": worst_verdict(d.verdict for d in diagnoses),
        "fail_on": diagnoses[0].config.fail_on,
        "exit_code": exit_code(diagnoses, failures),
        "runs": [d.to_dict(include_series=include_series) for d in diagnoses],
    }
    if failures:
        out["failed_runs"] = [{"run": name, "error": error} for name, error in failures]
    return out


def runs_json(diagnoses: Sequence[Diagnosis], *, indent: int | None = 2, failures: Sequence[Failure] = ()) -> str:
    from collapse_doctor.core.json_text import dumps

    return dumps(runs_dict(diagnoses, failures=failures), indent=indent)


def exit_code(diagnoses: Sequence[Diagnosis], failures: Sequence[Failure] = ()) -> int:
    """The exit code of a scan: the worst of its runs' (1 when one has a finding at or above its fail-on), 2 when
    a run could not be scanned."""
    return EXIT_ERROR if failures else max((d.exit_code() for d in diagnoses), default=0)


def json_text(
    diagnoses: Sequence[Diagnosis], failures: Sequence[Failure] = (), gates: Sequence[GateResult] = ()
) -> str:
    """One run's diagnosis, or the ``runs`` document of several (:func:`runs_dict`); with ``gates`` (``scan
    --baseline``) also ``gates``, and the document's ``exit_code`` is theirs (:func:`gated_exit_code`)."""
    if not gates:
        if len(diagnoses) == 1 and not failures:
            return diagnoses[0].to_json()
        return runs_json(diagnoses, failures=failures)
    from collapse_doctor.core.json_text import dumps

    one = len(diagnoses) == 1 and not failures
    document = diagnoses[0].to_dict() if one else runs_dict(diagnoses, failures=failures)
    document["exit_code"] = gated_exit_code(gates, failures)
    document["gates"] = [gate.to_dict() for gate in gates]
    return dumps(document)


def gated_exit_code(gates: Sequence[GateResult], failures: Sequence[Failure] = ()) -> int:
    """The exit code of ``scan --baseline``: 1 when a run regressed against the baseline, 2 when a run could not be
    scanned (the scan's own ``--fail-on`` does not decide it: the baseline does)."""
    return EXIT_ERROR if failures else max((gate.exit_code for gate in gates), default=0)


def markdown_text(diagnoses: Sequence[Diagnosis], gates: Sequence[GateResult] = ()) -> str:
    """The Markdown summary of each run, one after another; with ``gates`` (``scan --baseline``, one per run) each
    run's summary opens with the gate's conclusion and ends with its criteria (:func:`~collapse_doctor.report.ci.
    markdown_gate`), and the gate decides the outcome it states."""
    from collapse_doctor.report.ci import markdown_summary

    gated: list[GateResult | None] = list(gates) if gates else [None] * len(diagnoses)
    return "\n".join(markdown_summary(d, gate) for d, gate in zip(diagnoses, gated, strict=True))


def written_files(request: OutputRequest, results: Sequence[ScanResult]) -> list[tuple[str, Path]]:
    """``(what, path)`` of every file :func:`write_outputs` wrote for ``request`` (standard output excluded), for
    the "wrote ..." lines."""
    from collapse_doctor.io.storage.atomic import is_stdout

    out: list[tuple[str, Path]] = []
    names = [r.diagnosis.run.name or "?" for r in results]
    for option, path in request.files().items():
        if is_stdout(path):
            continue
        if option == "--html" and len(results) > 1:
            from collapse_doctor.report.html.page import run_report_paths

            out.append((f"HTML index of {len(results)} runs", path))
            pages = run_report_paths(path, names)
            out += [(f"HTML report of run {name}", page) for name, page in zip(names, pages, strict=True)]
            continue
        what = {"--json": "JSON", "--junit": "JUnit XML", "--markdown": "Markdown summary", "--html": "HTML report"}
        out.append((what[option] + (f" of {len(results)} runs" if len(results) > 1 else ""), path))
    return out


def write_outputs(
    results: Sequence[ScanResult],
    request: OutputRequest,
    *,
    stdout: IO[str] | None,
    failures: Sequence[Failure] = (),
    gates: Sequence[GateResult] = (),
) -> int:
    """Write every file of ``request`` and render its stdout format on ``stdout``; returns the exit code.

    ``failures``: runs of the same scan that could not be scanned; the outputs are those of several runs, they
    name each failure (JSON ``failed_runs``, a JUnit error, a summary row) and the exit code is 2.
    ``gates``: the runs judged against a baseline (``scan --baseline``): the JSON carries them and their exit code,
    the JUnit their criteria as the testcases that fail, and the exit code is theirs.

    ``stdout=None`` renders nothing (``collapse-doctor report`` prints its own line). Files come first, in the
    order of :data:`FILE_OUTPUTS`; nothing is written when several runs meet an output that describes one.
    The HTML report uses what the run's collector finished with (``ScanResult.extra``), when it is the
    report's (:meth:`OutputRequest.collector`).
    """
    if not results:
        raise ValueError("write_outputs needs the result of at least one run")
    diagnoses = [r.diagnosis for r in results]
    several = len(diagnoses) + len(failures) > 1
    _refuse_shared_paths(request)
    inputs = _inputs(results)
    if request.json is not None:
        _write_text(request.json, json_text(diagnoses, failures, gates) + "\n", inputs)
    if request.junit is not None:
        from collapse_doctor.report.ci import junit_runs_xml, junit_xml

        xml = (
            junit_runs_xml(diagnoses, failures, gates)
            if several
            else junit_xml(diagnoses[0], gates[0] if gates else None)
        )
        _write_text(request.junit, xml, inputs)
    if request.markdown is not None:
        _write_text(request.markdown, markdown_text(diagnoses, gates), inputs)
    if request.html is not None:
        from collapse_doctor.report.html.collect import ReportExtras
        from collapse_doctor.report.html.page import write_report

        def extras(result: ScanResult) -> ReportExtras | None:
            return result.extra if isinstance(result.extra, ReportExtras) else None

        if len(results) == 1:
            write_report(request.html, diagnoses[0], extras(results[0]), inputs=inputs)
        else:
            from collapse_doctor.report.html.page import build_index, run_report_paths

            pages = run_report_paths(request.html, [d.run.name or "?" for d in diagnoses])
            for result, page in zip(results, pages, strict=True):
                write_report(page, result.diagnosis, extras(result), inputs=inputs)
            _write_text(request.html, build_index(diagnoses, pages), inputs)
    if stdout is not None:
        try:
            _render_stdout(diagnoses, request, stdout, failures, gates)
        except BrokenPipeError:  # the reader went away (`scan RUN | head`): the scan's exit code stands
            import os

            devnull = os.open(os.devnull, os.O_WRONLY)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(devnull, stdout.fileno())  # Python's own flush at exit must not fail again
    return gated_exit_code(gates, failures) if gates else exit_code(diagnoses, failures)


def _inputs(results: Sequence[ScanResult]) -> list[Path]:
    """Every file the scan read (the runs' inputs and the sources their summaries name): never overwritten."""
    from collapse_doctor.io.storage.remote import input_path

    seen: dict[Path, None] = {}
    for result in results:
        # Sources may be object storage URLs: RemotePaths, which no local output can be.
        for path in [*result.inputs.files, *(input_path(s) for s in result.diagnosis.run.sources)]:
            seen.setdefault(path, None)
    return list(seen)


def _write_text(path: Path, text: str, inputs: Sequence[Path]) -> None:
    from collapse_doctor.io.storage.atomic import atomic_path

    with atomic_path(path, inputs=inputs) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")  # undecodable file names stay visible


def _render_stdout(
    diagnoses: Sequence[Diagnosis],
    request: OutputRequest,
    stdout: IO[str],
    failures: Sequence[Failure],
    gates: Sequence[GateResult],
) -> None:
    if request.format == "json":
        from collapse_doctor.io.storage.atomic import is_stdout

        if request.json is None or not is_stdout(request.json):  # `--json -` wrote the same document there already
            stdout.write(json_text(diagnoses, failures, gates) + "\n")
    elif request.format == "github":
        from collapse_doctor.report.ci import github_annotations

        stdout.write("".join(github_annotations(d) for d in diagnoses))
        if request.step_summary is not None:
            with open(request.step_summary, "a", encoding="utf-8") as handle:
                handle.write(markdown_text(diagnoses, gates))
    else:
        from collapse_doctor.report.text import QUIET, render_text

        several = len(diagnoses) + len(failures) > 1
        if several and request.verbosity > QUIET:
            from collapse_doctor.report.text import render_summary

            render_summary(diagnoses, stdout, color=request.color, failures=failures)
            if request.summary_only:
                stdout.flush()
                return
            stdout.write("\n")
        for i, diagnosis in enumerate(diagnoses):
            if i and request.verbosity > QUIET:
                stdout.write("\n")
            render_text(
                diagnosis,
                stdout,
                color=request.color,
                json_written=request.json is not None,
                verbosity=request.verbosity,
                warnings=request.warnings,
                named=several and request.verbosity <= QUIET,
            )
    stdout.flush()


def make_report(
    paths: Sequence[str | Path], output: str | Path, options: ScanOptions | None = None
) -> tuple[Diagnosis, ReportExtras, int]:
    """Scan the run under ``paths`` and write its report: what ``collapse-doctor report --html`` does.

    ``options`` as for :func:`~collapse_doctor.pipeline.scan.plan_scan` (several runs under ``paths`` need
    ``run_name``). Returns the diagnosis, what was gathered for the report, and the size of the file written.
    """
    from collapse_doctor.pipeline.scan import ScanHooks, plan_scan, run_scan
    from collapse_doctor.report.html.collect import ReportExtras

    request = OutputRequest(html=Path(output))
    plan = plan_scan(paths, options)
    request.check(plan.files, runs=[run.name for run in plan.runs])
    results = run_scan(plan, ScanHooks(collector=request.collector()))
    write_outputs(results, request, stdout=None)
    extras = results[0].extra
    assert isinstance(extras, ReportExtras)
    return results[0].diagnosis, extras, Path(output).stat().st_size
