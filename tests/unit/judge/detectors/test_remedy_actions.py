"""Remedies carry typed actions, chosen by the detector and worded from the same values (one source of truth)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core.findings import (
    ChangeSetting,
    ConditionChannel,
    DropChannel,
    Finding,
    SetAggregation,
    SetRecipe,
    SetWeight,
)
from collapse_doctor.core.options import ScanOptions
from tests.helpers import runs
from tests.helpers.scalar_runs import SCALAR_CASES
from tests.helpers.series import GROUPS, diagnose_series, make_series

STEPS = 100


def _dominant(onset: int, *, correct_at_ceiling: bool = False, gdpo_too: bool = False) -> Finding | None:
    """A hand-built run where `format` decides the GRPO advantages from ``onset`` on while `correct` still varies."""
    share = np.full((STEPS, 2), 0.5)
    share[onset:] = (0.95, 0.05)
    at_max = np.zeros((STEPS, 2))
    if correct_at_ceiling:
        at_max[-STEPS // 10 :, 1] = GROUPS
    series = make_series(
        STEPS,
        signal_share_grpo=share,
        dominance_grpo=share,
        signal_share_gdpo=share if gdpo_too else 0.5,
        dominance_gdpo=share if gdpo_too else 0.5,
        channel_at_max_groups=at_max,
    )
    found = [f for f in diagnose_series(series, codes=("CD402",)).findings if f.code == "CD402"]
    assert len(found) <= 1
    return found[0] if found else None


def test_cd402_chooses_its_recipes_and_words_them() -> None:
    early = _dominant(10)
    assert early is not None and early.gdpo_resolves is True
    kinds = [type(a) for a in early.actions]
    assert kinds == [SetAggregation, SetWeight, ConditionChannel, SetRecipe]
    gate = ConditionChannel("format", "correct", ">=", 1.0)
    switch = SetRecipe("hybrid_switch", "on-finding:CD402@warning")
    assert early.actions[0] == SetAggregation("gdpo") and gate in early.actions and switch in early.actions
    weight = early.actions[1]
    assert isinstance(weight, SetWeight) and weight.channel == "format"
    for piece in (
        weight.flag,
        "--algo gdpo",
        gate.setting,
        switch.setting,
        'multi_objective_aggregation="normalize_then_sum"',
    ):
        assert piece in early.remedy, piece

    late = _dominant(70)
    assert late is not None and switch not in late.actions, "begun in the second half: plain GDPO, no hybrid switch"
    assert "hybrid_switch" not in late.remedy and gate in late.actions

    earned = _dominant(10, correct_at_ceiling=True)
    assert earned is not None and not any(isinstance(a, ConditionChannel) for a in earned.actions), (
        "a channel earned almost everywhere by the end gates nothing"
    )
    assert "condition" not in earned.remedy


def test_no_aggregation_switch_where_the_counterfactual_says_it_does_not_help() -> None:
    stays = _dominant(10, gdpo_too=True)
    assert stays is not None and stays.gdpo_resolves is False
    assert not any(isinstance(a, (SetAggregation, SetRecipe)) for a in stays.actions)
    assert "GDPO" not in stays.remedy and "hybrid_switch" not in stays.remedy


def test_scanned_runs_carry_the_actions_their_remedies_word(tmp_path: Path) -> None:
    collinear = diagnose([runs.simulated(tmp_path / "c.parquet", "collinear")], ScanOptions.of(device="cpu"))
    cd401 = next(f for f in collinear.findings if f.code == "CD401")
    (drop,) = cd401.actions
    assert isinstance(drop, DropChannel) and cd401.remedy.startswith(drop.describe())
    for finding in collinear.findings:
        switches = [a for a in finding.actions if isinstance(a, SetAggregation)]
        assert bool(switches) == ("switch to GDPO" in finding.remedy), finding.code
        assert not switches or finding.gdpo_resolves is True
    gdpo = diagnose(
        [runs.simulated(tmp_path / "s.parquet", "saturating-format")], ScanOptions.of(device="cpu", algo="gdpo")
    )
    assert not any(isinstance(a, SetAggregation) for f in gdpo.findings for a in f.actions)


def test_trainer_settings_are_worded_from_their_action() -> None:
    from collapse_doctor.judge.detectors.signal import NEVER_EARNED
    from collapse_doctor.judge.detectors.truncation import LONGER, SETTINGS

    assert (LONGER.trl, LONGER.verl) == ("max_completion_length", "data.max_response_length")
    for framework, (cap, _) in SETTINGS.items():
        assert cap.actions == (LONGER,), framework
    assert f"`{LONGER.trl}`" in SETTINGS["trl"][0].text and f"`{LONGER.verl}`" in SETTINGS["verl"][0].text
    (mask,) = SETTINGS["trl"][1].actions
    assert f"`{mask.trl}=True`" in SETTINGS["trl"][1].text
    (more,) = NEVER_EARNED.actions
    assert more == ChangeSetting("num_generations", "raise") and f"raise {more.trl}" in NEVER_EARNED.text


@pytest.mark.parametrize(
    ("code", "settings"),
    [
        ("CD104", {"max_completion_length"}),
        ("CD502", {"learning_rate", "kl_coef"}),
        ("CD503", {"temperature", "entropy_coef", "clip_epsilon_high", "learning_rate"}),
        ("CD507", {"learning_rate", "kl_coef"}),
        ("CD509", {"learning_rate", "max_grad_norm"}),
    ],
)
def test_scalar_log_remedies_carry_their_trainer_settings(code: str, settings: set[str], tmp_path: Path) -> None:
    path = SCALAR_CASES[code][0](tmp_path)
    found = [f for f in diagnose([path], ScanOptions.of(device="cpu")).findings if f.code == code]
    assert found, code
    named = {a.setting for f in found for a in f.actions if isinstance(a, ChangeSetting)}
    assert settings <= named, (code, named)
    for finding in found:
        for action in finding.actions:
            assert isinstance(action, ChangeSetting), (code, action)
