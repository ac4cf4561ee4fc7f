"""Prompt datasets for retraining: JSONL or Parquet with a ``prompt`` column.

Other columns travel with each prompt and reach the reward functions as keyword arguments, as in
TRL. Files are read here (not through ``datasets.load_dataset``) so nothing is cached or downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError

PROMPT_COLUMN = "prompt"
_DATASET_HINT = "pass a JSONL (one object per line) or Parquet file with a 'prompt' column"


def read_prompt_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl``/``.json`` (one object per line) or ``.parquet`` prompt file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such dataset file", hint=_DATASET_HINT)
    suffix = path.suffix.lower()
    rows: list[dict[str, Any]]
    if suffix in (".jsonl", ".json", ".ndjson"):
        rows = []
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read as UTF-8 text ({exc})", hint=_DATASET_HINT) from exc
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json_text.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not valid JSON ({exc.msg})", hint=_DATASET_HINT) from exc
            if not isinstance(row, dict):
                raise InputError(f"{path}:{number}: expected one JSON object per line", hint=_DATASET_HINT)
            rows.append(row)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:
            raise InputError(f"{path}: cannot read Parquet ({' '.join(str(exc).split())})", hint=_DATASET_HINT) from exc
    else:
        raise InputError(f"{path}: dataset must be .jsonl or .parquet", hint=_DATASET_HINT)
    if not rows:
        raise InputError(f"{path}: dataset has no rows", hint=_DATASET_HINT)
    missing = [i for i, row in enumerate(rows, 1) if PROMPT_COLUMN not in row]
    if missing:
        found = ", ".join(sorted(rows[missing[0] - 1])) or "none"
        raise InputError(
            f"{path}: row {missing[0]} has no 'prompt' column; found columns: [{found}]",
            hint="rename the prompt column to 'prompt'",
        )
    return rows


def to_dataset(rows: list[dict[str, Any]]) -> Any:
    """An in-memory ``datasets.Dataset`` of the rows."""
    from datasets import Dataset

    return Dataset.from_list(rows)
