"""CD101's words follow what the numbers say: a channel constant because the completions are, a channel whose mean
rose, and a graded channel near its maximum are not channels the policy "lost" or whose spread "fades".

Every run: 60 steps of 16 groups of 4 rollouts, two channels (the second, ``other``, uniform noise, so the run has
something that ranks). Expectations, from the construction:

- ``collapsed``: from step 20 every group writes one completion repeated, and ``quality`` (a binary reward that
  varied before) is 0 for it. The channel is constant at its floor because the completions are identical: CD101 is
  info and names CD105; it never says the policy "lost" the reward and proposes no action.
- ``rose``: ``quality`` passes with probability 0.3, independently per rollout, at steps 0-19 (it ranks), and from
  step 20 each group gets one shared outcome, a pass with probability 0.45 (a prompt-level reward: constant within
  every group, 55% of them at 0). It is at its floor in most groups, but its mean rose (0.3 -> 0.45): "all or
  nothing within most groups", info, never "no longer earned".
- ``near-ceiling``: a count reward of 10 items; each item is earned with probability 0.6 at steps 0-19 and 0.97
  after. Its spread within groups shrinks (rel_gain falls to well under a quarter of its peak) because the mean sits
  at 97% of the way to its maximum: "near its maximum", info, no call for exploration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs

STEPS, GROUPS, SIZE = 60, 16, 4


def _cd101(path: Path, channel: str) -> list:
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    return [f for f in diagnosis.findings if f.code == "CD101" and f.channels == (channel,)]


def _frame(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    step, group = runs._frame(STEPS, GROUPS, SIZE)
    return step, group, {"step": step, "group_id": group, "reward/other": rng.random(len(step))}


def test_a_channel_constant_because_the_completions_are_is_not_lost(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    step, _, columns = _frame(rng)
    n = len(step)
    quality = (rng.random(n) < 0.5).astype(np.float64)
    completion = np.array([f"c{i}" for i in range(n)], dtype=object)
    late = step >= 20
    quality[late] = 0.0
    completion[late] = "zzz"
    columns["reward/other"][late] = 0.3  # every reward of an identical completion is the same
    columns |= {"reward/quality": quality, "completion": completion}
    [found] = _cd101(runs.write(tmp_path / "collapsed.parquet", columns), "quality")
    assert found.severity == Severity.INFO and "CD105" in found.message and "lost" not in found.message
    assert found.evidence["identical_completion_group_share"] > 0.9 and not found.actions


def test_a_channel_whose_mean_rose_is_not_no_longer_earned(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    step, _, columns = _frame(rng)
    n = len(step)
    quality = (rng.random(n) < 0.3).astype(np.float64)  # steps 0-19: varies within most groups (ranks)
    shared = np.repeat((rng.random(STEPS * GROUPS) < 0.45).astype(np.float64), SIZE)
    late = step >= 20
    quality[late] = shared[late]  # steps 20-59: one outcome per group, 55% of groups at 0, mean 0.45
    columns["reward/quality"] = quality
    [found] = _cd101(runs.write(tmp_path / "rose.parquet", columns), "quality")
    assert found.title == "`quality` is all or nothing within most groups" and found.severity == Severity.INFO
    assert "lost" not in found.message
    assert found.evidence["mean_during"] > found.evidence["mean_before"] + 0.1


def test_a_graded_channel_near_its_maximum_is_not_fading(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    step, _, columns = _frame(rng)
    rate = np.where(step < 20, 0.6, 0.97)[:, None]
    columns["reward/items"] = (rng.random((len(step), 10)) < rate).sum(axis=1).astype(np.float64)
    found = _cd101(runs.write(tmp_path / "near.parquet", columns), "items")
    assert found, "rel_gain fell to a fraction of its peak: CD101 reports the channel"
    [one] = found
    assert one.title == "`items` is near its maximum" and one.severity == Severity.INFO
    assert one.evidence["position"] > 0.9 and "exploration" not in one.remedy


def test_the_evidence_peak_is_the_channel_tables(tmp_path: Path) -> None:
    # A channel at 0 in every group for steps 0-39 (a floor from the start: CD101 "rarely or never earned") that a
    # few completions earn afterwards: its rel_gain peaks late (about 1, in the groups that earn it). The finding's
    # rel_gain_peak is that run-wide peak, as the channel table shows it; the peak before the onset (0) is its own
    # key. Before, the evidence said peak 0 where the table said the late peak.
    rng = np.random.default_rng(3)
    step, _, columns = _frame(rng)
    quality = np.where(step >= 40, (rng.random(len(step)) < 0.15).astype(np.float64), 0.0)
    columns["reward/quality"] = quality
    path = runs.write(tmp_path / "late.parquet", columns)
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD101" and f.channels == ("quality",)]
    row = next(r for r in diagnosis.channel_table() if r["channel"] == "quality")
    assert found.evidence["rel_gain_peak"] == row["rel_gain_peak"] > 0.5
    assert found.evidence["rel_gain_peak_step"] == row["rel_gain_peak_step"] >= 40
    assert found.evidence["rel_gain_peak_before_onset"] == 0.0
