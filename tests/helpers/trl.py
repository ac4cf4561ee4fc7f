"""A TRL output directory written in code: completions parquets without group ids, events, a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers.scalar_runs import trl_series, write_events

GROUPS, SIZE, STEPS = 4, 8, 30


def _rewards(rng: np.random.Generator, step: int, saturate_at: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    n = GROUPS * SIZE
    fmt = (rng.random(n) < 0.6).astype(float)
    if saturate_at is not None and step >= saturate_at:
        fmt = np.ones(n)
    correct = rng.random(n)
    return fmt, correct


def trl_output_dir(root: Path, *, saturate_at: int | None = None, events: bool = True) -> Path:
    """A TRL output dir: completions/completions_<step>.parquet (no group id), runs/<date>/events, checkpoint."""
    rng = np.random.default_rng(0)
    (root / "completions").mkdir(parents=True)
    for step in range(1, STEPS + 1):
        fmt, correct = _rewards(rng, step, saturate_at)
        prompts = [f"question {step}-{g}" for g in range(GROUPS) for _ in range(SIZE)]
        total = (fmt + correct).reshape(GROUPS, SIZE)
        adv = (total - total.mean(1, keepdims=True)) / (total.std(1, ddof=1, keepdims=True) + 1e-4)
        table = pa.table(
            {
                "step": np.full(len(prompts), step),
                "prompt": prompts,
                "completion": [f"answer {i}" for i in range(len(prompts))],
                "format_reward": fmt,
                "accuracy_reward": correct,
                "advantage": adv.reshape(-1),
            }
        )
        pq.write_table(table, root / "completions" / f"completions_{step:05d}.parquet")
    if events:
        write_events(root / "runs" / "Nov30_10-00-00_host", trl_series())
    (root / "checkpoint-30").mkdir()
    (root / "checkpoint-30" / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 0.1}]}))
    return root
