"""Weights & Biases run files (``wandb/run-*/run-<id>.wandb``, ``wandb/offline-run-*/``), read offline.

The ``.wandb`` file is the transaction log wandb's service writes for every run, online or offline, before
anything is synced. It is read here without wandb's network API and without starting its service:

- **Framing** (read here, stdlib only): a 7-byte file header (ident ``:W&B``, uint16 magic ``0xBEE1``, uint8
  version 0), then LevelDB-log framing in 32 KiB blocks counted from the start of the file. Each chunk is a
  7-byte header (uint32 checksum, uint16 length, uint8 type: FULL 1, FIRST 2, MIDDLE 3, LAST 4) and its data; a
  record longer than a block's rest is split FIRST, MIDDLE..., LAST; a block's tail shorter than a chunk header
  is zero padding. The checksum is zlib's CRC-32 (IEEE) of the type byte followed by the data, unmasked: wandb
  changed LevelDB's masked CRC32C, as the files wandb 0.31 writes show (the tests check the framing on them).
- **Records**: each record is a serialised ``Record`` of wandb's own protobuf schema, parsed with the module
  wandb ships (``wandb.proto.wandb_internal_pb2``, which picks the generated code for the installed protobuf
  major version; the ``trackers`` extra). Importing it loads the ``wandb`` package (about 0.4 s, no thread,
  no service, no network; docs/input-formats.md); without it the file is an error naming it with the hint
  ``pip install 'collapse-doctor[wandb]'`` (``trackers`` includes it).
- **Values**: history rows (``wandb.log``) hold items keyed by ``key`` or by ``nested_key`` parts (a nested
  dict logged as ``{"a": {"b": 1}}``), joined with ``/``. A value is in the typed ``value`` oneof (``number``,
  ``integer``, ``json``) or in the legacy ``value_json``; numbers (NaN and infinities included) are kept,
  booleans, strings and media are not. Keys starting with ``_`` are wandb's bookkeeping (``_runtime``,
  ``_timestamp``). A logged table or image is a set of keys under its name with a ``<name>/_type`` among them
  (TRL's ``completions`` table: ``completions/ncols``, ``nrows``, ``size``...): the file's bookkeeping, dropped
  with its numbers.
- **Steps**: a row's step is ``_step`` unless the run declared a step metric with ``define_metric`` (transformers'
  ``WandbCallback`` declares ``train/global_step`` for ``*``, with ``step_sync``): then a metric's points are at
  the value of its step metric in the row (the last value seen when the row lacks it), which is the step
  TensorBoard and ``trainer_state.json`` give them. The step metric itself is not a series.
- **Live files**: a file that ends inside a chunk or between the chunks of one record (wandb still writing) is
  read up to its last whole record and marked truncated (the scan notes it, as for a TensorBoard file being
  written); :attr:`EventFileRead.end` is where a later read resumes (the file only grows; the step metrics
  declared before it are remembered per file, or parsed again in a new process). A checksum mismatch, or a
  chunk that breaks the framing, is an error naming the byte offset; a file without the ``:W&B`` header is an
  error naming it.

A run is named by its directory (``wandb/offline-run-<date>-<id>``); ``--run`` also takes the run id and the
display name of its run record (``wandb.init(name=...)``; TRL: ``run_name``).

Keys are kept as the trainer logged them: transformers' callback logs TRL's metrics with the ``train/`` prefix
(``train/rewards/<func>/mean``), verl's ``Tracking`` logs its own names (``critic/score/mean``), so the tag maps of
:mod:`collapse_doctor.io.logs.tags` read them as they read TensorBoard tags.
"""

from __future__ import annotations

import fnmatch
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError
from collapse_doctor.io.logs.tensorboard import EventFileRead, read_from
from collapse_doctor.io.logs.trainer_logs import records_to_read
from collapse_doctor.io.storage.remote import input_path

FILE_NAME = re.compile(r"run-(?P<id>[A-Za-z0-9_-]+)\.wandb")
"""``run-<run id>.wandb``, in ``wandb/run-<date>-<id>/`` (online) or ``wandb/offline-run-<date>-<id>/``."""
HEADER = struct.Struct("<4sHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
BLOCK = 32 * 1024
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
INSTALL_HINT = "pip install 'collapse-doctor[wandb]' (wandb's record definitions; nothing is sent anywhere)"
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}


def run_id(path: Path) -> str | None:
    """The run id in a ``run-<id>.wandb`` file name.

    >>> run_id(Path("wandb/offline-run-20261201_095452-eoi5io8c/run-eoi5io8c.wandb"))
    'eoi5io8c'
    """
    found = FILE_NAME.fullmatch(path.name)
    return found.group("id") if found else None


def run_names(path: Path) -> tuple[str, ...]:
    """The run id (from the file name) and the run's display name (from its run record, near the start), for
    ``--run``; only the id when the record cannot be read (the scan then reports why)."""
    names = [found] if (found := run_id(path)) else []
    try:
        data = read_from(path, 0)[:BLOCK]
        if data[: len(IDENT)] != IDENT:
            return tuple(names)
        pb = _record_module(path)
        for _, _, payload in iter_records(path, data[HEADER.size :], HEADER.size):
            record = pb.Record.FromString(payload)
            if record.WhichOneof("record_type") == "run":
                names += [n for n in (record.run.run_id, record.run.display_name) if n and n not in names]
                break
    except Exception:  # discovery never fails on a damaged file: reading it names the problem
        pass
    return tuple(names)


def run_config(path: Path) -> dict[str, Any]:
    """The run's config (``wandb.config``: transformers' callback puts every ``TrainingArguments`` field there) as
    the file's config records set it, later updates winning; ``{}`` when it holds none. Values that are not JSON
    are left out."""
    data = read_from(path, 0)
    if data[: len(IDENT)] != IDENT:
        raise _not_wandb(path)
    pb = _record_module(path)
    config: dict[str, Any] = {}
    for _, _, payload in iter_records(path, data[HEADER.size :], HEADER.size):
        record = pb.Record.FromString(payload)
        kind = record.WhichOneof("record_type")
        items = record.config.update if kind == "config" else record.run.config.update if kind == "run" else ()
        for item in items:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            try:
                config[key] = json_text.loads(item.value_json)
            except ValueError:
                continue
    return config


def _corrupt(path: Path, at: int, what: str) -> InputError:
    return InputError(
        f"{path}: corrupt W&B record at byte {at} ({what})",
        hint="the run file is damaged; copy it again from the training machine (wandb sync reads the same file)",
    )


def iter_records(path: Path, data: bytes, start: int) -> Iterator[tuple[int, int, bytes]]:
    """``(offset, end, payload)`` of each whole record in ``data`` (the file's bytes from ``start`` on), where
    ``end`` is the byte after the record's last chunk. Stops at a cut-off chunk or record (the caller compares
    the last ``end`` with the file size)."""
    pos = 0
    size = len(data)
    parts: list[bytes] = []
    record_at = start
    while pos < size:
        absolute = start + pos
        left = BLOCK - absolute % BLOCK
        if left < CHUNK.size:
            pad = data[pos : pos + left]
            if pad.strip(b"\0"):
                raise _corrupt(path, absolute, "non-zero block padding")
            pos += left
            continue
        if pos + CHUNK.size > size:
            return  # cut off inside a chunk header
        checksum, length, kind = CHUNK.unpack_from(data, pos)
        if checksum == 0 and length == 0 and kind == 0:
            if data[pos:].strip(b"\0"):
                raise _corrupt(path, absolute, "empty chunk before more data")
            return  # zero bytes the writer reserved: nothing written past here yet
        if kind not in _TYPE_CRC:
            raise _corrupt(path, absolute, f"unknown chunk type {kind}")
        if length > left - CHUNK.size:
            raise _corrupt(path, absolute, f"chunk of {length} bytes runs past its 32 KiB block")
        begin = pos + CHUNK.size
        if begin + length > size:
            return  # cut off inside the chunk's data
        chunk = data[begin : begin + length]
        if zlib.crc32(chunk, _TYPE_CRC[kind]) != checksum:
            raise _corrupt(path, absolute, "checksum mismatch")
        pos = begin + length
        if kind == FULL:
            if parts:
                raise _corrupt(path, absolute, "whole record inside a split one")
            yield absolute, start + pos, chunk
            continue
        if kind == FIRST:
            if parts:
                raise _corrupt(path, absolute, "split record started twice")
            parts = [chunk]
            record_at = absolute
            continue
        if not parts:
            raise _corrupt(path, absolute, "continuation of a record that did not start")
        parts.append(chunk)
        if kind == LAST:
            yield record_at, start + pos, b"".join(parts)
            parts = []


def _record_module(path: Path) -> Any:
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise InputError(
            f"{path}: reading a W&B run file needs wandb's record definitions, which are not installed ({exc})",
            hint=INSTALL_HINT,
        ) from exc
    return wandb_internal_pb2


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _item_value(item: Any) -> float | None:
    which = item.WhichOneof("value")
    if which in ("number", "integer"):
        return float(getattr(item, which))
    if which == "json":
        text = item.json
    elif which is None:
        text = item.value_json
    else:  # none, boolean, text
        return None
    if not text:
        return None
    try:
        return float(text)  # JSON numbers, NaN, Infinity: nearly every value of a training log
    except ValueError:
        pass
    try:
        return _number(json_text.loads(text))
    except ValueError:
        return None


def _item_key(item: Any) -> str:
    return item.key if item.key else "/".join(item.nested_key)


class _StepMetrics:
    """``define_metric`` declarations: which metric gives which key its step."""

    def __init__(self) -> None:
        self.exact: dict[str, str] = {}
        self.globs: list[tuple[str, str]] = []
        self._matched: dict[str, str | None] = {}

    def add(self, metric: Any) -> None:
        if not metric.step_metric:
            return
        if metric.name:
            self.exact[metric.name] = metric.step_metric
        elif metric.glob_name:
            self.globs.append((metric.glob_name, metric.step_metric))
        self._matched.clear()

    def copy(self) -> _StepMetrics:
        out = _StepMetrics()
        out.exact, out.globs = dict(self.exact), list(self.globs)
        return out

    def of(self, key: str) -> str | None:
        if key in self.exact:
            return self.exact[key]
        if key not in self._matched:
            self._matched[key] = next(
                (step for glob, step in reversed(self.globs) if fnmatch.fnmatchcase(key, glob)), None
            )
        return self._matched[key]

    @property
    def names(self) -> set[str]:
        return {*self.exact.values(), *(step for _, step in self.globs)}


@dataclass
class _State:
    """What reading a file's records up to ``end`` learned that later rows need: the step metrics declared
    and the last value of each."""

    end: int
    steps: _StepMetrics = field(default_factory=lambda: _StepMetrics())
    last_value: dict[str, float] = field(default_factory=dict)


_RESUME: dict[Path, _State] = {}
"""Per file, the state at the end of its last read, so a read from there on (``ScalarCache``, ``watch``) places
rows at their step metric without parsing the start of the file again."""


def read_wandb_log(path: str | Path, *, start: int = 0) -> EventFileRead:
    """The numeric history of one ``.wandb`` run file from byte ``start`` on (0: the whole file, header checked).

    Records cut off at the end are left for the next read (``truncated``); see the module docstring. A read
    from ``start > 0`` continues the one that ended there (or, in another process, parses the records before
    ``start`` again for their ``define_metric`` declarations).
    """
    path = input_path(path)  # a file in object storage stays one
    key = path.resolve()
    state = _RESUME.get(key)
    if start == 0 or state is None or state.end != start:
        state = _State(end=0)
        if start > 0:
            _scan(path, read_from(path, 0)[:start], 0, state, [])
    else:
        state = _State(end=state.end, steps=state.steps.copy(), last_value=dict(state.last_value))
    rows: list[tuple[int, dict[str, float]]] = []
    data = read_from(path, start)
    parsed = _scan(path, data, start, state, rows)
    _RESUME[key] = state
    read = records_to_read(path, rows, end=state.end)
    read.start = start
    # Records, not rows: a read of only non-history records (the run's exit) still moves the resume point on.
    read.records = max(read.records, parsed)
    read.truncated = state.end < start + len(data)
    return read


def _scan(path: Path, data: bytes, start: int, state: _State, rows: list[tuple[int, dict[str, float]]]) -> int:
    """Parse the whole records of ``data`` (the file from byte ``start`` on) into ``rows``; ``state.end`` becomes
    the byte after the last one. Returns how many records were parsed."""
    offset = 0
    state.end = start
    if start == 0:
        if len(data) < HEADER.size:
            if data and not IDENT.startswith(data[: len(IDENT)]):
                raise _not_wandb(path)
            return 0
        ident, magic, version = HEADER.unpack_from(data)
        if ident != IDENT or magic != MAGIC:
            raise _not_wandb(path)
        if version != VERSION:
            raise InputError(
                f"{path}: W&B run file format version {version} (collapse-doctor reads version {VERSION})",
                hint="open an issue with the wandb version that wrote the file",
            )
        offset = HEADER.size
        state.end = HEADER.size
    pb = _record_module(path)
    parse = pb.Record.FromString
    parsed = 0
    for at, record_end, payload in iter_records(path, data[offset:], start + offset):
        state.end = record_end
        parsed += 1
        try:
            record = parse(payload)
        except Exception as exc:  # protobuf's DecodeError: a bad payload with a good checksum
            raise InputError(
                f"{path}: record at byte {at} is not a W&B record ({exc})",
                hint="pass the run-<id>.wandb file wandb wrote, or install the wandb version that wrote it",
            ) from exc
        kind = record.WhichOneof("record_type")
        if kind == "metric":
            state.steps.add(record.metric)
        elif kind == "history":
            rows.extend(_history_rows(record.history, state.steps, state.last_value))
    return parsed


def _history_rows(
    history: Any, steps: _StepMetrics, last_value: dict[str, float]
) -> list[tuple[int, dict[str, float]]]:
    """One history record as ``(step, {key: value})`` rows: one per distinct step its keys are logged at."""
    values: dict[str, float] = {}
    row_step: int | None = int(history.step.num) if history.HasField("step") else None
    media: list[str] = []
    for item in history.item:
        key = _item_key(item)
        value = _item_value(item)
        if key == "_step" and value is not None:
            row_step = int(value)
        if key.endswith("/_type"):
            media.append(key[: -len("_type")])
        if key.startswith("_") or value is None:
            continue
        values[key] = value
    for prefix in media:  # a table or an image: its size, rows and columns are the file's, not training metrics
        for key in [k for k in values if k.startswith(prefix)]:
            del values[key]
    step_names = steps.names
    for name in step_names & values.keys():
        last_value[name] = values[name]
    grouped: dict[int, dict[str, float]] = {}
    for key, value in values.items():
        if key in step_names:
            continue
        metric = steps.of(key)
        at = last_value.get(metric) if metric is not None else None
        step = int(at) if at is not None and at == at else row_step
        if step is None:
            continue
        grouped.setdefault(step, {})[key] = value
    return list(grouped.items())


def _not_wandb(path: Path) -> InputError:
    return InputError(
        f"{path}: not a W&B run file (no ':W&B' header)",
        hint="pass the run-<id>.wandb file of a wandb run directory (wandb/run-*/ or wandb/offline-run-*/)",
    )
