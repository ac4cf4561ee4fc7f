"""ReadAhead: a reader's chunks pulled on their own thread, in order, errors where they happened, stoppable."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.engine.reduce import ReadAhead


def _chunks(n: int, fail_at: int | None = None, seen: list[int] | None = None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise InputError(f"chunk {i}: bad rows")
        if seen is not None:
            seen.append(i)
        yield i


def _threads() -> int:
    return sum(t.name == "collapse-doctor-read" for t in threading.enumerate())


def test_chunks_come_in_order_and_the_thread_ends() -> None:
    ahead = ReadAhead(_chunks(50))  # type: ignore[arg-type]
    assert list(ahead) == list(range(50))
    ahead.close()
    assert _threads() == 0


def test_an_error_is_raised_after_the_chunks_before_it() -> None:
    ahead = ReadAhead(_chunks(10, fail_at=4))  # type: ignore[arg-type]
    got: list[int] = []
    with pytest.raises(InputError, match="chunk 4: bad rows"):
        got.extend(ahead)
    ahead.close()
    assert got == [0, 1, 2, 3]


def test_close_stops_reading_early() -> None:
    seen: list[int] = []
    ahead = ReadAhead(_chunks(10_000, seen=seen), depth=2)  # type: ignore[arg-type]
    iterator = iter(ahead)
    assert next(iterator) == 0
    ahead.close()
    assert _threads() == 0 and len(seen) <= 5  # at most the queue's depth (and one in hand) read ahead


def test_iterating_again_after_the_end_or_close_does_not_hang() -> None:
    ahead = ReadAhead(_chunks(3))  # type: ignore[arg-type]
    assert list(ahead) == [0, 1, 2] and list(ahead) == []
    ahead.close()
    failed = ReadAhead(_chunks(3, fail_at=1))  # type: ignore[arg-type]
    for _ in range(2):  # the error again, not a wait on an empty queue
        with pytest.raises(InputError):
            list(failed)
    failed.close()
    closed = ReadAhead(_chunks(10_000))  # type: ignore[arg-type]
    closed.close()
    assert list(closed) == []
