"""Runs and comparisons shared by the ``--ray`` tests (tests/e2e/test_ray.py, test_ray_s3.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.runs import _trl_advantage, dominant_run


def start_local_ray() -> None:
    """A Ray instance of 2 CPUs for this test process: always a new local one (``address="local"``, as ``--ray``
    without an address starts), even where a ``ray start`` left /tmp/ray/ray_current_cluster behind (a benchmark,
    a crash); ``ray.shutdown()`` ends it."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 1024 * 1024,
    )


def assert_same(local: Any, on_ray: Any, where: str = "") -> None:
    """Equal, numbers within 1e-6 (relative and absolute): a statistic of a step is computed over the same rows,
    but torch may sum a longer chunk's tensors in another order; everything else (codes, severities, onsets,
    counts, texts) is equal exactly."""
    if isinstance(local, dict) and isinstance(on_ray, dict):
        assert local.keys() == on_ray.keys(), where
        for key in local:
            assert_same(local[key], on_ray[key], f"{where}.{key}")
    elif isinstance(local, list) and isinstance(on_ray, list):
        assert len(local) == len(on_ray), where
        for i, (a, b) in enumerate(zip(local, on_ray, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(local, float) and isinstance(on_ray, float):
        assert on_ray == pytest.approx(local, rel=1e-6, abs=1e-6), where
    else:
        assert local == on_ray and type(local) is type(on_ray), where


def multi_file_run(tmp_path: Path, *, straddling: bool = False) -> Path:
    """A run with findings (a binary format channel decides the advantages over a narrow score) and the
    advantages TRL logged, in three part files whose row groups (700 rows) do not line up with the steps (128
    rows each), so steps straddle row groups and shards start and end inside steps. ``straddling``: the files are
    cut inside steps too (steps 40 and 86 begin in one file and end in the next; such parts are one run when named
    together, not as a directory)."""
    table = pq.read_table(dominant_run(tmp_path / "whole.parquet"))
    total = (table.column("reward/format").to_numpy() + table.column("reward/correct").to_numpy()).astype(np.float32)
    table = table.append_column("advantage", pa.array(_trl_advantage(total, 8)))
    (tmp_path / "whole.parquet").unlink()
    root = tmp_path / "parts"
    root.mkdir()
    inside = (64, 24) if straddling else (0, 0)  # whole groups of 8 rows into the step
    cuts = [0, 40 * 128 + inside[0], 86 * 128 + inside[1], table.num_rows]
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        pq.write_table(table.slice(a, b - a), root / f"part-{k}.parquet", row_group_size=700)
    return root
