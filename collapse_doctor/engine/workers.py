"""Reduce chunks on a few threads, each running torch (when a chunk needs it) single-threaded.

Torch's own (intra-op) threading splits every operation across cores and waits for all of them at
the end of each one. A scan runs hundreds of small operations per chunk, so on a machine whose cores
are also busy with something else (a training job, a test suite) each operation waits for a thread
that is not scheduled, and a scan gets many times slower. Giving each core whole chunks instead
(torch releases the GIL inside its kernels) keeps the same speed on an idle machine and degrades
gracefully on a busy one. See docs/benchmarks.md. NumPy (the dense path) is single-threaded and releases the
GIL in its loops, so the same threads serve it; torch is configured only once something imports it
(:func:`torch_for_workers`), so a scan that never needs torch never imports it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TypeVar

from collapse_doctor.engine import lazy_torch
from collapse_doctor.engine.parallel import available_cores

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 4
"""More threads would mostly hold more chunks in memory: the work is bound by memory bandwidth."""


_torch_threads_lock = threading.Lock()
_single_depth = 0
_saved_threads: int | None = None
"""Torch's thread count before the first open block set it to 1 (None: not set, e.g. torch not imported yet)."""


def _single_threaded_torch(enter: bool) -> None:
    """Torch single-threaded while any ChunkWorkers block is open (blocks of several runs scanned at once nest
    across threads: the thread count in effect before the first is restored when the last closes)."""
    global _single_depth, _saved_threads
    with _torch_threads_lock:
        _single_depth += 1 if enter else -1
        if _single_depth > 0 and _saved_threads is None and lazy_torch.imported():
            _set_single()
        elif _single_depth == 0 and _saved_threads is not None:
            lazy_torch.torch.set_num_threads(_saved_threads)
            _saved_threads = None


def torch_for_workers() -> None:
    """Call before a chunk's torch work: inside an open block, torch (imported now if need be) runs single-threaded."""
    if _saved_threads is None and _single_depth > 0:
        import torch  # noqa: F401  (imported here, outside the lock: it takes a second)

        with _torch_threads_lock:
            if _single_depth > 0 and _saved_threads is None:
                _set_single()


def _set_single() -> None:
    """Torch to one thread, remembering its count (the caller holds the lock)."""
    global _saved_threads
    _saved_threads = lazy_torch.torch.get_num_threads()
    lazy_torch.torch.set_num_threads(1)


class ChunkWorkers:
    """``map`` over chunks, in order, with up to one chunk per core in flight.

    On CPU, torch runs single-threaded inside the block (restored on exit); on a GPU the work is
    queued on the device anyway, so chunks run one at a time in the caller's thread.
    """

    def __init__(self, device: str, workers: int | None = None) -> None:
        on_cpu = device.split(":")[0] == "cpu"
        self.workers = (workers or min(MAX_WORKERS, available_cores())) if on_cpu else 1
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ChunkWorkers:
        if self.workers > 1:
            _single_threaded_torch(True)
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="collapse-doctor")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            _single_threaded_torch(False)

    def map(self, work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``work(item)`` for every item, results in input order; reading runs ahead by one item per worker."""
        if self._pool is None:
            yield from map(work, items)
            return
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(self._pool.submit(work, item))
            if len(pending) > self.workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
