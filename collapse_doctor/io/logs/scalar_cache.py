"""Reading a run's scalar log files again and again, parsing only what was appended since the last read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from collapse_doctor.io.formats import scalar_format
from collapse_doctor.io.logs.tensorboard import EventFileRead, ScalarLog, merge_reads, read_event_file


class ScalarCache:
    """Remembers what was read of each growing scalar file; a new read parses only the bytes added since.

    Event files and verl file logs only grow (a record or line at a time; their formats ``append``), so
    ``watch`` keeps one cache and calls :meth:`read` every poll. A file that shrank (rotated, rewritten) is read
    again from the start. Files of formats that are rewritten in place (``trainer_state.json``) are read whole
    every time.
    """

    def __init__(self) -> None:
        self._reads: dict[Path, list[EventFileRead]] = {}

    def read(self, files: Sequence[Path], kind: str | None = None, *, member: str | None = None) -> ScalarLog:
        """The scalars of one run's files of one kind (default: each file's own), read in name order (which
        TensorBoard makes time order) and merged: SessionLog purges, latest wall time per (tag, step).

        ``member`` selects one run of a file that holds several (a tracker database: its format's
        ``read_member``); such files are read whole every time."""
        ordered = sorted(files, key=lambda p: (p.name, str(p)))
        parts: list[EventFileRead] = []
        for path in ordered:
            fmt = scalar_format(kind, path)
            assert fmt.read is not None  # every scalar format reads
            if member is not None and fmt.read_member is not None:
                parts.append(fmt.read_member(path, member))
                continue
            if not fmt.appends:
                parts.append(fmt.read(path, 0))
                continue
            done = self._reads.setdefault(path, [])
            offset = done[-1].end if done else 0
            try:
                size = path.stat().st_size
            except OSError:
                size = offset
            if size < offset:
                done.clear()
                offset = 0
            if size > offset or not done:
                if done and done[-1].state is not None:  # an event file: its tags' state goes on (long tags fold)
                    done[-1] = read_event_file(path, start=offset, resume=done[-1])
                    parts.extend(done)
                    continue
                part = fmt.read(path, offset)
                if part.records or not done:
                    done.append(part)
            parts.extend(done)  # a file's parts in order: merge_reads treats them as the file read at once
        return merge_reads(parts)
