"""verl rollout dumps: ``<trainer.rollout_data_dir>/<step>.jsonl``.

verl writes one JSON object per sampled response: ``input`` (prompt text), ``output`` (response text),
``score``, ``step``, ``gts`` (ground truth) and, when ``compute_score`` returns a dict, one key per reward
component. Rows are not in group order. Dumps that carry a ``uid`` key on every record (the v1 trainer
writes the group's uid, shared by the ``rollout.n`` responses of one prompt) use it as the group id; older
dumps have none, so groups are rebuilt from identical ``input`` text within a step. The channels are the
numeric reward components when there are any (``score`` is then their combination), else ``score`` itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from collapse_doctor.core.errors import SchemaError
from collapse_doctor.core.schema import channel_column
from collapse_doctor.io.rollouts.jsonl import read_jsonl
from collapse_doctor.io.rollouts.table_run import TableRun

KNOWN_KEYS = frozenset({"input", "output", "score", "step", "gts", "request_id", "uid"})
FILE_NAME = re.compile(r"(\d+)\.jsonl")
"""verl's rollout dump name, ``<step>.jsonl``."""


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value is None


def open_verl_rollouts(
    files: Sequence[Path],
    *,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    **_: object,
) -> TableRun:
    """Read verl rollout dumps into one canonical run."""
    rows: list[dict[str, Any]] = []
    for path in files:
        found = FILE_NAME.fullmatch(path.name)
        for row in read_jsonl(path):
            row.setdefault("step", int(found.group(1)) if found else 0)
            rows.append(row)
    label = files[0].parent
    if not rows:
        return TableRun(pa.table({"step": pa.array([], pa.int64())}), label=label, sources=files)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    if reward_cols:
        channels = list(reward_cols)
    else:
        components = [k for k in keys if k not in KNOWN_KEYS and all(_is_number(r.get(k)) for r in rows)]
        channels = components or ["score"]
    missing = [c for c in channels if c not in keys]
    if missing:
        raise SchemaError(
            f"{label}: reward key(s) {missing} not found in the verl rollout dumps; found keys: {keys}",
            hint="pass --reward-cols with keys of the dumped records",
        )
    steps = []
    for row in rows:
        try:
            steps.append(int(row["step"]))
        except (TypeError, ValueError) as exc:
            raise SchemaError(
                f"{label}: key 'step' holds a value that is not an integer: {row['step']!r}",
                hint="verl writes the training step as an integer; fix the records, or remove 'step' to take it "
                "from the file name <step>.jsonl",
            ) from exc
    uids = [r.get("uid") for r in rows]
    has_uid = all(isinstance(u, (str, int)) and not isinstance(u, bool) for u in uids)
    if group_size is None and not has_uid and "input" not in keys:
        raise SchemaError(
            f"{label}: neither 'uid' nor 'input' keys in the verl rollout dumps, so groups cannot be rebuilt; "
            f"found keys: {keys}",
            hint="pass --group-size N if the responses of one prompt are consecutive",
        )
    columns: dict[str, Any] = {"step": pa.array(steps, pa.int64())}
    if has_uid:
        columns["group_id"] = pa.array([str(u) for u in uids])
    for name in channels:
        try:
            columns[channel_column(name)] = pa.array([r.get(name) for r in rows], pa.float64())
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            bad = next((r.get(name) for r in rows if not _is_number(r.get(name))), None)
            raise SchemaError(
                f"{label}: reward key {name!r} holds a value that is not a number: {bad!r}",
                hint="pass --reward-cols with numeric keys of the dumped records",
            ) from exc
    columns["prompt"] = pa.array([str(r.get("input", "")) for r in rows])
    columns["completion"] = pa.array([str(r.get("output", "")) for r in rows])
    return TableRun(pa.table(columns), label=label, sources=files, group_size=group_size, weights=weights)
