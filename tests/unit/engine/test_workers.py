"""ChunkWorkers: results in input order, torch threads restored, errors surface, GPU runs inline."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from collapse_doctor.engine.workers import ChunkWorkers


def test_results_come_back_in_input_order_from_several_threads() -> None:
    threads: set[str] = set()

    def work(i: int) -> int:
        threads.add(threading.current_thread().name)
        time.sleep(0.002 * (i % 3))  # later items finish first sometimes
        assert torch.get_num_threads() == 1
        return i * i

    before = torch.get_num_threads()
    with ChunkWorkers("cpu", workers=2) as workers:
        assert list(workers.map(work, range(20))) == [i * i for i in range(20)]
    assert torch.get_num_threads() == before
    assert all(name.startswith("collapse-doctor") for name in threads)


def test_an_error_in_a_chunk_propagates_and_restores_threads() -> None:
    before = torch.get_num_threads()

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("chunk 3 is bad")
        return i

    with pytest.raises(ValueError, match="chunk 3"), ChunkWorkers("cpu", workers=2) as workers:
        list(workers.map(work, range(10)))
    assert torch.get_num_threads() == before


def test_one_worker_or_a_gpu_runs_in_the_callers_thread() -> None:
    assert ChunkWorkers("cuda").workers == 1
    caller = threading.current_thread().name
    with ChunkWorkers("cpu", workers=1) as workers:
        assert list(workers.map(lambda _: threading.current_thread().name, range(3))) == [caller] * 3


def test_blocks_open_on_several_threads_restore_torch_threads_once() -> None:
    """A sweep scans runs on several threads, each with its own ChunkWorkers block: torch stays single-threaded
    until the last block closes, then gets back the thread count it had before the first."""
    import threading

    import torch

    from collapse_doctor.engine.parallel import map_ordered
    from collapse_doctor.engine.workers import ChunkWorkers

    before = torch.get_num_threads()
    inside: list[int] = []
    barrier = threading.Barrier(3)

    def scan(i: int) -> int:
        with ChunkWorkers("cpu", workers=2):
            barrier.wait(timeout=10)  # all three blocks open at once
            inside.append(torch.get_num_threads())
            barrier.wait(timeout=10)
        return i * i

    assert map_ordered(scan, [1, 2, 3], workers=3) == [1, 4, 9]
    assert inside == [1, 1, 1] and torch.get_num_threads() == before
