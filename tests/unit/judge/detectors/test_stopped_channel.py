"""CD103: a reward channel that stops being produced (a judge that fails and returns None from some step on).

Runs of 60 steps x 16 groups x 8 rollouts, two binary channels (``format`` p = 0.6, ``correct`` p = 0.4). Expected,
from the construction (persistence: 3 steps, 5% of 60):

- ``correct`` None on every row from step 40: it had values on every rollout for 40 steps, then on none of the
  2,560 rollouts of steps 40-59 (20 steps, far over the 3-step persistence): a warning naming step 40;
- ``correct`` None from step 58 only: 2 silent steps, under the persistence: no finding;
- ``correct`` None on one row in three throughout (a sometimes-applicable reward): never silent for a step, so not
  stopped (and applies to 67% of rollouts, over `max_applies`: no sparse finding either).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core.findings import Severity
from collapse_doctor.core.options import ScanOptions
from tests.helpers.runs import binary_run


def _with_correct(path: Path, tmp: Path, none_where: np.ndarray | None = None, *, from_step: int | None = None) -> Path:
    table = pq.read_table(
        binary_run(tmp / "base.parquet", pass_rates={"format": 0.6, "correct": 0.4}, steps=60, seed=1)
    )
    values = table["reward/correct"].to_numpy().astype(np.float64).copy()
    steps = table["step"].to_numpy()
    if from_step is not None:
        values[steps >= from_step] = np.nan
    if none_where is not None:
        values[none_where[: len(values)]] = np.nan
    index = table.schema.get_field_index("reward/correct")
    pq.write_table(table.set_column(index, "reward/correct", pa.array(values)), path)
    return path


def _cd103(path: Path) -> list:  # type: ignore[type-arg]
    return [f for f in diagnose([path], ScanOptions.of(device="cpu")).findings if f.code == "CD103"]


def test_a_channel_that_stopped_is_a_warning_naming_the_step(tmp_path: Path) -> None:
    [found] = _cd103(_with_correct(tmp_path / "stopped.parquet", tmp_path, from_step=40))
    assert found.severity == Severity.WARNING and found.channels == ("correct",)
    assert found.title == "`correct` stopped: no value since step 40" and found.step_range == (40, 59)
    assert found.evidence["last_step_with_value"] == 39 and found.evidence["rollouts_without_value"] == 20 * 16 * 8
    assert found.evidence["applies_share_before"] == 1.0


def test_a_short_silence_at_the_end_is_no_finding(tmp_path: Path) -> None:
    assert _cd103(_with_correct(tmp_path / "short.parquet", tmp_path, from_step=58)) == []


def test_a_sometimes_applicable_channel_is_not_stopped(tmp_path: Path) -> None:
    every_third = np.arange(60 * 16 * 8) % 3 == 0
    assert _cd103(_with_correct(tmp_path / "sometimes.parquet", tmp_path, every_third)) == []


def _single(path: Path, values: np.ndarray) -> Path:
    """60 steps x 16 groups x 8 rollouts of one channel ``a`` (NaN: the reward function returned None)."""
    step = np.repeat(np.arange(60), 128)
    group = np.tile(np.repeat(np.arange(16), 8), 60)
    pq.write_table(pa.table({"step": step, "group_id": group, "reward/a": values.astype(np.float32)}), path)
    return path


def test_the_only_channel_stopping_is_a_collapse_and_counts_every_rollout(tmp_path: Path) -> None:
    # `a` (uniform, never tied) stops at step 20: steps 20-59 are 40 x 128 = 5,120 rollouts with no reward at all,
    # advantage 0 (DESIGN.md), so 5,120 / 7,680 = 2/3 of the rollouts give no gradient, and no channel is left: the
    # run trains nothing from step 20 on (critical), not "on the other channels alone".
    rng = np.random.default_rng(0)
    values = rng.random(60 * 128)
    values[np.repeat(np.arange(60), 128) >= 20] = np.nan
    diagnosis = diagnose([_single(tmp_path / "r.parquet", values)], ScanOptions.of(device="cpu"))
    [stopped] = [f for f in diagnosis.findings if f.code == "CD103"]
    assert stopped.severity == Severity.CRITICAL and diagnosis.verdict == "collapsed"
    assert stopped.evidence["rollouts_without_value"] == 5120 and "other channels" not in stopped.message
    assert diagnosis.run.signal["zero_advantage_rollout_share"] == pytest.approx(2 / 3, abs=1e-3)


def test_rollouts_without_any_reward_count_as_no_gradient(tmp_path: Path) -> None:
    # 8 of 7,680 rollouts scored: 99.9% have advantage 0. Before, the budget was taken over the 8 scored rows
    # ("0% gave no gradient") and the run was HEALTHY.
    values = np.full(60 * 128, np.nan)
    values[:8] = np.random.default_rng(1).random(8)
    diagnosis = diagnose([_single(tmp_path / "r.parquet", values)], ScanOptions.of(device="cpu"))
    [unscored] = [f for f in diagnosis.findings if f.code == "CD103"]
    assert unscored.severity == Severity.CRITICAL and diagnosis.verdict == "collapsed"
    assert unscored.evidence["unscored_rollouts"] == 7672
    assert diagnosis.run.signal["zero_advantage_rollout_share"] == pytest.approx(7672 / 7680)


def test_half_the_rollouts_unscored_is_a_warning_not_a_collapse(tmp_path: Path) -> None:
    # Every other rollout unscored (exactly 50%, over `max_unscored` only by the >; here 5 of 8 per group: 62.5%):
    # waste, the rest still trains: a warning; the budget counts them (0.625 of rollouts, no tie among the others).
    values = np.random.default_rng(2).random(60 * 128)
    values[np.tile(np.arange(8), 60 * 16) < 5] = np.nan
    diagnosis = diagnose([_single(tmp_path / "r.parquet", values)], ScanOptions.of(device="cpu"))
    [unscored] = [f for f in diagnosis.findings if f.code == "CD103"]
    assert unscored.severity == Severity.WARNING and diagnosis.verdict == "at_risk"
    assert diagnosis.run.signal["zero_advantage_rollout_share"] == pytest.approx(0.625)
