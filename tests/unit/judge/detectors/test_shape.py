"""CD201 (advantage shape) on advantages whose values the layout forces, and on ones it does not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.core.config import Config
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors.base import DetectionContext, threshold_defaults
from collapse_doctor.judge.detectors.shape import AdvantageShape, forced_support
from collapse_doctor.pipeline.scan import diagnose
from tests.helpers import runs
from tests.helpers.series import diagnose_series, make_series

# TRL's GRPO advantage of a group {0, 1}: (1 - 0.5) / (std_ddof1 + 1e-4), std_ddof1 = sqrt(0.5).
PAIR_ADVANTAGE = 0.5 / (np.sqrt(0.5) + 1e-4)


def _pairs_run(path: Path, *, second: bool = False, steps: int = 80, groups: int = 32, seed: int = 0) -> Path:
    """One binary reward (p = 0.5) in groups of 2, TRL's logged advantage; optionally a continuous second channel."""
    rng = np.random.default_rng(seed)
    step, group = runs._frame(steps, groups, 2)
    correct = (rng.random(len(step)) < 0.5).astype(np.float32)
    columns = {"step": step, "group_id": group, "reward/correct": correct}
    total = correct.astype(np.float64)
    if second:
        columns["reward/style"] = rng.random(len(step)).astype(np.float32)
        total = total + columns["reward/style"]
    columns["advantage"] = runs._trl_advantage(total, 2)
    return runs.write(path, columns)


@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_one_binary_reward_in_groups_of_two_has_no_shape_finding(tmp_path: Path, algo: str) -> None:
    """One binary reward at group size 2: no CD201 (the shape of these advantages is forced by the layout).

    A group of 2 with rewards {0, 1} gets A = +-0.5 / (sqrt(0.5) + 1e-4) = +-0.70700 (TRL: std with ddof=1,
    eps 1e-4); {0, 0} and {1, 1} get 0. So every step holds exactly the three values -0.707, 0, +0.707, and the
    groups with signal (the rows CD201's statistics cover) only +-0.707: two spikes, whose Sarle coefficient is
    about 0.77 (> 0.7) and excess kurtosis -2 at any pass rate near 0.5. That is the histogram of the group size
    and the reward levels, not of the policy: no outlier, no second mode, nothing to rebalance (there is one
    channel). Before the fix the bimodality branch fired ("advantages split into two modes", remedy "rebalance
    its weight"): its guard, the mean distinct-value ratio per group, is 2 values / 2 rows = 1.0 in every group
    with signal, above `min_distinct_ratio` by construction. The kurtosis branch did not fire (-2), and the
    outlier / lone-success branches cannot: they need groups of 4+ (the shares are NaN), as a "lone success" in a
    group of 2 is just the 1/0 pair itself. Expected: no CD201 finding, under GRPO and GDPO alike (one channel:
    GDPO's advantages are GRPO's up to the batch step).
    """
    path = _pairs_run(tmp_path / "pairs.parquet")
    logged = np.unique(np.round(runs.pq.read_table(path)["advantage"].to_numpy(), 5))
    assert logged.tolist() == pytest.approx([-PAIR_ADVANTAGE, 0.0, PAIR_ADVANTAGE], abs=1e-5)

    diagnosis = diagnose([path], ScanOptions.of(device="cpu", algo=algo))
    series = diagnosis.series
    assert series is not None
    # Why the old guard let it through: the shape statistics look bimodal, and the ratio is 1 by construction.
    assert np.nanmedian(series["adv_bimodality_grpo"]) > 0.7
    assert np.nanmedian(series["adv_kurtosis_grpo"]) == pytest.approx(-2.0, abs=0.05)
    assert np.all(series["distinct_ratio_grpo"] == 1.0)
    assert np.all(np.isnan(series["outlier_group_share"])) and np.all(np.isnan(series["outlier_lone_share"]))
    assert [f.title for f in diagnosis.findings if f.code == "CD201"] == []


def test_groups_of_two_with_a_continuous_second_channel_have_no_shape_finding(tmp_path: Path) -> None:
    """Groups of 2 force +-1/sqrt(2) under GRPO whatever the rewards, and a small lattice under GDPO (5 values with
    two equally weighted channels): still no CD201."""
    path = _pairs_run(tmp_path / "pairs2.parquet", second=True)
    for algo in ("grpo", "gdpo"):
        diagnosis = diagnose([path], ScanOptions.of(device="cpu", algo=algo))
        assert [f.title for f in diagnosis.findings if f.code == "CD201"] == [], algo


def test_forced_support_counts_the_group_of_two_lattice() -> None:
    series = make_series(10, channels=("a", "b", "c"), group_size_max=np.r_[np.full(5, 2.0), np.full(5, 8.0)])
    assert forced_support(series, {}, "grpo").tolist() == [2.0] * 5 + [np.inf] * 5
    assert forced_support(series, {}, "gdpo")[:5].tolist() == [7.0] * 5  # 0, +-1, +-2, +-3
    assert forced_support(series, {"a": 1.0, "b": 0.6, "c": 0.25}, "gdpo")[0] == 27.0  # every sign pattern differs


def test_min_support_is_configurable() -> None:
    """With three unequally weighted channels GDPO's group-of-2 lattice has 27 values: judged at the default 10,
    not when `min_support` asks for more; with equal weights (7 values) not judged at the default."""
    series = make_series(
        100, channels=("a", "b", "c"), group_size_max=2.0, adv_bimodality_gdpo=0.9, distinct_ratio_gdpo=1.0
    )
    unequal = {"a": 1.0, "b": 0.6, "c": 0.25}
    diagnosis = diagnose_series(series, algorithm="gdpo", weights=unequal, codes=("CD201",))
    assert [f.title for f in diagnosis.findings] == ["advantages split into two modes"]
    assert not diagnose_series(series, algorithm="gdpo", codes=("CD201",)).findings

    run = replace(diagnosis.run, weights=unequal)
    config = Config(thresholds={"CD201": {"min_support": 30}}, defaults=threshold_defaults())
    assert AdvantageShape().detect(DetectionContext(run=run, series=series, config=config)) == []


def test_real_bimodality_at_group_size_16_still_fires(tmp_path: Path) -> None:
    """Group size 16, a binary channel (weight 0.1) and a continuous one with two separated modes (0 or 1, plus
    noise 0.03) inside every group: every completion has its own advantage (ratio 1, support unbounded), and the
    batch distribution is bimodal (coefficient ~0.74): CD201 warns, and with two channels asks to rebalance. 32 groups
    a step (512 rows) measure the per-step coefficient to a few hundredths, so its current window (the last 8 steps)
    stays above the 0.7 cut as the whole run does: the condition holds through it and is graded a warning."""
    rng = np.random.default_rng(1)
    step, group = runs._frame(80, 32, 16)
    n = len(step)
    columns = {
        "step": step,
        "group_id": group,
        "reward/correct": (rng.random(n) < 0.5).astype(np.float32),
        "reward/quality": (np.where(rng.random(n) < 0.5, 0.0, 1.0) + rng.normal(0, 0.03, n)).astype(np.float32),
    }
    path = runs.write(tmp_path / "bimodal.parquet", columns, {"correct": 0.1, "quality": 1.0})
    [finding] = [f for f in diagnose([path], ScanOptions.of(device="cpu")).findings if f.code == "CD201"]
    assert finding.title == "advantages split into two modes"
    assert "rebalance" in finding.remedy


def test_outlier_groups_scenario_still_fires(tmp_path: Path) -> None:
    """The simulator's outlier-groups scenario (groups of 8, a heavy-tailed channel): its CD201 is unchanged."""
    diagnosis = diagnose(
        [runs.simulated(tmp_path / "outliers.parquet", "outlier-groups")], ScanOptions.of(device="cpu")
    )
    titles = [f.title for f in diagnosis.findings if f.code == "CD201"]
    assert "outlier completions dominate their groups" in titles


def _few_levels_run(path: Path, size: int, rewards: str) -> Path:
    rng = np.random.default_rng(size)
    step, group = runs._frame(60, 32, size)
    n = len(step)
    columns: dict[str, np.ndarray] = {"step": step, "group_id": group}
    if rewards == "three levels":
        columns["reward/a"] = rng.integers(0, 3, n) / 2
    elif rewards == "two binaries":
        columns["reward/a"] = (rng.random(n) < 0.5).astype(np.float64)
        columns["reward/b"] = (rng.random(n) < 0.3).astype(np.float64)
    else:  # a ranking: every group holds 0..size-1 in some order
        columns["reward/a"] = np.concatenate([rng.permutation(size) for _ in range(n // size)]).astype(np.float64)
    return runs.write(path, columns)


@pytest.mark.parametrize("size", [3, 4, 8])
@pytest.mark.parametrize("rewards", ["three levels", "two binaries", "a ranking"])
@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_few_reward_levels_at_group_sizes_above_two_have_no_shape_finding(
    tmp_path: Path, size: int, rewards: str, algo: str
) -> None:
    """At n >= 3 the layout forces no fixed lattice, but few reward levels force few advantage values. Expected from
    the math, for every case: no bimodality and no heavy tails.

    - Three levels or two binaries (totals 0, 1, 2): a group holds at most 3 distinct totals, so at most 3 distinct
      advantages. At n >= 4 its distinct-value ratio is at most 3/4 < `min_distinct_ratio` (0.9); at n = 3 a group
      is all distinct only when its three totals differ (3!/27 = 0.22 of groups for three equal levels; for the
      binaries, P(total 0, 1, 2) = 0.35, 0.5, 0.15 and 3! x 0.35 x 0.5 x 0.15 = 0.16), and the others give 2/3,
      so the mean ratio over groups with signal is near 0.75: never judged.
    - A ranking (every group a permutation of 0..n-1): every completion has its own advantage (ratio 1), but every
      group has the same n values, evenly spaced: the batch is a uniform n-point lattice, whose bimodality
      coefficient 1 / (excess kurtosis + 3) is 2/3 at n = 3 and falls towards 5/9 as n grows, under the 0.7 cut,
      and whose excess kurtosis is negative: no finding, although the support is only n values.
    """
    path = _few_levels_run(tmp_path / "levels.parquet", size, rewards)
    diagnosis = diagnose([path], ScanOptions.of(device="cpu", algo=algo, only=("CD201",)))
    assert [f.title for f in diagnosis.findings] == []
    assert "CD201" not in diagnosis.skipped
