"""Reading JSON Lines files whole (rollout dumps are small), with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file as a dict (a partial last line, still being written, is skipped)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    rows = []
    complete = data[: data.rfind(b"\n") + 1] if not data.endswith(b"\n") else data
    for number, line in enumerate(complete.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json_text.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}: line {number} is not JSON ({exc})", hint="pass JSON Lines files") from exc
        if not isinstance(obj, dict):
            raise InputError(
                f"{path}: line {number} is not a JSON object", hint="pass JSON Lines files: one object per line"
            )
        rows.append(obj)
    return rows
