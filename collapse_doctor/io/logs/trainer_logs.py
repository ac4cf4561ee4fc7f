"""Scalar logs other than TensorBoard: TRL's ``trainer_state.json`` and verl's file-logger JSONL.

Both become the same :class:`~collapse_doctor.io.logs.tensorboard.ScalarLog` as event files, with tags named
as the framework names them in TensorBoard, so one tag map serves both:

- ``trainer_state.json`` ``log_history``: a list of dicts with ``step`` and the logged values; keys get
  the ``train/`` prefix (``eval_x`` becomes ``eval/x``), as transformers' TensorBoard callback writes them;
- verl ``trainer.logger=['file']``: one JSON object per line, ``{"step": N, "data": {"critic/score/mean": ...}}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError
from collapse_doctor.io.logs.tensorboard import EventFileRead, ScalarLog, merge_reads, read_from
from collapse_doctor.io.storage.remote import input_path


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def records_to_read(path: Path, records: Iterable[tuple[int, dict[str, float]]], *, end: int = 0) -> EventFileRead:
    """Flat arrays (as an event file read gives) from ``(step, {tag: value})`` records in file order."""
    tag_ids: dict[str, int] = {}
    index: list[int] = []
    steps: list[int] = []
    values: list[float] = []
    order: list[int] = []
    count = 0
    for count, (step, data) in enumerate(records, start=1):
        for tag, value in data.items():
            tag_index = tag_ids.setdefault(tag, len(tag_ids))
            index.append(tag_index)
            steps.append(step)
            values.append(value)
            order.append(count)
    n = len(steps)
    return EventFileRead(
        path=path,
        start=0,
        end=end,
        records=count,
        truncated=False,
        tag_names=list(tag_ids),
        tag_index=np.asarray(index, dtype=np.int32),
        steps=np.asarray(steps, dtype=np.int64),
        values=np.asarray(values, dtype=np.float64),
        # Later lines win duplicates: their "wall time" is their position.
        wall_times=np.asarray(order, dtype=np.float64) if n else np.zeros(0),
        order=np.asarray(order, dtype=np.int64),
    )


def _trainer_key(key: str) -> str:
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_") :]
    if key.startswith("test_"):
        return "test/" + key[len("test_") :]
    return "train/" + key


def read_trainer_state(path: str | Path) -> ScalarLog:
    """TRL / transformers ``trainer_state.json``: every numeric entry of ``log_history``."""
    return merge_reads([trainer_state_records(path)])


def trainer_state_records(path: str | Path) -> EventFileRead:
    """The numeric entries of a ``trainer_state.json`` ``log_history`` as one read (the file is rewritten, so
    it is always read whole)."""
    path = input_path(path)  # a RemotePath stays one
    try:
        state = json_text.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    except ValueError as exc:
        hint = "pass a trainer_state.json written by transformers"
        raise InputError(f"{path}: not valid JSON ({exc})", hint=hint) from exc
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise InputError(
            f"{path}: no 'log_history' list in this trainer_state.json",
            hint="pass the trainer_state.json of a run (in the output dir or a checkpoint-N dir)",
        )
    records = []
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        data = {
            _trainer_key(k): n for k, v in entry.items() if k not in ("step", "epoch") and (n := _number(v)) is not None
        }
        records.append((int(entry["step"]), data))
    return records_to_read(path, records)


def _jsonl_lines(path: Path, start: int) -> tuple[list[tuple[int, str]], int]:
    """Complete lines from byte ``start`` on and the offset after the last one (a partial last line waits)."""
    data = read_from(path, start)
    cut = data.rfind(b"\n") + 1
    lines = []
    offset = start
    for raw in data[:cut].split(b"\n")[:-1]:
        lines.append((offset, raw.decode("utf-8", errors="replace")))
        offset += len(raw) + 1
    return lines, start + cut


def _line_number(path: Path, start: int, index: int) -> int:
    """The 1-based line number of the ``index``-th line read from byte ``start`` (as JSONL errors everywhere say:
    the lines before ``start`` are counted only here, on the error path)."""
    before = read_from(path, 0)[:start].count(b"\n") if start else 0
    return before + index + 1


def read_verl_file_log(path: str | Path, *, start: int = 0) -> EventFileRead:
    """verl's file logger: ``{"step": N, "data": {tag: value}}`` per line (only complete lines are read)."""
    path = input_path(path)  # a RemotePath stays one
    lines, end = _jsonl_lines(path, start)
    records = []
    for index, (_, line) in enumerate(lines):
        if not line.strip():
            continue
        where = f"line {_line_number(path, start, index)}"
        try:
            obj = json_text.loads(line)
        except ValueError as exc:
            raise InputError(
                f"{path}: {where} is not JSON ({exc})",
                hint="pass verl's file-logger JSONL, one JSON object per line",
            ) from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict) or "step" not in obj:
            raise InputError(
                f"{path}: {where} is not a verl file-logger record (expected keys 'step' and 'data')",
                hint="pass verl's file-logger JSONL, or rollout dumps as <rollout_data_dir>/<step>.jsonl",
            )
        try:
            number = int(obj["step"])
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"{path}: {where}: 'step' is not an integer: {obj['step']!r}",
                hint="verl's file logger writes the training step as an integer",
            ) from exc
        data = {str(k): n for k, v in obj["data"].items() if (n := _number(v)) is not None}
        records.append((number, data))
    read = records_to_read(path, records, end=end)
    read.start = start
    return read


def looks_like_verl_file_log(first_line: str) -> bool:
    try:
        obj = json_text.loads(first_line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "step" in obj and isinstance(obj.get("data"), dict)
