"""Read every scalar of TensorBoard event files, fast, without TensorFlow and without reservoir sampling.

An event file is a sequence of TFRecords: ``uint64 length | masked crc32c(length) | payload | masked
crc32c(payload)``, each payload an ``Event`` protobuf (the classes that the ``tensorboard`` package ships).
tensorboard's ``EventAccumulator`` keeps at most 10,000 scalars per tag by default and checks CRCs in pure
Python; this reader keeps every point and checks the framing of all records at once (numpy, see
:mod:`collapse_doctor.io.logs.crc32c`):

1. the file is read into memory once and the record headers are walked (a tight loop over offsets);
2. every length CRC and payload CRC is checked in one vectorised pass;
3. records that are a lone ``simple_value`` scalar (PyTorch ``SummaryWriter.add_scalar``, TF1: nearly all
   of a training log) are decoded as arrays (:mod:`collapse_doctor.io.logs.event_fastpath`); every other record
   is parsed with the compiled protobuf parser, which reads ``simple_value`` scalars and scalar tensors
   (TF2 ``tf.summary.scalar``). Points are collected as flat arrays.

A record cut short at the end of a file (the trainer is still writing) ends the read there and is noted,
not an error; reading can resume from :attr:`EventFileRead.end`. A CRC mismatch is an error naming the
byte offset. Across the files of one run, ``SessionLog.START`` at step s drops the points logged before
it with step >= s (what TensorBoard does after a restart), and a (tag, step) logged more than once keeps
the point with the latest wall time. Trainer bookkeeping tags (``train/epoch``, ``train/train_runtime``, ...)
that transformers' end-of-training summary writes again at the last step are not a restart and are not noted.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.core import fold as folding
from collapse_doctor.core.errors import InputError
from collapse_doctor.core.fold import SeriesFold, fold_series
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.io.logs.crc32c import (
    NATIVE_CRC,
    PADDED_MAX_WORDS,
    VECTOR_MAX_BYTES,
    masked_crc32c,
    masked_crc32c_many,
)
from collapse_doctor.io.logs.event_fastpath import decode_simple_values
from collapse_doctor.io.storage.remote import RemotePath, input_path

__all__ = ["EventFileRead", "ScalarLog", "merge_reads", "read_event_file", "read_from"]

_HEADER = 12
_FOOTER = 4
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_TENSOR_DTYPES = {_DT_FLOAT: np.float32, _DT_DOUBLE: np.float64, _DT_INT32: np.int32, _DT_INT64: np.int64}
_SESSION_START = 1
BOOKKEEPING_TAGS = frozenset(
    {
        "epoch",
        "global_step",
        "total_flos",
        "train_runtime",
        "train_loss",
        "train_samples_per_second",
        "train_steps_per_second",
        "train_tokens_per_second",
    }
)
"""Last path parts of tags a trainer writes again at the last step (transformers' final training summary logs
``epoch`` once more with ``train_runtime``, ``total_flos``, ``train_loss``, ...): a repeat of these is no restart."""


def is_bookkeeping(tag: str) -> bool:
    """Whether a tag is trainer bookkeeping rather than a training metric.

    >>> is_bookkeeping("train/epoch"), is_bookkeeping("train/train_runtime"), is_bookkeeping("train/kl")
    (True, True, False)
    """
    return tag.rsplit("/", 1)[-1] in BOOKKEEPING_TAGS


@dataclass
class TagColumn:
    """One tag's points in one read, in record order (duplicates not resolved yet)."""

    steps: np.ndarray
    """``int64``; tags logged at the same steps share one array (never written to)."""
    values: np.ndarray
    """``float64``."""
    walls_sorted: bool
    """Whether the wall times never decrease in record order: then the latest point of a step is its last one, and
    the wall times themselves are not needed (nor kept, unless asked for)."""
    first_wall: float
    last_wall: float
    walls: np.ndarray | None = None
    """Every point's wall time, when kept (``read_event_file(keep_walls=True)``, the other formats' reads)."""
    fold: SeriesFold | None = None
    """The tag's points folded into step buckets (more than :data:`~collapse_doctor.core.fold.FOLD_CAP` of them;
    ``steps`` and ``values`` are then empty)."""


def _empty(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass
class EventFileRead:
    """The scalars of one event file (or of the part read from ``start`` on), in record order.

    Two forms: the TensorBoard reader fills :attr:`columns` (each tag's points, the read's own SessionLog purges
    applied) and leaves the flat arrays empty; the other scalar formats fill the flat arrays (one entry per point).
    :func:`merge_reads` takes both."""

    path: Path
    start: int
    end: int
    """Byte offset just past the last complete record: where the next read resumes."""
    records: int
    truncated: bool
    tag_names: list[str]
    tag_index: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    steps: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    values: np.ndarray = field(default_factory=lambda: _empty(np.float64))
    wall_times: np.ndarray = field(default_factory=lambda: _empty(np.float64))
    order: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    """Record number of each point within this read (for SessionLog purges)."""
    session_starts: list[tuple[int, int]] = field(default_factory=list)
    """``(record number, step)`` of each ``SessionLog.START``."""
    columns: dict[str, TagColumn] | None = None
    """Each tag's points (the TensorBoard reader's form), or ``None``: the flat arrays hold them."""
    purged: int = 0
    """Points dropped within this read by its own SessionLog START (the column form)."""
    decoded: int = 0
    """Points read, before those purges (the column form)."""
    state: Any = field(default=None, repr=False, compare=False)
    """The TensorBoard reader's per-tag state, which a read from :attr:`end` on continues (``read_event_file(...,
    resume=)``): a long tag's fold goes on where it stopped, so a file read in parts is folded as if read at once."""

    @property
    def points(self) -> int:
        return self.decoded if self.columns is not None else len(self.steps)


PARALLEL_CHECK_RECORDS = 8_000
"""Blocks with this many records check their CRCs on a second thread while the records are decoded."""


SPECULATE_MAX_PERIOD = 64
"""Longest repeating pattern of record lengths the walk looks for (a step's tags, logged in the same order)."""
SPECULATE_BLOCK = 65_536
"""The most records guessed and checked at once by the walk (a guess starts at :data:`SPECULATE_FIRST` records
and doubles while whole guesses match, so a log whose pattern keeps breaking pays little for trying)."""
SPECULATE_FIRST = 256


def _period(recent: list[int]) -> int:
    """The shortest period (up to :data:`SPECULATE_MAX_PERIOD`) with which the last record lengths repeat, or 0."""
    for p in range(1, min(SPECULATE_MAX_PERIOD, len(recent) // 2) + 1):
        if recent[-p:] == recent[-2 * p : -p]:
            return p
    return 0


def _walk(data: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, int | None]:
    """Record offsets, payload lengths, ``truncated`` (the data ends inside a record) and, when the last
    record's length points past the end and fails its checksum, that record's offset (corrupt, not cut).

    Each record's offset follows from the previous one's length, so the walk is sequential; but the lengths of a
    scalar log repeat (every logging step writes its tags in the same order), so once the last lengths repeat
    with some period the walk guesses the next block of records from that pattern and checks every guessed
    header against the data at once: the longest prefix whose lengths all match is taken (exactly what the
    record-by-record walk finds there), and the walk goes on one record at a time from the first miss.
    """
    unpack = struct.Struct("<Q").unpack_from
    raw = data.data if isinstance(data, np.ndarray) else data
    size = len(data)
    last_header = size - _HEADER
    frame = _HEADER + _FOOTER
    buf = np.frombuffer(data, dtype=np.uint8)
    offsets_done: list[np.ndarray] = []  # offsets and full sizes (header, payload, footer) of records found
    sizes_done: list[np.ndarray] = []
    starts: list[int] = []  # the records walked one by one since the last guess, and their sizes
    walked: list[int] = []
    guessed: list[int] = []  # the sizes of the last guessed records, for the pattern
    append, walk = starts.append, walked.append
    window = 2 * SPECULATE_MAX_PERIOD
    pos = 0
    wait = backoff = window  # records to walk one by one before the next guess (doubled while guesses fail)
    block = SPECULATE_FIRST
    while pos <= last_header:
        if wait <= 0:
            period = _period((guessed + walked[-window:])[-window:])
            if not period:  # no pattern: look again later, later each time
                backoff = min(2 * backoff, SPECULATE_BLOCK)
                wait = backoff
                continue
            recent = (guessed + walked[-window:])[-period:]
            guess = np.tile(np.asarray(recent, dtype=np.int64), max(1, block // period))
            offsets = pos + np.concatenate([[0], np.cumsum(guess[:-1])])
            past = np.flatnonzero(offsets + guess > size)  # whole records only: the tail is walked one by one
            if len(past):
                guess, offsets = guess[: past[0]], offsets[: past[0]]
            found = _read_u32(buf, offsets).astype(np.int64) | (_read_u32(buf, offsets + 4).astype(np.int64) << 32)
            misses = np.flatnonzero(found + frame != guess)
            taken = int(misses[0]) if len(misses) else len(guess)
            if taken:
                offsets_done += [np.asarray(starts, dtype=np.int64), offsets[:taken]]
                sizes_done += [np.asarray(walked, dtype=np.int64), guess[:taken]]
                starts, walked = [], []
                append, walk = starts.append, walked.append
                pos = int(offsets[taken - 1] + guess[taken - 1])
                guessed = guess[max(0, taken - window) : taken].tolist()
            if taken == len(guess) and taken:
                block = min(2 * block, SPECULATE_BLOCK)
                backoff = window
                continue  # the whole guess matched: guess again, twice as far
            block = SPECULATE_FIRST
            backoff = window if taken >= len(guess) // 2 else min(2 * backoff, SPECULATE_BLOCK)
            wait = backoff
        # The record-by-record walk, ``wait`` records: one header per iteration. Every record but the last one
        # ends where the next one starts (inside the data), so only the last one can be incomplete.
        while wait > 0 and pos <= last_header:
            append(pos)
            length = unpack(raw, pos)[0] + frame
            walk(length)
            pos += length
            wait -= 1
    truncated = pos != size
    if pos > size:  # the last record runs past the end of the data: drop it, resume from its header
        pos = starts.pop()
        walked.pop()
    begin = np.concatenate([*offsets_done, np.asarray(starts, dtype=np.int64)])
    lengths = np.concatenate([*sizes_done, np.asarray(walked, dtype=np.int64)]) - frame
    bad_tail = None
    if truncated and pos <= last_header:
        # A length that points past the end: a record being written, unless the length itself is corrupt.
        header = np.frombuffer(data, dtype=np.uint8, count=_HEADER, offset=pos)
        expected = int.from_bytes(bytes(header[8:12]), "little")
        if int(masked_crc32c_many(header, np.array([0]), np.array([8]))[0]) != expected:
            bad_tail = pos
    return begin, lengths, truncated, bad_tail


def _check_crcs(data: bytes | np.ndarray, starts: np.ndarray, lengths: np.ndarray, path: Path, offset: int) -> None:
    if not len(starts):
        return
    buf = np.frombuffer(data, dtype=np.uint8)
    stored_len_crc = _read_u32(buf, starts + 8)
    bad = np.flatnonzero(masked_crc32c_many(buf, starts, np.full(len(starts), 8)) != stored_len_crc)
    if len(bad):
        _corrupt(path, offset + int(starts[bad[0]]), "length")
    payload_starts = starts + _HEADER
    stored = _read_u32(buf, payload_starts + lengths)
    small = lengths <= VECTOR_MAX_BYTES
    computed = masked_crc32c_many(buf, payload_starts[small], lengths[small])
    bad = np.flatnonzero(computed != stored[small])
    if len(bad):
        _corrupt(path, offset + int(starts[small][bad[0]]), "data")
    if NATIVE_CRC is not None:
        for i in np.flatnonzero(~small):
            begin = int(payload_starts[i])
            if masked_crc32c(bytes(buf[begin : begin + int(lengths[i])])) != int(stored[i]):
                _corrupt(path, offset + int(starts[i]), "data")


def _read_u32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    b = [buf[at + k].astype(np.uint32) for k in range(4)]
    return b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)


def _corrupt(path: Path, at: int, what: str) -> None:
    raise InputError(
        f"{path}: corrupt TensorBoard record at byte {at} ({what} checksum mismatch)",
        hint="the event file is damaged; scan the other files of the run, or copy it again",
    )


def _tensor_scalar(tensor: object) -> float | None:
    dtype = tensor.dtype  # type: ignore[attr-defined]
    if tensor.tensor_shape.dim:  # type: ignore[attr-defined]
        return None
    if dtype == _DT_FLOAT and tensor.float_val:  # type: ignore[attr-defined]
        return float(tensor.float_val[0])  # type: ignore[attr-defined]
    if dtype == _DT_DOUBLE and tensor.double_val:  # type: ignore[attr-defined]
        return float(tensor.double_val[0])  # type: ignore[attr-defined]
    if dtype == _DT_INT32 and tensor.int_val:  # type: ignore[attr-defined]
        return float(tensor.int_val[0])  # type: ignore[attr-defined]
    if dtype == _DT_INT64 and tensor.int64_val:  # type: ignore[attr-defined]
        return float(tensor.int64_val[0])  # type: ignore[attr-defined]
    if dtype == _DT_HALF and tensor.half_val:  # type: ignore[attr-defined]
        return float(np.array([tensor.half_val[0]], dtype=np.uint16).view(np.float16)[0])  # type: ignore[attr-defined]
    content = tensor.tensor_content  # type: ignore[attr-defined]
    if content and dtype in _TENSOR_DTYPES:
        return float(np.frombuffer(content, dtype=_TENSOR_DTYPES[dtype])[0])
    return None


def read_from(path: Path, start: int) -> bytes:
    """The bytes of a file from offset ``start`` on: what an incremental reader has not seen yet (of an object in
    storage: one GET)."""
    if isinstance(path, RemotePath):
        return path.read_from(start)
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            return handle.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.strerror or exc})") from exc


CHUNK_BYTES = 1 << 20
"""Bytes of an event file decoded at a time. The read holds one such block (and the temporaries of its records)
besides the points: memory does not grow with the file. A record longer than a block gets a block of its size."""
_ROOM = 4 * PADDED_MAX_WORDS
"""Bytes kept past the end of a block: the fixed-width gathers of the CRC and the decoding read that far."""


class _Source:
    """The bytes of a file from ``start`` (up to ``stop``), read into a caller's buffer: a local file in blocks, an
    object in storage in one GET (its bytes then served from memory)."""

    def __init__(self, path: Path, start: int, stop: int | None) -> None:
        self.path = path
        self.left = None if stop is None else max(0, stop - start)
        try:
            if isinstance(path, RemotePath):
                data = path.read_from(start)
                self.handle: io.RawIOBase | io.BytesIO = io.BytesIO(data if stop is None else data[: self.left])
                self.size = len(self.handle.getbuffer())
            else:
                self.handle = path.open("rb", buffering=0)
                self.size = max(0, os.fstat(self.handle.fileno()).st_size - start)
                self.handle.seek(start)
        except OSError as exc:
            raise InputError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
        if self.left is not None:
            self.size = min(self.size, self.left)

    def fill(self, buf: np.ndarray, at: int, until: int) -> int:
        """Read into ``buf[at:until]`` (fewer bytes only at the end of the data); the number of bytes read."""
        if self.left is not None:
            until = min(until, at + self.left)
        view = buf.data
        done = at
        try:
            while done < until:
                n = self.handle.readinto(view[done:until])
                if not n:
                    break
                done += n
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read file ({exc.strerror or exc})") from exc
        if self.left is not None:
            self.left -= done - at
        return done - at

    def close(self) -> None:
        self.handle.close()


class _TagParts:
    """One tag's points of a read, gathered block by block."""

    __slots__ = ("count", "first_wall", "fold", "last_wall", "steps", "values", "walls", "walls_sorted")

    def __init__(self) -> None:
        self.steps: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.walls: list[np.ndarray] = []
        self.count = 0
        self.walls_sorted = True
        self.first_wall = self.last_wall = float("nan")
        self.fold: SeriesFold | None = None
        """Set once the tag has more than ``FOLD_CAP`` points: they are folded into step buckets as they come."""

    def add(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray, keep_walls: bool) -> None:
        if self.fold is not None:
            self.fold.add(steps, values)
        else:
            self.steps.append(steps)
            self.values.append(values)
            if keep_walls:
                self.walls.append(walls)
        if not self.count:
            self.first_wall = float(walls[0])
        elif not walls[0] >= self.last_wall:  # NaN too: such a tag's duplicates are resolved from its wall times
            self.walls_sorted = False
        if self.walls_sorted and len(walls) > 1 and not bool(np.all(walls[1:] >= walls[:-1])):
            self.walls_sorted = False
        self.last_wall = float(walls[-1])
        self.count += len(steps)
        if self.fold is None and self.count > folding.FOLD_CAP:  # too long to keep point for point: fold from here on
            self.fold = SeriesFold()
            self.fold.add(np.concatenate(self.steps), np.concatenate(self.values, dtype=np.float64))
            self.steps, self.values, self.walls = [], [], []

    def purge(self, step: int) -> int:
        """Drop the points at ``step`` or later (a SessionLog START): how many."""
        if self.fold is not None:
            return self.fold.truncate(step)
        dropped = 0
        for k, piece in enumerate(self.steps):
            keep = piece < step
            if keep.all():
                continue
            dropped += int(len(keep) - keep.sum())
            self.steps[k], self.values[k] = piece[keep], self.values[k][keep]
            if self.walls:
                self.walls[k] = self.walls[k][keep]
        return dropped


class _Columns:
    """The points of one read, per tag: small typed pieces per block, joined once at the end (no per-point
    objects; the steps of tags logged together are one array)."""

    def __init__(self, keep_walls: bool) -> None:
        self.keep_walls = keep_walls
        self.tags: dict[str, _TagParts] = {}

    def add(
        self, names: list[str], tag_ids: np.ndarray, steps: np.ndarray, values: np.ndarray, walls: np.ndarray
    ) -> None:
        """Points of one block in record order (``tag_ids`` index ``names``)."""
        if not len(tag_ids):
            return
        counts = np.bincount(tag_ids, minlength=len(names))
        order = np.argsort(tag_ids, kind="stable")
        seen: dict[tuple[int, int, int], list[np.ndarray]] = {}
        lo = 0
        for tag_id, count in enumerate(counts.tolist()):
            if not count:
                continue
            rows = order[lo : lo + count]
            lo += count
            tag_steps = steps[rows]
            key = (count, int(tag_steps[0]), int(tag_steps[-1]))
            for other in seen.get(key, ()):
                if np.array_equal(other, tag_steps):
                    tag_steps = other  # logged at the same steps as a tag before it: one array
                    break
            else:
                seen.setdefault(key, []).append(tag_steps)
            parts = self.tags.get(names[tag_id])
            if parts is None:
                parts = self.tags[names[tag_id]] = _TagParts()
            parts.add(tag_steps, values[rows], walls[rows], self.keep_walls)

    def purge(self, step: int) -> int:
        return sum(parts.purge(step) for parts in self.tags.values())

    def finish(self) -> dict[str, TagColumn]:
        """Each tag's pieces joined (``float64`` values); tags whose pieces are the same step arrays share one."""
        joined: dict[tuple[int, ...], np.ndarray] = {}
        alike: dict[tuple[int, int, int], list[np.ndarray]] = {}
        out: dict[str, TagColumn] = {}
        replaced = []  # the pieces joined stay alive until the loop ends: their ids key ``joined``
        for name, parts in self.tags.items():
            if parts.fold is not None:
                empty = np.zeros(0, np.int64)
                out[name] = TagColumn(empty, empty.astype(np.float64), True, parts.first_wall, parts.last_wall)
                out[name].fold = parts.fold.copy()
                continue
            key = tuple(id(piece) for piece in parts.steps)  # the pieces live until the end of this loop
            steps = joined.get(key)
            if steps is None:
                steps = parts.steps[0] if len(parts.steps) == 1 else np.concatenate(parts.steps)
                # Blocks end inside a step, so tags logged together need not have the same pieces: compare.
                found = (len(steps), int(steps[0]), int(steps[-1])) if len(steps) else (0, 0, 0)
                for other in alike.get(found, ()):
                    if np.array_equal(other, steps):
                        steps = other
                        break
                else:
                    alike.setdefault(found, []).append(steps)
                    steps.flags.writeable = False
                joined[key] = steps
            values = np.concatenate(parts.values, dtype=np.float64)
            replaced.append(parts.steps)
            parts.steps, parts.values = [steps], [values]  # joined once: a resumed read appends to them
            walls = np.concatenate(parts.walls) if self.keep_walls else None
            if walls is not None:
                parts.walls = [walls]
            out[name] = TagColumn(steps, values, parts.walls_sorted, parts.first_wall, parts.last_wall, walls)
        return out


def _parse_other(
    parse: Callable[[memoryview], Any],
    view: memoryview,
    records: np.ndarray,
    begins: np.ndarray,
    lengths: np.ndarray,
    path: Path,
    offset: int,
) -> tuple[list[str], list[int], list[float], list[float], list[int], list[tuple[int, int]]]:
    """The records the array decoding left, through protobuf: their scalar points (tag, step, value, wall time,
    record) and the ``(record, step)`` of each SessionLog START."""
    tags: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    order: list[int] = []
    session_starts: list[tuple[int, int]] = []
    for record, begin, length in zip(records.tolist(), begins.tolist(), lengths.tolist(), strict=True):
        try:
            event = parse(view[begin : begin + length])
        except Exception as exc:  # protobuf's DecodeError; a bad payload with a good CRC
            raise InputError(
                f"{path}: record at byte {offset + begin - _HEADER} is not a TensorBoard Event ({exc})",
                hint="pass TensorBoard event files (events.out.tfevents.*)",
            ) from exc
        kind = event.WhichOneof("what")
        if kind == "summary":
            step, wall = event.step, event.wall_time
            for value in event.summary.value:
                which = value.WhichOneof("value")
                if which == "simple_value":
                    number = value.simple_value
                elif which == "tensor":
                    plugin = value.metadata.plugin_data.plugin_name
                    if plugin and plugin != "scalars":
                        continue
                    scalar = _tensor_scalar(value.tensor)
                    if scalar is None:
                        continue
                    number = scalar
                else:
                    continue
                tags.append(value.tag)
                steps.append(step)
                values.append(number)
                walls.append(wall)
                order.append(record)
        elif kind == "session_log" and event.session_log.status == _SESSION_START:
            session_starts.append((record, event.step))
    return tags, steps, values, walls, order, session_starts


def read_event_file(
    path: str | Path,
    *,
    start: int = 0,
    stop: int | None = None,
    keep_walls: bool = False,
    resume: EventFileRead | None = None,
) -> EventFileRead:
    """Read the scalars of one event file from byte ``start`` on (0: the whole file), up to ``stop`` (the end).

    The file is read :data:`CHUNK_BYTES` at a time into one buffer; each block's records are walked, checked and
    decoded, and their points added to per-tag typed arrays (a tag with more than
    :data:`~collapse_doctor.core.fold.FOLD_CAP` points folded into step buckets as it is read). Wall times are kept
    only with ``keep_walls`` (what :func:`merge_reads` asks for when a tag's duplicates cannot be resolved without
    them). ``resume``, an earlier read of the same file that ended at ``start``, is continued: the result covers
    both (``ScalarCache``), its state is taken over (do not use ``resume`` after).
    """
    from tensorboard.compat.proto.event_pb2 import Event

    path = input_path(path)  # a RemotePath stays one
    source = _Source(path, start, stop)
    try:
        return _read_blocks(path, start, source, keep_walls, Event.FromString, resume)
    finally:
        source.close()


def _read_blocks(
    path: Path,
    start: int,
    source: _Source,
    keep_walls: bool,
    parse: Callable[[memoryview], Any],
    resume: EventFileRead | None = None,
) -> EventFileRead:
    capacity = min(CHUNK_BYTES, max(source.size, _HEADER))
    buf = np.zeros(capacity + _ROOM, dtype=np.uint8)
    columns = _Columns(keep_walls) if resume is None else resume.state
    filled = 0  # bytes in buf: an incomplete record carried over, then what was read after it
    base = start  # the file offset of buf[0]
    records = decoded = purged = 0
    session_starts: list[tuple[int, int]] = []
    if resume is not None:
        records, decoded, purged = resume.records, resume.decoded, resume.purged
        session_starts = list(resume.session_starts)
    pool = None
    try:
        while True:
            got = source.fill(buf, filled, capacity)
            filled += got
            at_end = filled < capacity or source.size == base - start + filled
            buf[filled : filled + _ROOM] = 0
            starts, lengths, _, bad_tail = _walk(buf[:filled])
            if len(starts):
                parallel = len(starts) >= PARALLEL_CHECK_RECORDS
                if parallel and pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    pool = ThreadPoolExecutor(1, thread_name_prefix="collapse-doctor-crc")
                points, dropped, starts_here = _block(
                    buf, starts, lengths, path, base, records, columns, parse, pool if parallel else None
                )
                decoded += points
                purged += dropped
                session_starts += starts_here
                records += len(starts)
            if bad_tail is not None:
                _corrupt(path, base + bad_tail, "length")
            done = int(starts[-1] + _HEADER + lengths[-1] + _FOOTER) if len(starts) else 0
            rest = filled - done
            if at_end:
                break
            buf[:rest] = buf[done:filled].copy()
            base += done
            filled = rest
            size = int.from_bytes(buf[:8].tobytes(), "little") + _HEADER + _FOOTER if rest >= _HEADER else 0
            if size > capacity:  # one record longer than the block (its length checksum is good: _walk checked it)
                capacity = min(size, rest + source.size - (base - start + rest))
                capacity = max(capacity, rest + 1)
                grown = np.zeros(capacity + _ROOM, dtype=np.uint8)
                grown[:rest] = buf[:rest]
                buf = grown
            elif capacity > CHUNK_BYTES and rest < CHUNK_BYTES:
                smaller = np.zeros(CHUNK_BYTES + _ROOM, dtype=np.uint8)
                smaller[:rest] = buf[:rest]
                buf, capacity = smaller, CHUNK_BYTES
    finally:
        if pool is not None:
            pool.shutdown()
    tags = columns.finish()
    return EventFileRead(
        path=path,
        start=start if resume is None else resume.start,
        end=base + done,
        records=records,
        truncated=rest > 0,
        tag_names=list(tags),
        session_starts=session_starts,
        columns=tags,
        purged=purged,
        decoded=decoded,
        state=columns,
    )


def _block(
    buf: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    path: Path,
    base: int,
    first_record: int,
    columns: _Columns,
    parse: Callable[[memoryview], Any],
    pool: Any,
) -> tuple[int, int, list[tuple[int, int]]]:
    """Check, decode and gather the complete records of one block: (points, points purged, SessionLog STARTs).

    The checksums and the decoding are independent array work that releases the GIL: with a ``pool`` the checks
    run on its thread while the records are decoded, and their verdict comes first (the first bad record, whatever
    the decoding ran into)."""
    payloads = starts + _HEADER
    if pool is not None:
        checked = pool.submit(_check_crcs, buf, starts, lengths, path, base)
        try:
            fast = decode_simple_values(buf, payloads, lengths)
        except Exception:
            checked.result()  # a bad checksum is the error to report, not what decoding it ran into
            raise
        checked.result()  # a bad checksum is raised here, before anything decoded is used
    else:
        _check_crcs(buf, starts, lengths, path, base)
        fast = decode_simple_values(buf, payloads, lengths)
    rest = np.flatnonzero(~fast.matched)
    names = fast.tag_names
    tag_ids, steps, values, walls = fast.tag_index, fast.steps, fast.values, fast.wall_times
    record = fast.records
    session_starts: list[tuple[int, int]] = []
    if len(rest):
        other_tags, other_steps, other_values, other_walls, other_records, session_starts = _parse_other(
            parse, buf.data, rest, payloads[rest], lengths[rest], path, base
        )
        if other_tags:
            ids = {name: i for i, name in enumerate(names)}
            names = list(names)
            other_ids = [ids.setdefault(tag, len(ids)) for tag in other_tags]
            names += list(ids)[len(names) :]
            tag_ids = np.concatenate([tag_ids, np.asarray(other_ids, dtype=np.int32)])
            steps = np.concatenate([steps, np.asarray(other_steps, dtype=np.int64)])
            values = np.concatenate([values, np.asarray(other_values, dtype=np.float64)])
            walls = np.concatenate([walls, np.asarray(other_walls, dtype=np.float64)])
            record = np.concatenate([record, np.asarray(other_records, dtype=np.int64)])
            order = np.argsort(record, kind="stable")  # record order; a record's own values in their order
            tag_ids, steps, values, walls, record = (
                tag_ids[order],
                steps[order],
                values[order],
                walls[order],
                record[order],
            )
    points = len(steps)
    purged = 0
    lo = 0
    # A START at record r purges what was logged before it at its step or later: the points before r are added,
    # then purged, then the rest come (so a long tag's fold sees the same sequence however the file is cut).
    for at, step in sorted(session_starts):
        hi = int(np.searchsorted(record, at))
        columns.add(names, tag_ids[lo:hi], steps[lo:hi], values[lo:hi], walls[lo:hi])
        purged += columns.purge(step)
        lo = hi
    columns.add(names, tag_ids[lo:], steps[lo:], values[lo:], walls[lo:])
    return points, purged, [(first_record + at, step) for at, step in session_starts]


@dataclass
class ScalarLog:
    """All scalar tags of one run (one or more event files), deduplicated."""

    files: tuple[Path, ...]
    tags: dict[str, TagPoints]
    points: int
    """Scalar points read (before duplicates and purged points were dropped)."""
    duplicates: int = 0
    """Points dropped because a later point of the same (tag, step) was kept (bookkeeping tags included)."""
    purged: int = 0
    truncated: tuple[Path, ...] = ()
    duplicate_tags: dict[str, int] = field(default_factory=dict)
    """``{tag: points dropped as duplicates}``."""
    folded: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """``{tag: (points, buckets, steps per bucket)}`` of the tags read in step buckets
    (:mod:`collapse_doctor.core.fold`)."""

    @property
    def restart_duplicates(self) -> dict[str, int]:
        """The duplicated tags that are training metrics (trainer bookkeeping written again at the end left out)."""
        return {tag: n for tag, n in self.duplicate_tags.items() if not is_bookkeeping(tag)}

    def notes(self) -> list[str]:
        out = [f"{p}: last record incomplete (still being written?); read up to it" for p in self.truncated]
        repeated = self.restart_duplicates
        if repeated:
            points = sum(repeated.values())
            names = sorted(repeated, key=lambda t: (-repeated[t], t))
            shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
            if len(repeated) > 1:
                out.append(
                    f"{points} scalar point(s) of {len(repeated)} tags logged again for steps already logged "
                    f"(restart?): kept the latest ({shown})"
                )
            else:
                out.append(f"{points} scalar point(s) of {shown} logged twice for a step: kept the latest")
        if self.purged:
            out.append(f"{self.purged} scalar point(s) dropped by a SessionLog START (restart from a checkpoint)")
        if self.folded:
            out.append(folded_note(self.folded))
        return out


def folded_note(folded: dict[str, tuple[int, int, int]]) -> str:
    """One line naming the series read in step buckets.

    >>> folded_note({"train/kl": (1_000_000, 15_625, 64)}).split(" (")[0]
    'train/kl: 1,000,000 points read as 15,625 buckets of 64 steps'
    """
    shown = [f"{tag}: {n:,} points read as {b:,} buckets of {w:,} steps" for tag, (n, b, w) in folded.items()]
    why = f"longer than {folding.FOLD_CAP:,} points is judged on its step buckets: mean, minimum, maximum"
    if len(shown) == 1:
        return f"{shown[0]} (a series {why})"
    more = f", ... ({len(shown) - 3} more)" if len(shown) > 3 else ""
    return f"{len(shown)} tags read in step buckets (each {why}): " + "; ".join(shown[:3]) + more


def merge_reads(reads: Sequence[EventFileRead]) -> ScalarLog:
    """Combine the reads of one run's files (in the order given; a file's successive parts in their order):
    SessionLog purges, then the latest wall time per (tag, step).

    A START in a read purges the points of every earlier read at its step or later (its own read's earlier points
    were purged when it was read). A tag whose steps keep rising needs nothing more; a step logged again keeps its
    last point when the tag's wall times never decrease, else the point with the latest wall time (then, rarely,
    a read that did not keep its wall times is read again with them)."""
    reads = list(reads)
    merged = _merge(reads)
    if isinstance(merged, set):
        for i in merged:
            read = reads[i]
            reads[i] = read_event_file(read.path, start=read.start, stop=read.end, keep_walls=True)
        merged = _merge(reads)
        assert isinstance(merged, ScalarLog)
    return merged


def _flat_columns(read: EventFileRead) -> tuple[dict[str, TagColumn], int]:
    """A flat read (other formats) in column form, its own SessionLog purges applied: (columns, points purged)."""
    tag, step, seq = read.tag_index, read.steps, read.order
    keep = np.ones(len(step), dtype=bool)
    for mark, start_step in read.session_starts:
        keep &= ~((seq < mark) & (step >= start_step))
    rows = np.flatnonzero(keep)
    rows = rows[np.lexsort((seq[rows], tag[rows]))]  # by tag, then record (ties in the order given)
    columns: dict[str, TagColumn] = {}
    counts = np.bincount(tag[rows], minlength=len(read.tag_names)) if len(rows) else np.zeros(0, np.int64)
    lo = 0
    for index, count in enumerate(counts.tolist()):
        if not count:
            continue
        part = rows[lo : lo + count]
        lo += count
        walls = np.asarray(read.wall_times[part], dtype=np.float64)
        columns[read.tag_names[index]] = TagColumn(
            steps=np.asarray(step[part], dtype=np.int64),
            values=np.asarray(read.values[part], dtype=np.float64),
            walls_sorted=bool(np.all(walls[1:] >= walls[:-1])),
            first_wall=float(walls[0]),
            last_wall=float(walls[-1]),
            walls=walls,
        )
    return columns, int(len(step) - len(rows))


def _kept_points(steps: np.ndarray, walls: np.ndarray | None) -> np.ndarray:
    """Positions of the point kept for each step, in step order: the latest wall time, then the last logged (with
    ``walls`` None the wall times never decrease: the last logged).

    >>> _kept_points(np.array([1, 2, 2, 0]), None).tolist()
    [3, 0, 2]
    >>> _kept_points(np.array([2, 2]), np.array([5.0, 4.0])).tolist()
    [0]
    """
    order = np.argsort(steps, kind="stable") if walls is None else np.lexsort((walls, steps))
    ordered = steps[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    return order[last]


def _merge(reads: list[EventFileRead]) -> ScalarLog | set[int]:
    """:func:`merge_reads`, or the reads whose wall times the duplicates of some tag need."""
    per_tag: dict[str, list[tuple[int, TagColumn]]] = {}
    purged = 0
    bounds: list[float] = []
    for i, read in enumerate(reads):
        if read.columns is None:
            columns, own = _flat_columns(read)
        else:
            columns, own = read.columns, read.purged
        purged += own
        for name, column in columns.items():
            per_tag.setdefault(name, []).append((i, column))
        bounds.append(min((float(step) for _, step in read.session_starts), default=np.inf))
    # later[i]: the lowest step from which a START in a read after read i purges (inf: none)
    later = np.minimum.accumulate(np.asarray([*bounds[1:], np.inf])[::-1])[::-1]
    need: set[int] = set()
    tags: dict[str, TagPoints] = {}
    duplicate_tags: dict[str, int] = {}
    folded: dict[str, tuple[int, int, int]] = {}
    for name, parts in per_tag.items():
        if any(column.fold is not None for _, column in parts):
            fold, dropped = _folded_parts(parts, bounds)
            purged += dropped
            fold = fold.finished()
            steps, values, buckets = fold.result()
            if buckets is None:  # purged back to at most the cap before any was folded: the points themselves
                kept = _kept_points(steps, None)
                if len(kept) < len(steps):
                    duplicate_tags[name] = len(steps) - len(kept)
                steps, values = steps[kept], values[kept]
            elif fold.duplicates:
                duplicate_tags[name] = fold.duplicates
            if len(steps):
                tags[name] = TagPoints(steps, values, buckets)
            if buckets is not None and len(steps):
                folded[name] = (buckets.total, len(steps), buckets.width)
            continue
        steps_parts, values_parts, walls_parts = [], [], []
        for i, column in parts:
            steps, values, walls = column.steps, column.values, column.walls
            if later[i] < np.inf:
                keep = steps < later[i]
                if not keep.all():
                    purged += int(len(keep) - keep.sum())
                    steps, values = steps[keep], values[keep]
                    walls = None if walls is None else walls[keep]
            steps_parts.append(steps)
            values_parts.append(values)
            walls_parts.append(walls)
        steps = steps_parts[0] if len(parts) == 1 else np.concatenate(steps_parts)
        values = values_parts[0] if len(parts) == 1 else np.concatenate(values_parts)
        if not len(steps):
            continue
        if len(steps) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
            shown = [column for _, column in parts if len(column.steps)]
            in_order = all(c.walls_sorted for c in shown) and all(
                later_column.first_wall >= column.last_wall for column, later_column in pairwise(shown)
            )
            if in_order:
                kept = _kept_points(steps, None)
            elif all(w is not None for w in walls_parts):
                kept = _kept_points(steps, np.concatenate([w for w in walls_parts if w is not None]))
            else:
                need.update(i for (i, _), w in zip(parts, walls_parts, strict=True) if w is None)
                continue
            if len(kept) < len(steps):
                duplicate_tags[name] = len(steps) - len(kept)
            steps, values = steps[kept], values[kept]
        if len(steps) > folding.FOLD_CAP:  # files or parts each short enough, together too long
            steps, values, buckets = fold_series(steps, values)
            tags[name] = TagPoints(steps, values, buckets)
            folded[name] = (buckets.total, len(steps), buckets.width)
            continue
        tags[name] = TagPoints(steps, values)
    if need:
        return need
    last_read: dict[Path, EventFileRead] = {}
    for read in reads:
        last_read[read.path] = read
    return ScalarLog(
        files=tuple(last_read),
        tags=dict(sorted(tags.items())),
        points=sum(read.points for read in reads),
        duplicates=sum(duplicate_tags.values()),
        duplicate_tags=dict(sorted(duplicate_tags.items())),
        purged=purged,
        truncated=tuple(path for path, read in last_read.items() if read.truncated),
        folded=dict(sorted(folded.items())),
    )


def _folded_parts(parts: list[tuple[int, TagColumn]], bounds: list[float]) -> tuple[SeriesFold, int]:
    """One tag's parts (some folded) as one fold, in read order: each read's SessionLog STARTs purge what the reads
    before it hold, its points come after theirs. The fold and the points those purges dropped."""
    fold: SeriesFold | None = None
    dropped = 0
    for i, column in parts:
        if fold is not None and bounds[i] < np.inf:
            dropped += fold.truncate(int(bounds[i]))
        if column.fold is not None:
            fold = column.fold.copy() if fold is None else fold.extend(column.fold)
        else:
            fold = fold or SeriesFold()
            fold.add(column.steps, column.values)
    assert fold is not None
    return fold, dropped
