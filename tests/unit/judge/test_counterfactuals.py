"""run.counterfactuals and the remedies that propose another estimator, on runs whose right answer follows from
the estimators' definitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import collapse_doctor
from collapse_doctor.judge.counterfactuals import MIN_GROUPS, better_estimators
from tests.helpers.runs import _frame, dominant_run, write


def _rows(diagnosis) -> dict[str, dict]:
    table = diagnosis.run.counterfactuals
    return {row["estimator"]: row for row in table["estimators"]}


def _all_pass_run(path: Path) -> Path:
    """One binary channel: 70% of the groups all-pass (every reward 1), the rest 4 of 8 passing."""
    step, group = _frame(60, 20, 8)
    rewards = np.where(group < 14, 1.0, np.tile([1, 1, 1, 1, 0, 0, 0, 0], len(step) // 8))
    return write(path, {"step": step, "group_id": group, "reward/correct": rewards.astype(np.float32)})


def test_silent_all_pass_groups_are_silent_under_every_group_baseline_and_not_under_reinforce(tmp_path: Path) -> None:
    # Written before running: 14 of 20 groups are constant, so 70% of rollouts have advantage 0 under GRPO, RLOO,
    # LOO-GRPO, GPG and GDPO (each subtracts the group's own mean); REINFORCE++ subtracts the step's mean (0.85), so
    # every rollout keeps a signed advantage: 0% without gradient. CD102 fires under GRPO and its remedy quotes
    # REINFORCE++'s computed share, with verl's setting; the run logs no advantage, so it is judged as GRPO;
    # every estimator is computed on all 20 groups of each step.
    d = collapse_doctor.diagnose(_all_pass_run(tmp_path / "run.parquet"))
    rows = _rows(d)
    assert d.run.counterfactuals["sample"] == {
        "groups_per_step": 64,
        "groups": 1200,
        "rollouts": 9600,
        "differing_pairs": 6 * 60 * 16,
    }
    for key in ("grpo", "gdpo", "rloo", "grpo_loo", "gpg"):
        assert rows[key]["zero_advantage_share"] == pytest.approx(0.7), key
    assert rows["reinforce_plus_plus"]["zero_advantage_share"] == 0.0
    assert rows["grpo"]["own"] and d.run.counterfactuals["own"] == "grpo"
    assert "needs completion_length" in rows["opo"]["not_computed"]
    assert rows["reinforce_plus_plus"]["note"] == "rows weighted once (no completion_length)"
    cd102 = next(f for f in d.findings if f.code == "CD102")
    assert "REINFORCE++ would leave 0% of rollouts without advantage" in cd102.remedy
    assert "against 70% under GRPO" in cd102.remedy
    assert "algorithm.adv_estimator=reinforce_plus_plus" in cd102.remedy
    action = next(
        a.to_dict()
        for a in cd102.actions
        if a.to_dict()["kind"] == "trainer_setting" and a.to_dict()["setting"] == "adv_estimator"
    )
    assert (action["change"], action["value"]) == ("set", "reinforce_plus_plus")


def test_a_drowned_channel_is_never_offered_pass_at_k(tmp_path: Path) -> None:
    # pass@k lets only each group's best rollout carry a sign: the narrow `correct` score then decides more signs,
    # but about 7 of 8 rollouts lose their gradient. Trading the harm for silence is not a remedy.
    d = collapse_doctor.diagnose(dominant_run(tmp_path / "run.parquet"))
    rows = _rows(d)
    assert rows["grpo_passk"]["zero_advantage_share"] > 0.8
    assert rows["grpo_passk"]["decides"]["correct"] > rows["grpo"]["decides"]["correct"]
    assert not [
        b for b in better_estimators(d.series, "grpo", "decides", channel="correct") if b[0].key == "grpo_passk"
    ]
    for finding in d.findings:
        assert "pass@k" not in finding.remedy


def test_too_few_groups_is_not_enough_data(tmp_path: Path) -> None:
    step, group = _frame(2, MIN_GROUPS // 2 - 1, 4)
    rng = np.random.default_rng(0)
    path = write(
        tmp_path / "run.parquet",
        {"step": step, "group_id": group, "reward/a": rng.random(len(step)).astype(np.float32)},
    )
    d = collapse_doctor.diagnose(path)
    for row in d.run.counterfactuals["estimators"]:
        if row["estimator"] != "opo":  # without lengths: not computed for that reason first
            assert row["not_computed"].startswith("not enough data"), row
    assert better_estimators(d.series, "grpo", "zero_advantage_share") == []


def test_a_pass_at_k_run_is_never_told_its_intended_zeros_are_a_harm(tmp_path: Path) -> None:
    # pass@k signs only each group's best rollout: 7 of 8 zeros are its design, so no estimator is proposed
    # against them even though RLOO's computed share is far lower.
    d = collapse_doctor.diagnose(_all_pass_run(tmp_path / "run.parquet"))
    assert _rows(d)["grpo_passk"]["zero_advantage_share"] > 0.9
    assert better_estimators(d.series, "grpo_passk", "zero_advantage_share") == []
    assert better_estimators(d.series, "grpo", "zero_advantage_share")  # the same numbers, judged for GRPO
