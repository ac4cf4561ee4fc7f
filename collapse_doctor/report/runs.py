"""Output for a scan that found several runs (a log directory with one subdirectory per run).

Each run is diagnosed on its own; the terminal shows them one after another, the JSON holds them side by
side under ``runs`` with the worst verdict and the combined exit code on top, the Markdown summary and
GitHub annotations are concatenated. JUnit and HTML describe one run: pick it with ``--run NAME``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collapse_doctor.diagnosis import JSON_FORMAT_VERSION, Diagnosis
from collapse_doctor.errors import UsageError

_VERDICT_ORDER = ("healthy", "at_risk", "collapsed")


def runs_dict(diagnoses: Sequence[Diagnosis], *, include_series: bool = True) -> dict[str, Any]:
    """``{"format_version", "verdict" (worst), "exit_code" (max), "runs": [diagnosis, ...]}``."""
    return {
        "format_version": JSON_FORMAT_VERSION,
        "verdict": max((d.verdict for d in diagnoses), key=_VERDICT_ORDER.index),
        "exit_code": max(d.exit_code() for d in diagnoses),
        "runs": [d.to_dict(include_series=include_series) for d in diagnoses],
    }


def runs_json(diagnoses: Sequence[Diagnosis], *, indent: int | None = 2) -> str:
    return json.dumps(runs_dict(diagnoses), indent=indent, allow_nan=False)


def _write(path: Path, text: str, inputs: list[Path]) -> None:
    from collapse_doctor.io.atomic import atomic_path

    with atomic_path(path, inputs=inputs) as tmp:
        tmp.write_text(text, encoding="utf-8")


def report_runs(
    diagnoses: Sequence[Diagnosis],
    *,
    output_format: str,
    json_out: Path | None = None,
    junit_out: Path | None = None,
    markdown_out: Path | None = None,
    html_out: Path | None = None,
) -> int:
    """Write the outputs of a several-run scan; returns the exit code (the worst of the runs)."""
    from collapse_doctor.report.ci import github_annotations, markdown_summary

    names = ", ".join(d.run.name or "?" for d in diagnoses)
    for option, value in (("--junit", junit_out), ("--html", html_out)):
        if value is not None:
            raise UsageError(
                f"{option} describes one run and the input holds {len(diagnoses)}: {names}",
                hint="pick one with --run NAME",
            )
    inputs = [Path(s) for d in diagnoses for s in d.run.sources]
    if json_out is not None:
        _write(json_out, runs_json(diagnoses) + "\n", inputs)
    if markdown_out is not None:
        _write(markdown_out, "\n".join(markdown_summary(d) for d in diagnoses), inputs)
    if output_format == "json":
        print(runs_json(diagnoses))
    elif output_format == "github":
        sys.stdout.write("".join(github_annotations(d) for d in diagnoses))
        summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_file:
            with open(summary_file, "a", encoding="utf-8") as handle:
                handle.write("\n".join(markdown_summary(d) for d in diagnoses))
    else:
        from collapse_doctor.report.text import render_text

        plain = bool(os.environ.get("NO_COLOR")) or not sys.stdout.isatty()
        for i, diagnosis in enumerate(diagnoses):
            if i:
                print()
            render_text(diagnosis, sys.stdout, color=False if plain else None)
    return max(d.exit_code() for d in diagnoses)
