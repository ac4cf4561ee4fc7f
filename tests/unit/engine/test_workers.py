"""ChunkWorkers: results in input order, torch threads restored, errors surface, GPU runs inline."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from collapse_doctor.workers import ChunkWorkers


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
