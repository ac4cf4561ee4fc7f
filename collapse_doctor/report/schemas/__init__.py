"""The JSON Schemas of what ``scan --json`` and ``compare --json`` write, installed with the package.

``collapse-doctor schema scan|compare`` prints them; tests validate every document the tool writes against them.
"""

from __future__ import annotations

from importlib import resources

SCHEMAS = {"scan": "scan-output.schema.json", "compare": "compare-output.schema.json"}
"""The schema of each document, by the command that writes it."""


def schema_text(name: str) -> str:
    """The schema of ``name`` (``scan`` or ``compare``) as its file holds it.

    >>> import json
    >>> json.loads(schema_text("scan"))["title"].startswith("collapse-doctor scan output")
    True
    """
    return resources.files(__name__).joinpath(SCHEMAS[name]).read_text(encoding="utf-8")
