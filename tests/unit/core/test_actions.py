"""Remedy actions: a JSON round trip for every kind, clear errors for what a reader cannot apply, and the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.findings import (
    ACTION_KINDS,
    AGGREGATIONS,
    TRAINER_SETTINGS,
    Action,
    ChangeSetting,
    ConditionChannel,
    DropChannel,
    Finding,
    Remedy,
    SetAggregation,
    SetRecipe,
    SetWeight,
    Severity,
)
from collapse_doctor.report.schemas import schema_text

SCHEMA = json.loads(schema_text("scan"))
EXAMPLES: list[Action] = [
    SetWeight("format", 0.44),
    SetAggregation("gdpo"),
    SetAggregation("gdpo-dynamic"),
    DropChannel("verifier"),
    ConditionChannel("format", "correct", ">=", 1.0),
    SetRecipe("hybrid_switch", "on-finding:CD402@warning"),
    SetRecipe("channel_start", {"style": 50}),
    ChangeSetting("num_generations", "raise", 2),
    ChangeSetting("temperature", "raise"),
    ChangeSetting("mask_truncated_completions", "set", True),
]


def test_every_kind_has_an_example() -> None:
    assert sorted({a.kind for a in EXAMPLES}) == sorted(ACTION_KINDS)


@pytest.mark.parametrize("action", EXAMPLES, ids=lambda a: f"{a.kind}-{a.describe()[:24]}")
def test_json_round_trip(action: Action) -> None:
    data = json.loads(json.dumps(action.to_dict()))
    assert data["kind"] == action.kind
    assert Action.from_dict(data) == action
    assert "\n" not in action.describe() and action.describe()


def test_a_finding_writes_its_actions() -> None:
    finding = Finding("CD401", Severity.WARNING, "t", "m", actions=(DropChannel("judge"),))
    assert finding.to_dict()["actions"] == [{"kind": "drop", "channel": "judge"}]
    assert Finding("CD101", Severity.INFO, "t", "m").to_dict()["actions"] == []


def test_wording() -> None:
    assert SetAggregation("gdpo").describe() == 'switch to GDPO (TRL multi_objective_aggregation="normalize_then_sum")'
    assert SetAggregation("gdpo").to_dict()["trl"] == {"multi_objective_aggregation": "normalize_then_sum"}
    assert SetAggregation("gdpo-dynamic").trl_setting is None
    assert SetWeight("format", 0.44).describe() == "set the weight of `format` to 0.44"
    assert ConditionChannel("format", "correct").describe() == "count `format` only where `correct` >= 1"
    assert SetRecipe("channel_start", {"style": 50}).setting == "channel_start = {style = 50}"
    setting = ChangeSetting("kl_coef", "lower")
    assert setting.describe() == "lower beta (verl actor_rollout_ref.actor.kl_loss_coef)"
    assert setting.to_dict() == {
        "kind": "trainer_setting",
        "setting": "kl_coef",
        "change": "lower",
        "value": None,
        "trl": "beta",
        "verl": "actor_rollout_ref.actor.kl_loss_coef",
    }
    assert (
        ChangeSetting("mask_truncated_completions", "set", True).describe() == "set mask_truncated_completions = True"
    )
    assert (
        ChangeSetting("overlong_penalty", "set", True).describe()
        == "set verl reward_model.overlong_buffer.enable = True"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "rewrite_reward", "channel": "x"}, "unknown remedy action kind 'rewrite_reward' (known: weight, "),
        ({"channel": "x"}, "unknown remedy action kind None"),
        ("drop x", "unknown remedy action kind None"),
        ({"kind": "weight", "channel": "x"}, "remedy action 'weight' lacks 'weight'"),
        ({"kind": "weight", "channel": "x", "weight": "high"}, "weight 'high' must be a number >= 0"),
        ({"kind": "aggregation", "algorithm": "ppo"}, "algorithm 'ppo' is not one of grpo, gdpo, gdpo-dynamic"),
        ({"kind": "condition", "channel": "x", "objective": "x", "op": ">=", "threshold": 1}, "another channel"),
        ({"kind": "condition", "channel": "x", "objective": "y", "op": "~", "threshold": 1}, "op '~' is not one of"),
        ({"kind": "trainer_setting", "setting": "warmup", "change": "raise"}, "setting 'warmup' is not one of"),
        ({"kind": "trainer_setting", "setting": "temperature", "change": "set"}, "a 'set' change needs a value"),
        ({"kind": "recipe", "key": "hybrid_switch", "value": [1, 2]}, "must be a string, a number or a table"),
    ],
)
def test_what_cannot_be_read_is_a_clear_error(data: object, message: str) -> None:
    with pytest.raises(InputError) as error:
        Action.from_dict(data)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_remedies_join_words_and_actions() -> None:
    gdpo = Remedy("switch", (SetAggregation("gdpo"),))
    joined = Remedy.join("harder prompts", None, gdpo, Remedy("", (SetWeight("x", 0.5),)), gdpo)
    assert joined.text == "harder prompts; switch; switch"
    assert joined.actions == (SetAggregation("gdpo"), SetWeight("x", 0.5)), "each action once"


def test_the_schema_names_the_same_closed_sets() -> None:
    variants = SCHEMA["$defs"]["action"]["oneOf"]
    assert [v["properties"]["kind"]["const"] for v in variants] == list(ACTION_KINDS)
    by_kind = {v["properties"]["kind"]["const"]: v for v in variants}
    assert by_kind["aggregation"]["properties"]["algorithm"]["enum"] == list(AGGREGATIONS)
    assert by_kind["trainer_setting"]["properties"]["setting"]["enum"] == list(TRAINER_SETTINGS)
    for action in EXAMPLES:  # what to_dict writes is what the schema allows
        jsonschema.validate(action.to_dict(), SCHEMA["$defs"]["action"])
