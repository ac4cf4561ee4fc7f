"""``collapse-doctor explain``: a detector's documentation (its docstring) and thresholds."""

from __future__ import annotations

from typing import Annotated

import typer

from collapse_doctor.cli.common import user_errors
from collapse_doctor.cli.options import DebugOption


def explain(
    code: Annotated[
        str | None,
        typer.Argument(metavar="CODE", help="Detector code, e.g. CD101, or a prefix such as CD1 (omit to list all)."),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """What a detector checks, why it matters, its evidence and the remedy.

    Example: collapse-doctor explain CD402
    """
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
