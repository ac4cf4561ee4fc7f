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

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.io.logs.crc32c import NATIVE_CRC, VECTOR_MAX_BYTES, masked_crc32c, masked_crc32c_many
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
class EventFileRead:
    """The scalars of one event file (or of the part read from ``start`` on), in record order."""

    path: Path
    start: int
    end: int
    """Byte offset just past the last complete record: where the next read resumes."""
    records: int
    truncated: bool
    tag_names: list[str]
    tag_index: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray
    order: np.ndarray
    """Record number of each point within this read (for SessionLog purges)."""
    session_starts: list[tuple[int, int]] = field(default_factory=list)
    """``(record number, step)`` of each ``SessionLog.START``."""

    @property
    def points(self) -> int:
        return len(self.steps)


PARALLEL_CHECK_RECORDS = 100_000
"""Files with this many records check their CRCs on a second thread while the records are decoded."""


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


def _walk(data: bytes) -> tuple[np.ndarray, np.ndarray, bool, int | None]:
    """Record offsets, payload lengths, ``truncated`` (the data ends inside a record) and, when the last
    record's length points past the end and fails its checksum, that record's offset (corrupt, not cut).

    Each record's offset follows from the previous one's length, so the walk is sequential; but the lengths of a
    scalar log repeat (every logging step writes its tags in the same order), so once the last lengths repeat
    with some period the walk guesses the next block of records from that pattern and checks every guessed
    header against the data at once: the longest prefix whose lengths all match is taken (exactly what the
    record-by-record walk finds there), and the walk goes on one record at a time from the first miss.
    """
    unpack = struct.Struct("<Q").unpack_from
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
            length = unpack(data, pos)[0] + frame
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


def _check_crcs(data: bytes, starts: np.ndarray, lengths: np.ndarray, path: Path, offset: int) -> None:
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
            if masked_crc32c(data[begin : begin + int(lengths[i])]) != int(stored[i]):
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


def read_event_file(path: str | Path, *, start: int = 0) -> EventFileRead:
    """Read the scalars of one event file from byte ``start`` on (0: the whole file)."""
    from tensorboard.compat.proto.event_pb2 import Event

    path = input_path(path)  # a RemotePath stays one
    data = read_from(path, start)
    starts, lengths, truncated, bad_tail = _walk(data)
    # The checksums and the decoding are independent array work that releases the GIL: the checks run on a
    # second thread while the records are decoded, and their verdict comes first (the first bad record, if the
    # walk went astray before).
    if len(starts) >= PARALLEL_CHECK_RECORDS:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1, thread_name_prefix="collapse-doctor-crc") as pool:
            checked = pool.submit(_check_crcs, data, starts, lengths, path, start)
            try:
                fast = decode_simple_values(data, starts + _HEADER, lengths)
            except Exception:
                checked.result()  # a bad checksum is the error to report, not what decoding it ran into
                raise
            checked.result()  # a bad checksum is raised here, before anything decoded is used
    else:
        _check_crcs(data, starts, lengths, path, start)
        fast = None
    if bad_tail is not None:
        _corrupt(path, start + bad_tail, "length")
    if fast is None:
        fast = decode_simple_values(data, starts + _HEADER, lengths)
    parse = Event.FromString
    tag_ids: dict[str, int] = {name: i for i, name in enumerate(fast.tag_names)}
    tag_index: list[int] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    order: list[int] = []
    session_starts: list[tuple[int, int]] = []
    view = memoryview(data)
    rest = np.flatnonzero(~fast.matched)
    for record, begin, length in zip(
        rest.tolist(), (starts[rest] + _HEADER).tolist(), lengths[rest].tolist(), strict=True
    ):
        try:
            event = parse(view[begin : begin + length])
        except Exception as exc:  # protobuf's DecodeError; a bad payload with a good CRC
            raise InputError(
                f"{path}: record at byte {start + begin - _HEADER} is not a TensorBoard Event ({exc})",
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
                tag = value.tag
                index = tag_ids.get(tag)
                if index is None:
                    index = tag_ids[tag] = len(tag_ids)
                tag_index.append(index)
                steps.append(step)
                values.append(number)
                walls.append(wall)
                order.append(record)
        elif kind == "session_log" and event.session_log.status == _SESSION_START:
            session_starts.append((record, event.step))
    end = start + (int(starts[-1] + _HEADER + lengths[-1] + _FOOTER) if len(starts) else 0)
    return EventFileRead(
        path=path,
        start=start,
        end=end,
        records=len(starts),
        truncated=truncated,
        tag_names=list(tag_ids),
        tag_index=np.concatenate([fast.tag_index, np.asarray(tag_index, dtype=np.int32)]),
        steps=np.concatenate([fast.steps, np.asarray(steps, dtype=np.int64)]),
        values=np.concatenate([fast.values, np.asarray(values, dtype=np.float64)]),
        wall_times=np.concatenate([fast.wall_times, np.asarray(walls, dtype=np.float64)]),
        order=np.concatenate([fast.records.astype(np.int64), np.asarray(order, dtype=np.int64)]),
        session_starts=session_starts,
    )


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
        return out


def merge_reads(reads: Sequence[EventFileRead]) -> ScalarLog:
    """Combine the reads of one run's files (in the order given): purges, then latest wall time per step."""
    names: dict[str, int] = {}
    parts_tag, parts_step, parts_value, parts_wall, parts_seq = [], [], [], [], []
    seq_offset = 0
    purge_marks: list[tuple[int, int]] = []
    for read in reads:
        remap = np.asarray([names.setdefault(n, len(names)) for n in read.tag_names], dtype=np.int32)
        parts_tag.append(remap[read.tag_index] if len(read.tag_index) else read.tag_index)
        parts_step.append(read.steps)
        parts_value.append(read.values)
        parts_wall.append(read.wall_times)
        parts_seq.append(read.order + seq_offset)
        purge_marks += [(record + seq_offset, step) for record, step in read.session_starts]
        seq_offset += read.records + 1
    tag = np.concatenate(parts_tag) if parts_tag else np.zeros(0, np.int32)
    step = np.concatenate(parts_step) if parts_step else np.zeros(0, np.int64)
    value = np.concatenate(parts_value) if parts_value else np.zeros(0)
    wall = np.concatenate(parts_wall) if parts_wall else np.zeros(0)
    seq = np.concatenate(parts_seq) if parts_seq else np.zeros(0, np.int64)
    total = len(step)
    keep = np.ones(total, dtype=bool)
    for mark, start_step in purge_marks:
        keep &= ~((seq < mark) & (step >= start_step))
    purged = int(total - keep.sum())
    tag, step, value, wall, seq = tag[keep], step[keep], value[keep], wall[keep], seq[keep]
    # Sort by tag, step, wall time, record order; the last of each (tag, step) is the latest.
    order = np.lexsort((seq, wall, step, tag))
    tag, step, value = tag[order], step[order], value[order]
    last = np.ones(len(step), dtype=bool)
    if len(step) > 1:
        last[:-1] = (tag[1:] != tag[:-1]) | (step[1:] != step[:-1])
    duplicates = int(len(step) - last.sum())
    by_index = {i: n for n, i in names.items()}
    dropped = np.bincount(tag[~last], minlength=len(names)) if duplicates else np.zeros(0, np.int64)
    duplicate_tags = {by_index[i]: int(c) for i, c in enumerate(dropped.tolist()) if c}
    tag, step, value = tag[last], step[last], value[last]
    tags: dict[str, TagPoints] = {}
    bounds = np.flatnonzero(np.diff(tag)) + 1 if len(tag) else np.zeros(0, np.int64)
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(tag)]]), strict=True):
        if hi > lo:
            tags[by_index[int(tag[lo])]] = TagPoints(step[lo:hi].copy(), value[lo:hi].copy())
    return ScalarLog(
        files=tuple(r.path for r in reads),
        tags=dict(sorted(tags.items())),
        points=total,
        duplicates=duplicates,
        duplicate_tags=duplicate_tags,
        purged=purged,
        truncated=tuple(r.path for r in reads if r.truncated),
    )
