"""Small rollout tables built in code for detector tests (positive and negative cases)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.pipeline.simulate import write_simulation


def _frame(steps: int, groups: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    n = steps * groups * group_size
    step = np.repeat(np.arange(steps), groups * group_size)
    group = np.tile(np.repeat(np.arange(groups), group_size), steps)
    assert len(step) == n
    return step, group


def _trl_advantage(total: np.ndarray, group_size: int) -> np.ndarray:
    grouped = total.reshape(-1, group_size).astype(np.float64)
    dev = grouped - grouped.mean(axis=1, keepdims=True)
    std = grouped.std(axis=1, ddof=1, keepdims=True)
    return np.where(std > 0, dev / (std + 1e-4), 0.0).reshape(-1).astype(np.float32)


def write(path: Path, columns: dict[str, np.ndarray], weights: dict[str, float] | None = None) -> Path:
    table = pa.table(columns)
    if weights:
        import json

        table = table.replace_schema_metadata({"collapse_doctor.weights": json.dumps(weights)})
    pq.write_table(table, path)
    return path


def binary_run(
    path: Path,
    *,
    pass_rates: dict[str, float],
    steps: int = 120,
    groups: int = 16,
    group_size: int = 8,
    seed: int = 0,
    weights: dict[str, float] | None = None,
) -> Path:
    """Binary channels with steady pass rates, prompt difficulty shared within a group."""
    rng = np.random.default_rng(seed)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    difficulty = np.repeat(rng.normal(0, 0.5, steps * groups), group_size)
    columns: dict[str, np.ndarray] = {"step": step, "group_id": group}
    for name, rate in pass_rates.items():
        logit = np.log(rate / (1 - rate)) - difficulty + rng.normal(0, 0.3, n)
        columns[f"reward/{name}"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return write(path, columns, weights)


def zero_variance_run(path: Path, *, steps: int = 120, groups: int = 16, group_size: int = 8) -> Path:
    """A single binary channel that ends up all-pass in most groups (no gradient)."""
    rng = np.random.default_rng(1)
    step, group = _frame(steps, groups, group_size)
    rate = np.where(step < steps // 3, 0.5, 0.998)
    return write(
        path,
        {
            "step": step,
            "group_id": group,
            "reward/correct": (rng.random(len(step)) < rate).astype(np.float32),
        },
    )


def dominant_run(path: Path, *, steps: int = 120, groups: int = 16, group_size: int = 8) -> Path:
    """A binary format check next to a narrow continuous score: format decides the advantages."""
    rng = np.random.default_rng(2)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    return write(
        path,
        {
            "step": step,
            "group_id": group,
            "reward/format": (rng.random(n) < 0.5).astype(np.float32),
            "reward/correct": np.clip(rng.normal(0.5, 0.1, n), 0, 1).astype(np.float32),
        },
    )


def logged_beyond_bound_run(path: Path, *, steps: int = 120, groups: int = 16, group_size: int = 8) -> Path:
    """A healthy continuous run whose logged advantages were scaled by the batch std of a stale window."""
    rng = np.random.default_rng(3)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    correct = rng.random(n).astype(np.float32)
    style = rng.random(n).astype(np.float32)
    logged = _trl_advantage(correct + style, group_size) * np.float32(2.5)
    return write(
        path,
        {
            "step": step,
            "group_id": group,
            "reward/correct": correct,
            "reward/style": style,
            "advantage": logged,
        },
    )


def simulated(path: Path, scenario: str, *, steps: int = 200, groups: int = 16, seed: int = 0) -> Path:
    write_simulation(path, scenario, steps=steps, groups=groups, group_size=8, seed=seed)
    return path


def sparse_run(path: Path, *, steps: int = 120, groups: int = 16, group_size: int = 8) -> Path:
    """A continuous score on every row and a judge that applies (is not None) to about 10% of the rows."""
    rng = np.random.default_rng(4)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    judge = rng.random(n).astype(np.float32)
    judge[rng.random(n) >= 0.1] = np.nan
    return write(
        path,
        {"step": step, "group_id": group, "reward/score": rng.random(n).astype(np.float32), "reward/judge": judge},
    )


def lost_channel_run(path: Path, *, steps: int = 120, groups: int = 16, group_size: int = 8) -> Path:
    """`correct` passes half the time for the first third of the run, then never: the policy lost it."""
    rng = np.random.default_rng(5)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    rate = np.where(step < steps // 3, 0.5, 0.0)
    return write(
        path,
        {
            "step": step,
            "group_id": group,
            "reward/correct": (rng.random(n) < rate).astype(np.float32),
            "reward/style": rng.random(n).astype(np.float32),
        },
    )


def completions_run(
    path: Path,
    *,
    collapse_from: int | None,
    recover_at: int | None = None,
    steps: int = 120,
    groups: int = 16,
    group_size: int = 4,
) -> Path:
    """Two rewards that are deterministic functions of the completion text, with the text logged.

    Before ``collapse_from`` (and from ``recover_at`` on) every member of a group writes its own completion; in
    between every member of a group writes the same one (a collapsed policy), so every reward is constant within
    the group and its advantage is 0 under any aggregation. ``collapse_from=None``: never collapses.
    """
    rng = np.random.default_rng(7)
    step, group = _frame(steps, groups, group_size)
    n = len(step)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    texts = np.array(["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(n)], dtype=object)
    collapsed = np.zeros(n, dtype=bool)
    if collapse_from is not None:
        collapsed = (step >= collapse_from) & ((step < recover_at) if recover_at is not None else True)
    leader = (np.arange(n) // group_size) * group_size  # the first row of each row's group
    texts = np.where(collapsed, texts[leader], texts)
    length = np.array([len(t) for t in texts], dtype=np.int64)
    vowels = np.array([sum(ch in "aeiou" for ch in t) / len(t) for t in texts], dtype=np.float32)
    return write(
        path,
        {
            "step": step,
            "group_id": group,
            "prompt": np.array([f"prompt {g}" for g in group], dtype=object),
            "completion": texts,
            "completion_length": length,
            "reward/vowels": vowels,
            "reward/short": (length <= 4).astype(np.float32),
        },
    )
