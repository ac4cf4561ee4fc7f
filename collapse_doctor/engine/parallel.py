"""Threads without torch: the cores this process may use, and an ordered map over a few threads.

Kept apart from :mod:`collapse_doctor.engine.workers` (which imports torch) so that a scan of scalar logs only, which
never touches torch, does not pay its import.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


_core_limit: int | None = None


def limit_cores(cores: int | None) -> None:
    """Size this process's threads for ``cores`` cores (a Ray task given one CPU), ``None``: every core it may use."""
    global _core_limit
    _core_limit = cores


def available_cores() -> int:
    """Cores this process may run on (at most the :func:`limit_cores` limit)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(cores, _core_limit) if _core_limit else cores


def map_ordered(work: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[work(item) for item in items]`` on up to ``workers`` threads, results in input order; the first
    exception (in input order) is raised once every call has ended."""
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    pool = ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="collapse-doctor-run")
    try:
        futures = [pool.submit(work, item) for item in items]
        return [future.result() for future in futures]
    finally:
        # Ctrl-C, SIGTERM or a failed run: runs not started yet are dropped, the running ones finish.
        pool.shutdown(wait=True, cancel_futures=True)
