"""CD503 entropy collapse on hand-built TRL scalar logs (real event files written with torch's SummaryWriter).

What a correct diagnosis says, case by case, from the definitions (the entropy's early level is the median of its
first 10% of points, its current level the median of its last 10%: the current window; the fraction is
``warn_ratio`` = 0.3 of the early level; the reward "rose" only when its current level is above both its early
level and its level just before the fall by more than its noise floor):

(a) entropy 3.0 -> 0.014 while the training reward falls 0.76 -> 0.25: the entropy's current level is ~0.5% of its
    early level, far below the fraction, and it is still there in the current window; the reward is now far below
    where the run started, so this is not a policy sharpening on what it earns: a WARNING (the zero-std share stays
    at ~0.1, so the gradient is not yet going with it). The same holds when the reward had already dropped to
    ~0.15 by the time the entropy started falling and climbed back to 0.25 since: a reward now at a third of its
    early level has not risen. That variant is what the old rule missed: it compared the reward only with its
    level at the fall onset (0.15 -> 0.25 is "rising") and called the collapse convergence.
(b) the same with TRL's `frac_reward_zero_std` rising 0.1 -> 0.8: the collapse now silences most groups (zero reward
    std, zero advantage): CRITICAL ("together with rising silent groups": current share above the early one by at
    least ``zero_std_rise`` = 0.3).
(c) entropy 3.0 -> 0.014 while the reward rises 0.2 -> 0.9: the policy committed to what earns the reward
    (a solved task): convergence, not collapse. No CD503 finding at all: the registry's negative case for CD503
    (tests/helpers/scalar_runs.py) is this shape and requires silence even at info, and a silent-group share
    that follows would be CD102/CD504's to report.
(d) a healthy run, entropy 3.0 -> 2.5 (83% of its early level): nowhere near the fraction: nothing.
(e) entropy 3.0 -> 0.02 at steps ~40-60, back to ~2.8 from step ~70 with a flat reward: a collapse that ended.
    The current window is healthy, so it is INFO, titled "recovered at step N" (N the first step back above the
    fraction, ~65), with the steps it held.
(f) 6 logged points (fewer than ``min_points`` = 8): not judged; the runner lists CD503 as skipped with the reason.
(g) the same as (b) through TRL's full tag set in TRL's directory layout (runs/<date>_<host>/events...), scanned end
    to end with ``collapse_doctor.pipeline.scan.diagnose([dir])``: CRITICAL, naming TRL's raw tags.

Without a `reward` series the per-channel means (their sum) decide whether the reward rose; with neither the
collapse is judged on the entropy alone and says so. A scalar log says nothing about GDPO: ``gdpo_resolves`` stays
None and the remedy is the trainer settings (temperature, entropy bonus, clip-higher, learning rate), never
reweighting or switching the aggregation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.judge.detectors import Finding, Severity
from collapse_doctor.pipeline.scan import diagnose
from tests.helpers.scalar_runs import trl_series, write_events

N = 100
T = np.arange(N)


def _curve(points: list[float], levels: list[float], noise: float, seed: int, *, additive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = np.interp(T, points, levels)
    if additive:
        return level + noise * rng.standard_normal(N)
    return level * (1 + noise * rng.standard_normal(N))


COLLAPSE = _curve([0, 20, 50, N - 1], [3.0, 2.9, 0.02, 0.014], 0.05, 1)
"""Entropy 3.0 -> 0.014: flat for 20 steps, falling to ~0.02 by step 50, ~0.014 at the end."""
FALLING_REWARD = _curve([0, N - 1], [0.76, 0.25], 0.02, 2, additive=True)
DIP_REWARD = _curve([0, 20, N - 1], [0.76, 0.15, 0.25], 0.01, 3, additive=True)
"""0.76 -> 0.15 before the entropy falls, then back up to 0.25: below where the run started."""
RISING_REWARD = _curve([0, N - 1], [0.2, 0.9], 0.02, 4, additive=True)
QUIET = np.clip(_curve([0, N - 1], [0.1, 0.1], 0.02, 5, additive=True), 0, 1)
SILENCING = np.clip(_curve([0, 20, 50, N - 1], [0.1, 0.1, 0.8, 0.8], 0.02, 6, additive=True), 0, 1)


def _scan(directory: Path, series: dict[str, np.ndarray], **options: Any) -> Diagnosis:
    write_events(directory, series)
    return diagnose([directory], ScanOptions.of(device="cpu", **options))


def _cd503(diagnosis: Diagnosis) -> list[Finding]:
    return [f for f in diagnosis.findings if f.code == "CD503"]


def _trl(entropy: np.ndarray, reward: np.ndarray, zero_std: np.ndarray = QUIET) -> dict[str, np.ndarray]:
    return {"train/entropy": entropy, "train/reward": reward, "train/frac_reward_zero_std": zero_std}


def _scalar_only(finding: Finding) -> None:
    assert finding.gdpo_resolves is None
    assert "GDPO" not in finding.remedy and "weight" not in finding.remedy
    assert {getattr(a, "setting", None) for a in finding.actions} >= {"temperature", "entropy_coef"}


@pytest.mark.parametrize("reward", [FALLING_REWARD, DIP_REWARD], ids=["falling", "dip-then-partial-recovery"])
def test_a_entropy_collapse_while_the_reward_falls_is_a_warning(reward: np.ndarray, tmp_path: Path) -> None:
    (found,) = _cd503(_scan(tmp_path / "run", _trl(COLLAPSE, reward)))
    assert found.severity == Severity.WARNING and found.title == "entropy collapsed without a reward gain"
    ev = found.evidence
    assert np.isclose(ev["early"], 3.0, rtol=0.05) and ev["early_points"] == 10
    assert ev["now"] < 0.02 and ev["now_points"] == 10 and ev["ratio"] < 0.01 and ev["fraction"] == 0.3
    assert ev["reward_early"] > 0.6 and ev["reward_now"] < 0.3 and ev["reward_source"] == "`train/reward`"
    assert np.isclose(ev["zero_std_share_early"], 0.1, atol=0.03) and np.isclose(ev["zero_std_share"], 0.1, atol=0.03)
    assert "not rising" in found.message and "`train/entropy`" in found.message
    assert found.onset_step is not None and 30 <= found.onset_step <= 45  # smoothed entropy at 30% (0.9) ~ step 41
    _scalar_only(found)


def test_b_entropy_collapse_with_silent_groups_rising_is_critical(tmp_path: Path) -> None:
    (found,) = _cd503(_scan(tmp_path / "run", _trl(COLLAPSE, FALLING_REWARD, SILENCING)))
    assert found.severity == Severity.CRITICAL and "silent groups rising" in found.title
    assert np.isclose(found.evidence["zero_std_share_early"], 0.1, atol=0.03)
    assert np.isclose(found.evidence["zero_std_share"], 0.8, atol=0.03)
    assert "`train/frac_reward_zero_std`" in found.message and "early to 80% now" in found.message
    _scalar_only(found)


def test_b_the_rise_of_silent_groups_is_configurable(tmp_path: Path) -> None:
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD503]\nzero_std_rise = 0.75\n")
    (found,) = _cd503(_scan(tmp_path / "run", _trl(COLLAPSE, FALLING_REWARD, SILENCING), config=config))
    assert found.severity == Severity.WARNING  # 0.1 -> 0.8 is a rise of 0.7 < 0.75


def test_c_entropy_falling_while_the_reward_rises_strongly_is_convergence(tmp_path: Path) -> None:
    assert _cd503(_scan(tmp_path / "run", _trl(COLLAPSE, RISING_REWARD, SILENCING))) == []


def test_d_a_healthy_entropy_decline_says_nothing(tmp_path: Path) -> None:
    diagnosis = _scan(tmp_path / "run", _trl(_curve([0, N - 1], [3.0, 2.5], 0.03, 7), FALLING_REWARD))
    assert _cd503(diagnosis) == [] and "CD503" not in diagnosis.skipped


def test_e_a_collapse_that_recovered_is_information_with_its_steps(tmp_path: Path) -> None:
    dip = _curve([0, 20, 40, 60, 70, N - 1], [3.0, 2.9, 0.02, 0.02, 2.8, 2.9], 0.05, 8)
    flat = _curve([0, N - 1], [0.5, 0.5], 0.01, 9, additive=True)
    (found,) = _cd503(_scan(tmp_path / "run", _trl(dip, flat)))
    assert found.severity == Severity.INFO
    recovered = found.evidence["recovered_step"]
    assert 60 < recovered <= 70 and f"recovered at step {recovered}" in found.title
    assert found.step_range is not None and 25 <= found.step_range[0] < found.step_range[1] < recovered
    assert found.evidence["now"] > 2.5 and found.evidence["low"] < 0.05


def test_f_too_few_points_are_skipped_with_the_reason(tmp_path: Path) -> None:
    short = {tag: values[::17] for tag, values in _trl(COLLAPSE, FALLING_REWARD).items()}  # 6 points
    diagnosis = _scan(tmp_path / "run", short)
    assert _cd503(diagnosis) == []
    reason = diagnosis.skipped["CD503"]
    assert "not enough data to judge" in reason and "6 logged point(s); 8 are needed (min_points)" in reason


def test_g_trl_event_file_end_to_end(tmp_path: Path) -> None:
    series = trl_series(0)  # every tag TRL's GRPOTrainer writes, 200 steps
    t = np.arange(len(series["train/entropy"]))
    series["train/entropy"] = 3.0 * np.interp(t, [0, 40, 100, 199], [1.0, 0.97, 0.007, 0.005])
    series["train/reward"] = np.interp(t, [0, 199], [0.76, 0.25])
    series["train/frac_reward_zero_std"] = np.interp(t, [0, 40, 100, 199], [0.1, 0.1, 0.8, 0.8])
    run = tmp_path / "out"
    write_events(run / "runs" / "May01_host", series)
    (found,) = _cd503(diagnose([run]))
    assert found.severity == Severity.CRITICAL
    assert found.evidence["tag"] == "train/entropy" and found.evidence["points"] == 200
    assert found.evidence["ratio"] < 0.01 and found.evidence["reward_now"] < 0.3
    _scalar_only(found)


def _channels(format_mean: np.ndarray, correct_mean: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "train/entropy": COLLAPSE,
        "train/rewards/format/mean": format_mean,
        "train/rewards/correct/mean": correct_mean,
    }


def test_without_a_reward_series_the_channel_means_decide(tmp_path: Path) -> None:
    falling = _curve([0, N - 1], [0.6, 0.2], 0.02, 10, additive=True)
    (found,) = _cd503(_scan(tmp_path / "down", _channels(falling, falling)))
    assert found.severity == Severity.WARNING
    assert found.evidence["reward_source"].startswith("the sum of the channel means")
    assert "`train/rewards/format/mean`" in found.message
    rising = _curve([0, N - 1], [0.2, 0.6], 0.02, 11, additive=True)
    assert _cd503(_scan(tmp_path / "up", _channels(rising, rising))) == []


def test_the_fraction_is_configurable(tmp_path: Path) -> None:
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD503]\nwarn_ratio = 0.001\n")
    assert _cd503(_scan(tmp_path / "run", _trl(COLLAPSE, FALLING_REWARD), config=config)) == []
