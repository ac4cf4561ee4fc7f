"""The JSON documents collapse-doctor writes (indented, with every list of plain values on one line), and the one
parser of the JSON it reads (:func:`loads`).

``json.dumps(..., indent=2)`` runs Python's pure-Python encoder and puts every number of a per-step series on a
line of its own: a scan of a long log spends most of its output time there, and the file is hard to read. Here
lists of plain values (numbers, strings, booleans, null) are encoded by the C encoder on one line each, and the
rest of the document is indented as before. The result parses to the same value.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

_PLAIN = (int, float, str, bool, type(None))


def loads(text: str | bytes) -> Any:
    """``json.loads``, with a document nested too deeply for Python's parser (``[[[[...]]]]``: a RecursionError) a
    :class:`json.JSONDecodeError` as any other bad JSON, so every reader's "not valid JSON" error names the file.

    >>> loads("[1, 2]")
    [1, 2]
    >>> loads("[" * 100_000)
    Traceback (most recent call last):
    json.decoder.JSONDecodeError: nested too deeply to be read: line 1 column 1 (char 0)
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to be read", str(text[:80]), 0) from None


def dumps(document: Any, *, indent: int | None = 2) -> str:
    """``document`` as JSON (NaN and infinities refused, as ``allow_nan=False``).

    >>> print(dumps({"run": {"steps": [1, 2, 3], "name": "a"}, "findings": []}))
    {
      "run": {
        "steps": [1, 2, 3],
        "name": "a"
      },
      "findings": []
    }
    """
    if indent is None:
        return json.dumps(document, allow_nan=False)
    inline: list[str] = []
    nonce = secrets.token_hex(8)  # no string of the document can be mistaken for a placeholder
    holder = re.compile(rf'"\\u0000{nonce}:(\d+)\\u0000"')

    def hold(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: hold(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            if value and all(isinstance(item, _PLAIN) for item in value):
                inline.append(json.dumps(value, allow_nan=False, separators=(", ", ": ")))
                return f"\0{nonce}:{len(inline) - 1}\0"
            return [hold(item) for item in value]
        return value

    text = json.dumps(hold(document), indent=indent, allow_nan=False)
    return holder.sub(lambda found: inline[int(found.group(1))], text)
