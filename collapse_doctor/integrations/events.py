"""A synchronous TensorBoard event file for the monitor's per-step scalars.

``torch.utils.tensorboard.SummaryWriter`` hands every event to a writer thread through a queue. Inside a
training step that hand-off costs more than the statistics: the writer thread competes for the GIL with the
trainer, and each wake-up can wait a whole switch interval. The monitor writes a part's events at once, so
this writer frames them (TFRecord: ``uint64 length | masked crc32c(length) | payload | masked crc32c(payload)``)
and appends them in one write, on the calling thread.

An event file is an append-only log that readers take record by record (a torn last record fails its CRC and
is skipped), so it is appended to in place rather than replaced atomically, like every TensorBoard writer.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from collapse_doctor.io.logs.crc32c import masked_crc32c

_FILE_NUMBERS = itertools.count()


def _frames(payloads: Sequence[bytes]) -> bytes:
    """The payloads framed as TFRecord records, back to back."""
    out = bytearray()
    for payload in payloads:
        size = struct.pack("<Q", len(payload))
        out += size + struct.pack("<I", masked_crc32c(size)) + payload + struct.pack("<I", masked_crc32c(payload))
    return bytes(out)


class ScalarEventWriter:
    """Appends one event per step (all of the step's scalars in it) to a new event file in ``logdir``.

    ``purge_step``: a resumed run's first event is a ``SessionLog.START`` at that step, so readers drop the
    events of the earlier session from that step on (TensorBoard's purge, as ``SummaryWriter(purge_step=)``).
    """

    def __init__(self, logdir: Path, *, purge_step: int | None = None) -> None:
        self.logdir = logdir
        self.purge_step = purge_step
        self.path: Path | None = None
        self._file: IO[bytes] | None = None

    def _open(self) -> IO[bytes]:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        # The counter keeps two writers of one process and second apart (a resumed run in the same script).
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_NUMBERS)}"
        self.path = self.logdir / name
        handle = self.path.open("ab")
        first = [Event(wall_time=now, file_version="brain.Event:2")]
        if self.purge_step is not None:
            start = SessionLog(status=SessionLog.START)
            first.append(Event(wall_time=now, step=self.purge_step, session_log=start))
        handle.write(_frames([e.SerializeToString() for e in first]))
        return handle

    def write(self, steps: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Append one event per ``(step, {tag: value})`` and flush the file."""
        if not steps:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if self._file is None:
            self._file = self._open()
        now = time.time()
        payloads = []
        for step, values in steps:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
            payloads.append(Event(wall_time=now, step=step, summary=summary).SerializeToString())
        self._file.write(_frames(payloads))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
