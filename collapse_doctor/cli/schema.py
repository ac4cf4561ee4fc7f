"""``collapse-doctor schema``: the JSON Schema of what ``scan --json`` or ``compare --json`` writes."""

from __future__ import annotations

from typing import Annotated

import typer

from collapse_doctor.cli.common import user_errors
from collapse_doctor.cli.options import DebugOption, choice_argument


def schema(
    document: Annotated[
        str,
        choice_argument("DOCUMENT", choices=("scan", "compare"), help="Which command's JSON document."),
    ],
    debug: DebugOption = False,
) -> None:
    """Print the JSON Schema of a command's JSON output (for validators and code generators).

    Example: collapse-doctor schema scan > scan-output.schema.json
    """
    with user_errors(debug):
        from collapse_doctor.report.schemas import SCHEMAS, schema_text

        name = document.strip().lower()
        if name not in SCHEMAS:
            from collapse_doctor.core.errors import UsageError

            raise UsageError(f"unknown document {document!r}", hint=f"choose one of: {', '.join(SCHEMAS)}")
        typer.echo(schema_text(name), nl=False)
