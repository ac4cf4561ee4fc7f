"""The conclusion a comparison opens with: the regression gate's criteria worded run by run.

Diagnoses are built by hand (``tests.unit.pipeline.test_compare.diagnosis``) with known numbers, so each expected
answer follows from the gate's definitions: a zero-advantage share may grow by 0.05 (absolute), a rel_gain (now) may
fall by 25% of the baseline's; better is the same margin the other way; what one side lacks counts against the run.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import jsonschema
import pytest

from collapse_doctor.core.config import Config
from collapse_doctor.core.findings import Severity
from collapse_doctor.core.result import REQUIREMENTS, Diagnosis
from collapse_doctor.pipeline.compare import (
    CONCLUSION_VERDICTS,
    ComparedRun,
    Conclusion,
    FindingChange,
    GateCriterion,
    GateSettings,
    compare,
    conclude,
    regression_gate,
)
from collapse_doctor.report.schemas import schema_text
from tests.unit.pipeline import test_compare
from tests.unit.pipeline.test_compare import finding

SCHEMA = json.loads(schema_text("compare"))
CHECKS = ("CD101", "CD102", "CD104", "CD201", "CD402", "CD503")


def diagnosis(**values: Any) -> Diagnosis:
    """The gate tests' diagnosis, with every check these tests name run (a finding of a check that ran on the run
    and is absent there is gone; of one that did not run, unknown)."""
    return dataclasses.replace(test_compare.diagnosis(**values), detectors={code: code for code in CHECKS})


def conclusion_of(base: Diagnosis, run: Diagnosis, **settings: Any) -> Conclusion:
    gate = regression_gate(ComparedRun("A", base), ComparedRun("B", run), GateSettings(**settings))
    return conclude(gate)


def measures(criteria: tuple[GateCriterion, ...]) -> list[tuple[str, str | None, Any, Any]]:
    return [(c.name, c.channel, c.baseline, c.run) for c in criteria]


def test_worse_names_each_measure_past_its_margin_with_both_values() -> None:
    """Zero-advantage share 0.10 -> 0.30 (+0.20 > 0.05); `format` 0.8 -> 0.4 (-50% < -25%); `length` 0.4 -> 0.35
    (-12.5%, within the margin: not named)."""
    base = diagnosis(zero_share=0.10, rel_gain_now={"format": 0.8, "length": 0.4})
    run = diagnosis(zero_share=0.30, rel_gain_now={"format": 0.4, "length": 0.35})
    conclusion = conclusion_of(base, run)
    assert conclusion.verdict == "worse" and conclusion.gate_failed
    assert measures(conclusion.worse) == [("zero_advantage_share", None, 0.10, 0.30), ("rel_gain", "format", 0.8, 0.4)]
    assert conclusion.better == () and conclusion.not_compared == ()
    assert (conclusion.baseline, conclusion.run, conclusion.fail_on) == ("A", "B", "warning")


def test_no_worse_within_the_margins() -> None:
    """+0.04 zero-advantage share and -18.75% rel_gain are inside the margins, and not better by them either."""
    base = diagnosis(zero_share=0.10, rel_gain_now={"format": 0.8})
    run = diagnosis(zero_share=0.14, rel_gain_now={"format": 0.65})
    conclusion = conclusion_of(base, run)
    assert conclusion.verdict == "no_worse" and not conclusion.gate_failed
    assert conclusion.worse == conclusion.better == conclusion.not_compared == ()


def test_better_by_the_same_margins_and_a_baseline_finding_gone() -> None:
    """0.30 -> 0.10 is 0.20 lower (> 0.05); 0.4 -> 0.8 is +100% (> +25%); `length` 0.4 -> 0.45 (+12.5%) is not
    named; the baseline's CD402 warning is gone, its verdict at_risk -> healthy."""
    drowns = finding("CD402", "format", "length")
    base = diagnosis(zero_share=0.30, rel_gain_now={"format": 0.4, "length": 0.4}, findings=(drowns,))
    run = diagnosis(zero_share=0.10, rel_gain_now={"format": 0.8, "length": 0.45})
    conclusion = conclusion_of(base, run)
    assert conclusion.verdict == "better" and not conclusion.gate_failed
    assert measures(conclusion.better) == [
        ("verdict", None, "at_risk", "healthy"),
        ("zero_advantage_share", None, 0.30, 0.10),
        ("rel_gain", "format", 0.4, 0.8),
    ]
    assert conclusion.eased_findings == (FindingChange("CD402", ("format", "length"), Severity.WARNING, None),)
    # Reversed, the same numbers are worse: the run has a new CD402 and a worse verdict.
    back = conclusion_of(run, base)
    assert back.verdict == "worse"
    assert back.new_findings == (FindingChange("CD402", ("format", "length"), None, Severity.WARNING),)
    assert ("verdict", None, "healthy", "at_risk") in measures(back.worse)


def test_what_could_not_be_compared_counts_against_the_run() -> None:
    """A channel the run lacks and a run without rollouts: nothing compared got worse, yet the gate fails it."""
    base = diagnosis(rel_gain_now={"format": 0.8, "length": 0.4})
    renamed = conclusion_of(base, diagnosis(rel_gain_now={"format": 0.8, "size": 0.4}))
    assert renamed.verdict == "not_cleared" and renamed.gate_failed and renamed.worse == ()
    (lost,) = renamed.not_compared
    assert (lost.name, lost.channel, lost.baseline, lost.run) == ("rel_gain", "length", 0.4, None)
    assert lost.reason == "no_channel" and lost.counts_against
    stopped = conclusion_of(base, diagnosis(rel_gain_now={"format": 0.8, "length": float("nan")}))
    assert [(c.reason, c.counts_against) for c in stopped.not_compared] == [("no_value", True)]
    no_rollouts = conclusion_of(base, diagnosis(zero_share=None))
    assert no_rollouts.verdict == "not_cleared"
    assert [(c.name, c.reason, c.counts_against) for c in no_rollouts.not_compared] == [
        ("zero_advantage_share", "no_rollouts_run", True)
    ]
    # Neither run has rollouts: the same kind of run twice, nothing to hold against either.
    neither = conclusion_of(diagnosis(zero_share=None), diagnosis(zero_share=None))
    assert neither.verdict == "no_worse" and not neither.gate_failed
    assert [(c.reason, c.counts_against) for c in neither.not_compared] == [("no_rollouts_both", False)]


def test_an_inconclusive_run_and_a_check_that_did_not_run_are_not_cleared() -> None:
    inconclusive = conclusion_of(diagnosis(), diagnosis(verdict="inconclusive"))
    assert inconclusive.verdict == "not_cleared"
    assert [(c.name, c.reason) for c in inconclusive.not_compared] == [("judged", "inconclusive")]
    # CD503 ran on the baseline (and found a warning there), not on the run: its finding is not "gone", and the
    # check that did not run counts against the run.
    entropy = finding("CD503")
    base = diagnosis(findings=(entropy,))
    lost = conclusion_of(base, diagnosis(skipped={"CD503": REQUIREMENTS["scalars"]}))
    assert lost.eased_findings == () and lost.verdict == "not_cleared"
    (coverage,) = lost.not_compared
    assert (coverage.name, coverage.codes, coverage.baseline, coverage.run) == ("coverage", ("CD503",), 6, 5)


def test_new_findings_below_the_level_in_the_baseline_and_escalations_carry_both_severities() -> None:
    base = diagnosis(
        findings=(finding("CD104", severity=Severity.INFO), finding("CD201", severity=Severity.WARNING)),
    )
    run = diagnosis(
        findings=(finding("CD104", severity=Severity.WARNING), finding("CD201", severity=Severity.CRITICAL)),
        verdict="collapsed",
    )
    conclusion = conclusion_of(base, run)
    assert conclusion.verdict == "worse"
    assert conclusion.new_findings == (FindingChange("CD104", (), Severity.INFO, Severity.WARNING),)
    assert conclusion.escalated_findings == (FindingChange("CD201", (), Severity.WARNING, Severity.CRITICAL),)
    eased = conclusion_of(run, base)  # less severe, not gone
    assert eased.eased_findings == (  # in the baseline's order
        FindingChange("CD104", (), Severity.WARNING, Severity.INFO),
        FindingChange("CD201", (), Severity.CRITICAL, Severity.WARNING),
    )
    # At fail-on critical the CD104 warning is below the level on both sides: the gate does not weigh it.
    critical = conclusion_of(base, run, fail_on="critical")
    assert critical.new_findings == (FindingChange("CD201", (), Severity.WARNING, Severity.CRITICAL),)


def test_more_than_two_runs_each_against_the_first() -> None:
    base = diagnosis(zero_share=0.10)
    runs = [base, diagnosis(zero_share=0.30), diagnosis(zero_share=0.10), diagnosis(zero_share=0.01)]
    comparison = compare(runs, ["a", "b", "c", "d"])
    assert [(c.baseline, c.run, c.verdict) for c in comparison.conclusions] == [
        ("a", "b", "worse"),
        ("a", "c", "no_worse"),
        ("a", "d", "better"),  # 0.09 lower than the baseline: past the 0.05 margin
    ]
    assert comparison.gates == ()  # not gated: the conclusions say what --gate would


# -- one judgement: the gate's --------------------------------------------------------------------------
VARIANTS = {
    "base": {},
    "more silent": {"zero_share": 0.30},
    "slightly more silent": {"zero_share": 0.14},
    "less silent": {"zero_share": 0.01},
    "no rollouts": {"zero_share": None},
    "format falls": {"rel_gain_now": {"format": 0.4, "length": 0.4}},
    "format rises": {"rel_gain_now": {"format": 1.2, "length": 0.4}},
    "length renamed": {"rel_gain_now": {"format": 0.8, "size": 0.4}},
    "new warning": {"findings": (finding("CD402", "format", "length"),)},
    "info only": {"findings": (finding("CD101", "length", severity=Severity.INFO),)},
    "critical": {"findings": (finding("CD201", severity=Severity.CRITICAL),), "verdict": "collapsed"},
    "inconclusive": {"verdict": "inconclusive"},
    "no scalar checks": {"skipped": {"CD503": REQUIREMENTS["scalars"]}},
}


@pytest.mark.parametrize("fail_on", ["warning", "critical", "never"])
def test_the_conclusion_fails_a_run_exactly_when_the_gate_does(fail_on: str) -> None:
    """Every ordered pair of the variants: the conclusion's outcome is the gate's, its verdict says fails only when
    the gate fails, and every failed criterion appears in it (as a measure, a finding, or what was not compared)."""
    settings = GateSettings(fail_on=fail_on)
    for (name_a, a), (name_b, b) in itertools.product(VARIANTS.items(), repeat=2):
        gate = regression_gate(ComparedRun("A", diagnosis(**a)), ComparedRun("B", diagnosis(**b)), settings)
        conclusion = conclude(gate)
        pair = (name_a, name_b)
        assert conclusion.verdict in CONCLUSION_VERDICTS, pair
        assert conclusion.gate_failed == gate.failed, pair
        assert (conclusion.verdict in ("worse", "not_cleared")) == gate.failed, pair
        named = {c.name for c in conclusion.worse} | {c.name for c in conclusion.counted_against}
        if conclusion.new_findings:
            named.add("new_findings")
        if conclusion.escalated_findings:
            named.add("escalated_findings")
        assert named == {c.name for c in gate.criteria if c.failed}, pair


def test_without_gate_the_conclusions_are_those_of_the_gate_the_config_sets() -> None:
    """compare() without ``gate`` concludes with the first run's fail_on and gate margins, as ``--gate`` would."""
    lenient = Config(fail_on="critical", gate={"zero_advantage_margin": 0.3})
    base = dataclasses.replace(diagnosis(zero_share=0.10), config=lenient)
    run = diagnosis(zero_share=0.30, findings=(finding("CD104", severity=Severity.INFO),))
    ungated = compare([base, run], ["A", "B"])
    gated = compare([base, run], ["A", "B"], gate=GateSettings.resolve(lenient.gate, fail_on=lenient.fail_on))
    assert ungated.conclusions == gated.conclusions
    assert ungated.conclusions[0].verdict == "no_worse"  # +0.20 is within the configured 0.3
    assert ungated.conclusions[0].fail_on == "critical"
    strict = compare([base, run], ["A", "B"], gate=GateSettings())  # the default margin: 0.05
    assert strict.conclusions[0].verdict == "worse" and strict.gates[0].failed


def test_the_conclusion_is_in_the_json_and_matches_the_schema() -> None:
    base = diagnosis(rel_gain_now={"format": 0.8, "length": 0.4}, findings=(finding("CD201"),))
    run = diagnosis(zero_share=0.3, rel_gain_now={"format": 0.8}, findings=(finding("CD104"),))
    for gate in (None, GateSettings()):
        data = json.loads(compare([base, run], ["A", "B"], gate=gate).to_json())
        jsonschema.validate(data, SCHEMA)
        block = data["conclusion"]
        assert (block["baseline"], block["gated"]) == ("A", gate is not None)
        (entry,) = block["runs"]
        assert (entry["run"], entry["verdict"], entry["gate"]) == ("B", "worse", "fails")
        assert entry["worse"] == [
            {
                "measure": "zero_advantage_share",
                "channel": None,
                "baseline": 0.1,
                "run": 0.3,
                "codes": [],
                "reason": None,
                "counts_against": False,
            }
        ]
        assert [(c["channel"], c["reason"], c["counts_against"]) for c in entry["not_compared"]] == [
            ("length", "no_channel", True)
        ]
        assert entry["new_findings"] == [{"code": "CD104", "channels": [], "baseline": None, "run": "warning"}]
        assert entry["eased_findings"] == [{"code": "CD201", "channels": [], "baseline": "warning", "run": None}]
    assert json.loads(compare([base, run], ["A", "B"]).to_json())["exit_code"] == 0  # concluding is not gating


def test_the_schema_names_the_same_closed_sets() -> None:
    from collapse_doctor.pipeline.compare import NOT_COMPARED

    runs = SCHEMA["properties"]["conclusion"]["properties"]["runs"]["items"]["properties"]
    assert tuple(runs["verdict"]["enum"]) == CONCLUSION_VERDICTS
    reasons = SCHEMA["$defs"]["change"]["properties"]["reason"]["oneOf"][1]["enum"]
    assert set(reasons) == set(NOT_COMPARED)
