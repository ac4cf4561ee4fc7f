"""Retrain recipes without training: config keys, the resolved schedule, the scheduled advantages' math."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import Severity
from collapse_doctor.engine.advantages import (
    Segments,
    channel_advantage_std,
    gdpo_advantages,
    group_zscores,
    grpo_advantages,
)
from collapse_doctor.retrain.recipes import ScheduledAdvantages, conditioned_rewards
from collapse_doctor.retrain.schedule import Condition, HybridSwitch, RecipeSchedule, check_schedule
from collapse_doctor.retrain.settings import settings_from_mapping


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"reward_weight_temperature": [[0, 0.7], [0, 0.4]]}, "reward_weight_temperature steps must increase"),
        ({"reward_weight_temperature": [[0, -1]]}, "reward_weight_temperature must be a number > 0"),
        ({"reward_weight_temperature": [0.7]}, "reward_weight_temperature entry 0.7 is not a [step, value] pair"),
        ({"reward_weight_temperature": "hot"}, "reward_weight_temperature must be a number or a list"),
        ({"hybrid_switch": 0}, "hybrid_switch step must be >= 1"),
        ({"hybrid_switch": "on-finding:402"}, "hybrid_switch 'on-finding:402' is neither a step nor"),
        ({"hybrid_switch": "on-finding:CD402@loud"}, "hybrid_switch 'on-finding:CD402@loud' is neither"),
        ({"channel_start": {"style": -3}}, "channel_start.style must be a step (an integer >= 0), got -3"),
        ({"channel_start": 5}, "channel_start must be a table of channel = step"),
        ({"condition": {"length": "correct >> 1"}}, "condition.length 'correct >> 1' is not 'channel OP number'"),
        ({"condition": {"length": "length >= 1"}}, "condition.length is conditioned on itself"),
        ({"advantage_clip_when_std_above": 0}, "advantage_clip_when_std_above must be a number > 0"),
        ({"advantage_clip_when_std_above": 1.2}, "advantage_clip_when_std_above 1.2 never clips: the spread of group"),
    ],
)
def test_recipe_keys_are_validated_naming_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as error:
        settings_from_mapping(data)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_recipe_keys_parse() -> None:
    s = settings_from_mapping(
        {
            "reward_weight_temperature": [[0, 0.7], [50, 0.4]],
            "hybrid_switch": "on-finding:CD101@critical",
            "channel_start": {"style": 20},
            "condition": {"length": "correct>=1"},
            "advantage_clip_when_std_above": 0.5,
        }
    )
    assert s.reward_weight_temperature == ((0, 0.7), (50, 0.4))
    assert s.hybrid_switch == HybridSwitch(code="CD101", severity=Severity.CRITICAL)
    assert s.channel_start == {"style": 20}
    assert s.condition == (Condition("length", "correct", ">=", 1.0),)
    assert s.advantage_clip_when_std_above == 0.5
    assert settings_from_mapping({"hybrid_switch": 30}).hybrid_switch == HybridSwitch(step=30)


def schedule(**kwargs: object) -> RecipeSchedule:
    defaults: dict[str, object] = {
        "algo": "gdpo-dynamic",
        "channels": ("correct", "format", "style"),
        "temperature": 0.5,
    }
    defaults.update(kwargs)
    return RecipeSchedule(**defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"channel_start": {"tone": 3}}, "channel_start names unknown channel 'tone'"),
        ({"channel_start": {"correct": 1, "format": 1, "style": 2}}, "no channel active at step 0"),
        ({"conditions": (Condition("style", "judge", ">=", 1),)}, "condition names unknown channel 'judge'"),
        ({"algo": "grpo", "hybrid": HybridSwitch(step=5)}, "the algorithm is grpo"),
        ({"algo": "gdpo", "temperature": ((0, 0.7), (5, 0.4))}, "needs gdpo-dynamic"),
    ],
)
def test_schedule_checks(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_schedule(schedule(**kwargs))


def test_schedule_phases_and_plan_lines() -> None:
    s = schedule(
        temperature=((0, 0.7), (40, 0.4)),
        hybrid=HybridSwitch(step=10),
        channel_start={"style": 20},
        conditions=(Condition("style", "correct", ">=", 1),),
    )
    assert s.scheduled
    assert [(s.aggregation_at(t), s.temperature_at(t), s.active_at(t)) for t in (0, 9, 10, 20, 40)] == [
        ("grpo", 0.7, ("correct", "format")),
        ("grpo", 0.7, ("correct", "format")),
        ("gdpo-dynamic", 0.7, ("correct", "format")),
        ("gdpo-dynamic", 0.7, ("correct", "format", "style")),
        ("gdpo-dynamic", 0.4, ("correct", "format", "style")),
    ]
    lines = s.describe()
    assert lines[0] == "from step 0    grpo, channels correct, format"
    assert lines[1] == "from step 10   gdpo-dynamic, T=0.7, channels correct, format"
    assert lines[2] == (
        "from step 20   gdpo-dynamic, T=0.7, channels correct, format, style, conditions: style only where correct >= 1"
    )
    assert lines[3].startswith("from step 40   gdpo-dynamic, T=0.4")
    assert len(lines) == 4
    on_finding = schedule(algo="gdpo", hybrid=HybridSwitch(code="CD402"))
    assert on_finding.aggregation_at(100) == "grpo"
    assert on_finding.aggregation_at(100, switched_at=60) == "gdpo"
    assert on_finding.describe()[-1].startswith("switch to gdpo at the step after the monitor first sees CD402")
    assert not schedule().scheduled


def test_conditioned_rewards_follow_eq_8() -> None:
    s = schedule(conditions=(Condition("style", "correct", ">=", 1.0), Condition("format", "correct", ">", 0.5)))
    nan = float("nan")
    rewards = torch.tensor([[1.0, 1.0, 0.5], [0.0, 1.0, 0.9], [nan, 1.0, 0.7], [1.0, nan, nan]])
    out = conditioned_rewards(rewards, s)
    expected = [[1.0, 1.0, 0.5], [0.0, 0.0, 0.0], [nan, 0.0, 0.0], [1.0, nan, nan]]
    for row, want in zip(out.tolist(), expected, strict=True):
        for got, value in zip(row, want, strict=True):
            assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value)


def _rewards(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    correct = (torch.rand(16, generator=g) < 0.4).float()
    fmt = (torch.rand(16, generator=g) < 0.7).float()
    style = torch.rand(16, generator=g) * 3  # a wider scale
    return torch.stack([correct, fmt, style], dim=1)


def test_scheduled_grpo_then_gdpo_with_channels_conditions_and_std_clip() -> None:
    s = schedule(
        algo="gdpo",
        hybrid=HybridSwitch(step=2),
        channel_start={"style": 1},
        conditions=(Condition("style", "correct", ">=", 1.0),),
        clip=0.5,
        clip_when_std_above=0.7,
    )
    transform = ScheduledAdvantages(s, base_weights=(1.0, 0.5, 2.0), step_of=lambda: 0)
    groups = torch.arange(16) // 4
    for step in range(4):
        raw = _rewards(step)
        adv, weights, extras = transform.step(raw, 4, step)
        cond = raw.clone()
        cond[:, 2] = torch.where(raw[:, 0] >= 1, raw[:, 2], torch.zeros(16))
        mask = torch.tensor([1.0, 1.0, 1.0 if step >= 1 else 0.0])
        expected_w = torch.tensor([1.0, 0.5, 2.0]) * mask
        torch.testing.assert_close(weights, expected_w)
        assert extras.rewards is not None
        torch.testing.assert_close(extras.rewards, cond)
        torch.testing.assert_close(extras.raw_rewards["style"], raw[:, 2])
        if step < 2:
            assert extras.columns["aggregation"] == "grpo"
            torch.testing.assert_close(adv, grpo_advantages(cond, groups, weights=expected_w))
        else:
            assert extras.columns["aggregation"] == "gdpo"
            z = group_zscores(cond, groups)
            clip = channel_advantage_std(z) > 0.7
            assert bool(clip.any()) and not bool(clip.all()), "the trigger decides per channel here"
            z = torch.where(clip, z.clamp(-0.5, 0.5), z)
            torch.testing.assert_close(adv, gdpo_advantages(cond, groups, weights=expected_w, zscores=z))
            assert [extras.scalars[f"collapse_doctor/recipe/clipped/{c}"] for c in s.channels] == clip.float().tolist()
        assert extras.columns["active_channels"] == ("correct,format,style" if step >= 1 else "correct,format")
    assert [h[0] for h in transform.history] == [0, 1, 2]


def test_scheduled_dynamic_temperature_and_late_channel() -> None:
    from collapse_doctor.engine.advantages import dynamic_channel_weights, update_std_ema

    s = schedule(temperature=((0, 0.7), (2, 0.3)), channel_start={"style": 1})
    transform = ScheduledAdvantages(s, base_weights=(1.0, 1.0, 1.0), step_of=lambda: 0, upper=0.8)
    groups = Segments.build(torch.arange(16) // 4)
    ema = None
    for step in range(3):
        raw = _rewards(10 + step)
        adv, weights, extras = transform.step(raw, 4, step)
        z = group_zscores(raw, groups).clamp(-2.0, 2.0)  # gdpo-dynamic without a threshold: always clipped
        ema = update_std_ema(ema, channel_advantage_std(z), 0.05)
        active = torch.tensor([True, True, step >= 1])
        expected = torch.zeros(3)
        temperature = 0.7 if step < 2 else 0.3
        expected[active] = dynamic_channel_weights(
            ema[active], temperature=temperature, lower=0.1, upper=0.8, base_weights=torch.ones(int(active.sum()))
        ).float()
        torch.testing.assert_close(weights, expected)
        torch.testing.assert_close(adv, gdpo_advantages(raw, groups, weights=expected, zscores=z))
        assert extras.columns["temperature"] == temperature
        assert extras.rewards is None, "no condition: the rewards are logged as they are"


def test_state_saves_and_loads(tmp_path: object) -> None:
    from pathlib import Path

    s = schedule(algo="gdpo", hybrid=HybridSwitch(code="CD402"))
    transform = ScheduledAdvantages(s, base_weights=(1.0, 1.0, 1.0), step_of=lambda: 0)
    assert transform.switch(7, "CD402 warning")
    assert not transform.switch(9, "again"), "the switch fires once"
    transform.save(Path(str(tmp_path)))
    restored = ScheduledAdvantages(s, base_weights=(1.0, 1.0, 1.0), step_of=lambda: 0)
    assert restored.load(Path(str(tmp_path)))
    assert restored.switched_at == 7 and restored.schedule.aggregation_at(7, restored.switched_at) == "gdpo"


def test_on_finding_switch_fires_after_a_part_with_the_finding() -> None:
    pytest.importorskip("trl")
    from collapse_doctor.retrain.recipe_callback import RecipeCallback

    s = schedule(algo="gdpo", hybrid=HybridSwitch(code="CD402", severity=Severity.WARNING))
    transform = ScheduledAdvantages(s, base_weights=(1.0, 1.0, 1.0), step_of=lambda: 0)
    monitor = SimpleNamespace(parts_due=0, algo="grpo")
    doctor = SimpleNamespace(monitor=monitor, diagnosis=None)
    said: list[str] = []
    callback = RecipeCallback(transform, doctor, say=said.append)  # type: ignore[arg-type]
    control = SimpleNamespace()

    def finding(code: str, severity: Severity) -> SimpleNamespace:
        return SimpleNamespace(code=code, severity=severity, title=f"{code} title")

    transform.history.append((0, "grpo, channels correct, format, style"))
    for step, parts, findings in [
        (1, 0, [finding("CD402", Severity.WARNING)]),  # no new part: not looked at
        (2, 1, [finding("CD402", Severity.INFO)]),  # below the level
        (3, 2, [finding("CD101", Severity.CRITICAL)]),  # another code
        (4, 3, [finding("CD402", Severity.CRITICAL)]),
    ]:
        monitor.parts_due = parts
        doctor.diagnosis = SimpleNamespace(findings=findings)
        callback.on_step_begin(None, SimpleNamespace(global_step=step - 1), control)
        assert monitor.algo == "grpo"
        callback.on_step_end(None, SimpleNamespace(global_step=step, is_world_process_zero=True), control)
    assert transform.switched_at == 5, "TRL's step of the next batch: the first the switch trains"
    assert said == [
        "collapse-doctor: from step 0: grpo, channels correct, format, style",
        "collapse-doctor: hybrid switch: gdpo from step 5 (CD402 critical: CD402 title)",
    ]
    callback.on_step_begin(None, SimpleNamespace(global_step=4), control)
    assert monitor.algo == "gdpo", "the monitor judges the run as what trains from the switch on"


def test_the_spread_of_group_zscores_is_at_most_one() -> None:
    """Why a clip threshold of 1 or more is refused: squares sum to n - 1 in each varying group, over N - 1 rows."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        rewards = torch.rand(64, 3, generator=g) * torch.tensor([1.0, 10.0, 100.0])
        rewards[:8, 0] = 1.0  # one constant group
        spread = channel_advantage_std(group_zscores(rewards, torch.arange(64) // 8))
        assert bool((spread <= 1.0 + 1e-6).all())
        expected = math.sqrt((7 * 7) / 63)  # 7 varying groups of 8 (squares sum to 8 - 1 each) over 64 - 1
        assert float(spread[0]) == pytest.approx(expected, rel=1e-3)  # TRL's std + 1e-4 shrinks it a little
