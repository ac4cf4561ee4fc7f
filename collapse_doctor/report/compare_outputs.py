"""What ``compare`` and ``scan --baseline`` write: the comparison as JSON, HTML and terminal text, and the gates.

The counterpart of :mod:`collapse_doctor.report.outputs` for a :class:`~collapse_doctor.pipeline.compare.Comparison`;
the renderers themselves are :mod:`~collapse_doctor.report.compare_text` and
:mod:`~collapse_doctor.report.html.compare_html`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.pipeline.compare import Comparison, GateResult, GateSettings


def describe_run(diagnosis: Diagnosis) -> str:
    """A run without a name, by its input files (``runs/a.parquet``, ``out/rollouts/ (12 files)``)."""
    from collapse_doctor.core.text_safety import describe_sources

    return describe_sources(diagnosis.run.sources)


def gate_runs(
    baseline_label: str, baseline: Diagnosis, diagnoses: Sequence[Diagnosis], settings: GateSettings
) -> list[GateResult]:
    """Judge every run against the baseline (a run is labelled by its name, else by its inputs)."""
    from collapse_doctor.pipeline.compare import ComparedRun, regression_gate

    base = ComparedRun(baseline_label, baseline)
    return [regression_gate(base, ComparedRun(d.run.name or describe_run(d), d), settings) for d in diagnoses]


def write_gates(gates: Sequence[GateResult], out: IO[str], *, color: bool | None = None, verbosity: int = 0) -> None:
    """Each gate after a blank line: its conclusion (what got worse or better, what could not be compared, whether
    the gate fails the run), then every criterion with its numbers (``verbosity`` -1: the conclusion only)."""
    from collapse_doctor.report.compare_text import render_conclusion, render_gate
    from collapse_doctor.report.text import console_for

    for gate in gates:
        console = console_for(out, color)
        if verbosity < 0:
            render_conclusion(gate, console, blank=False)
            continue
        out.write("\n")
        render_conclusion(gate, console)
        render_gate(gate, console=console)


def write_comparison(
    comparison: Comparison,
    inputs: Sequence[Path],
    *,
    json_out: Path | None,
    html_out: Path | None,
    output_format: str,
    stdout: IO[str],
    color: bool | None = None,
    on_written: Callable[[str, Path], None] | None = None,
    verbosity: int = 0,
) -> None:
    """Write the comparison's files (never over one of ``inputs``) and its stdout: JSON with ``output_format``
    ``json`` or ``--json -``, else the terminal text unless the HTML page is on stdout.

    ``on_written(what, path)`` is told of each file once it is written (a path of ``-`` is stdout, not a file).
    ``verbosity``: of the terminal text (``-1``: the conclusions only).
    """
    from collapse_doctor.io.storage.atomic import atomic_path, is_stdout
    from collapse_doctor.report.compare_text import render_comparison
    from collapse_doctor.report.html.compare_html import write_comparison_html

    runs = len(comparison.runs)
    text = comparison.to_json() + "\n"
    if json_out is not None and not is_stdout(json_out):
        with atomic_path(json_out, inputs=inputs) as tmp:
            tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
        if on_written is not None:
            on_written(f"comparison JSON of {runs} runs", json_out)
    if html_out is not None:
        write_comparison_html(html_out, comparison, inputs=inputs)
        if not is_stdout(html_out) and on_written is not None:
            on_written(f"comparison HTML of {runs} runs", html_out)
    if output_format == "json" or (json_out is not None and is_stdout(json_out)):
        stdout.write(text)
    elif html_out is None or not is_stdout(html_out):
        render_comparison(comparison, stdout, color=color, verbosity=verbosity)
    stdout.flush()
