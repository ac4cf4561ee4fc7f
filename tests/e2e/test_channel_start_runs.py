"""A run whose channels start at different steps (retrain's ``channel_start``) is not called a mismatch.

What a correct diagnosis says, from the math: until step 30 the trainer gave `length` weight 0, so its logged GDPO
advantages are GDPO over `correct` alone; every recomputation weights both channels, so at those steps it differs
from the log by construction, not because the log is wrong. The rollouts say which channels each step trained with
(the ``active_channels`` column retrain writes), so the scan leaves those steps out of the comparison, says so, and
raises no CD202; from step 30 on the log is plain GDPO and matches. Without the column the same rollouts do look
like a mismatch (the warning benchmarks/bench_demo_recipes.py showed on every seed of ``gdpo + channel_start``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from collapse_doctor import ScanOptions, diagnose
from collapse_doctor.engine.advantages import gdpo_advantages

STEPS, GROUPS, SIZE, START = 60, 12, 8, 30


def channel_start_run(path: Path, *, with_column: bool) -> Path:
    rng = np.random.default_rng(0)
    rows = GROUPS * SIZE
    parts = []
    for step in range(STEPS):
        correct = (rng.random(rows) < 0.5).astype(np.float32)
        length = rng.random(rows).astype(np.float32)
        active = ("correct", "length") if step >= START else ("correct",)
        weights = torch.tensor([1.0, 1.0 if "length" in active else 0.0])
        rewards = torch.from_numpy(np.stack([correct, length], axis=1))
        group = torch.arange(rows) // SIZE
        logged = gdpo_advantages(rewards, group, weights=weights).numpy()
        part = {
            "step": np.full(rows, step),
            "group_id": group.numpy(),
            "reward/correct": correct,
            "reward/length": length,
            "advantage": logged,
            "aggregation": np.array(["gdpo"] * rows),
        }
        if with_column:
            part["active_channels"] = np.array([",".join(active)] * rows)
        parts.append(pa.table(part))
    pq.write_table(pa.concat_tables(parts), path)
    return path


def test_steps_trained_with_a_channel_off_are_not_compared(tmp_path: Path) -> None:
    diagnosis = diagnose([channel_start_run(tmp_path / "run.parquet", with_column=True)], ScanOptions(device="cpu"))
    assert diagnosis.run.algorithm == "gdpo"
    assert not [f for f in diagnosis.findings if f.code == "CD202"]
    [note] = [w for w in diagnosis.run.warnings if "active_channels" in w]
    assert note.startswith(f"steps 0-{START - 1} trained with length off")
    mae = diagnosis.series["logged_mae_gdpo"]
    assert np.isnan(mae[:START]).all() and float(np.nanmax(mae[START:])) < 1e-5


def test_without_the_column_the_same_rollouts_look_like_a_mismatch(tmp_path: Path) -> None:
    diagnosis = diagnose([channel_start_run(tmp_path / "run.parquet", with_column=False)], ScanOptions(device="cpu"))
    assert [f for f in diagnosis.findings if f.code == "CD202"]
