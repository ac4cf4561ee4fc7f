"""CD102 at group size 2 with a pass/fail reward: the silence the group size forces is reported even when sampling
puts it just under the 50% cut.

One binary channel, 20 steps of 16 groups of 2. A group of two is silent when both pass or both fail; for any pass
rate p that happens with probability p^2 + (1-p)^2 >= 1/2. Built runs (deterministic, no sampling):

- ``near``: 8 silent groups at even steps and 7 at odd ones (half all-pass, half all-fail), 46.9% of the 320
  groups. The per-step share never holds above 50%, but it is within two standard errors (sqrt(0.25/320) = 2.8%)
  of the 50% floor: CD102 warns over the whole run, names the floor and the group size, and its remedy raises
  num_generations (not harder and easier prompts at once).
- ``far``: 5 silent groups a step (31%): more than two standard errors under the floor, so the groups are not a
  plain pass/fail draw at n = 2 (the prompts split the outcomes): no CD102.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs

STEPS, GROUPS = 20, 16


def _run(path: Path, silent_at: list[int]) -> Path:
    step, group = runs._frame(STEPS, GROUPS, 2)
    reward = np.tile([1.0, 0.0], STEPS * GROUPS).reshape(STEPS, GROUPS, 2)  # mixed groups: one pass, one fail
    for s in range(STEPS):
        silent = silent_at[s % len(silent_at)]
        reward[s, : silent // 2 + silent % 2, :] = 1.0  # all-pass
        reward[s, silent // 2 + silent % 2 : silent, :] = 0.0  # all-fail
    return runs.write(path, {"step": step, "group_id": group, "reward/correct": reward.reshape(-1)})


def test_the_floor_at_group_size_two_is_reported_within_sampling_error(tmp_path: Path) -> None:
    diagnosis = diagnose([_run(tmp_path / "near.parquet", [8, 7])], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD102"]
    assert found.severity == Severity.WARNING and found.step_range == (0, STEPS - 1)
    assert abs(found.evidence["zero_advantage_rollout_share"] - 150 / 320) < 1e-9
    assert "within sampling error of the 50% a pass/fail outcome leaves silent at group size 2" in found.message
    # REINFORCE++'s baseline is the step's mean reward (about 0.5 here): every rollout of an all-pass group gets
    # +, of an all-fail group -, so none is left without advantage (0% against 47%), computed: it is named too.
    assert [a.setting for a in found.actions] == ["num_generations", "adv_estimator"]
    assert "REINFORCE++ would leave 0% of rollouts without advantage" in found.remedy
    assert "harder prompts" not in found.remedy and "easier prompts" not in found.remedy
    assert found.gdpo_resolves is False  # one channel: GDPO's groups of two are silent in the same groups


def test_far_under_the_floor_is_no_finding(tmp_path: Path) -> None:
    diagnosis = diagnose([_run(tmp_path / "far.parquet", [5])], ScanOptions.of(device="cpu"))
    assert not [f for f in diagnosis.findings if f.code == "CD102"]
