"""The comparison's values: findings matched by (code, channels), steps aligned, the regression gate's criteria.

Diagnoses are built by hand with known numbers, so each expected answer follows from the criterion's definition.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import pytest

from collapse_doctor.core.config import Config, parse_config
from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import Finding, Severity
from collapse_doctor.core.result import Diagnosis, RunSummary
from collapse_doctor.core.series import RunSeries
from collapse_doctor.pipeline.compare import (
    ComparedRun,
    GateSettings,
    aligned_indices,
    compare,
    match_findings,
    parse_run_argument,
    regression_gate,
    unique_labels,
)
from collapse_doctor.report.schemas import schema_text

SCHEMA = json.loads(schema_text("compare"))


def finding(code: str, *channels: str, severity: Severity = Severity.WARNING, onset: int | None = 3) -> Finding:
    return Finding(code, severity, f"{code} on {', '.join(channels) or 'run'}", "message", channels, onset_step=onset)


def diagnosis(
    *,
    findings: tuple[Finding, ...] = (),
    zero_share: float | None = 0.1,
    rel_gain_now: dict[str, float] | None = None,
    steps: np.ndarray | None = None,
    verdict: str | None = None,
    algorithm: str = "grpo",
    skipped: dict[str, str] | None = None,
) -> Diagnosis:
    """A diagnosis with the numbers the gate reads: signal budget, channel rows, findings; series on ``steps``."""
    rel_gain_now = rel_gain_now if rel_gain_now is not None else {"format": 0.8, "length": 0.4}
    channels = tuple(rel_gain_now)
    steps = steps if steps is not None else np.arange(4)
    n = len(steps)
    values = {
        "valid_rows": np.full(n, 10.0),
        f"zero_adv_rows_{algorithm}": np.arange(n, dtype=np.float64),  # share k / 10 at the k-th step
        f"adv_std_{algorithm}": np.linspace(1.0, 0.5, n),
        "rel_gain": np.tile(np.array(list(rel_gain_now.values())), (n, 1)),
        f"signal_share_{algorithm}": np.full((n, len(channels)), 1.0 / len(channels)),
    }
    signal = None
    if zero_share is not None:
        signal = {
            "algorithm": algorithm,
            "zero_advantage_rollout_share": zero_share,
            "all_pass_group_share": 0.0,
            "all_fail_group_share": 0.0,
            "silent_group_share": zero_share,
            "rollouts": 10 * n,
            "groups": n,
        }
    run = RunSummary(
        sources=("run.parquet",),
        steps=n,
        rollouts=10 * n,
        groups=n,
        group_size_min=10,
        group_size_max=10,
        first_step=int(steps[0]) if n else None,
        last_step=int(steps[-1]) if n else None,
        channels=channels,
        weights=dict.fromkeys(channels, 1.0),
        algorithm=algorithm,
        algorithm_source="test",
        logged_advantage=False,
        device="cpu",
        signal=signal,
    )
    rows = tuple(
        {
            "channel": c,
            "weight": 1.0,
            "rel_gain_peak": 1.0,
            "rel_gain_peak_step": 0,
            "rel_gain_now": v,
            "zero_variance_share": 0.0,
            "reward_mean": 0.5,
        }
        for c, v in rel_gain_now.items()
    )
    if verdict is None:
        verdict = "at_risk" if any(f.severity >= Severity.WARNING for f in findings) else "healthy"
    return Diagnosis(
        verdict=verdict,
        findings=findings,
        run=run,
        series=RunSeries(steps=np.asarray(steps), channels=channels, pairs=[], values=values),
        detectors={"CD102": "silent groups", "CD503": "entropy collapse"},
        skipped=dict(skipped or {}),
        channels=rows,
    )


def gate(base: Diagnosis, run: Diagnosis, **settings: Any) -> dict[str, Any]:
    result = regression_gate(ComparedRun("base", base), ComparedRun("new", run), GateSettings(**settings))
    return {"failed": result.failed, "criteria": {(c.name, c.subject): c for c in result.criteria}, "result": result}


# -- matching ----------------------------------------------------------------------------------------
def test_findings_are_matched_by_code_and_ordered_channels() -> None:
    a = [finding("CD402", "format", "length"), finding("CD101", "correct", severity=Severity.INFO)]
    b = [finding("CD402", "length", "format"), finding("CD101", "correct", severity=Severity.INFO, onset=9)]
    matches = {(m.code, m.channels): m for m in match_findings([a, b])}
    assert set(matches) == {("CD402", ("format", "length")), ("CD402", ("length", "format")), ("CD101", ("correct",))}
    assert matches[("CD402", ("format", "length"))].present == (0,)
    assert matches[("CD402", ("length", "format"))].present == (1,)
    shared = matches[("CD101", ("correct",))]
    assert shared.shared and [f.onset_step for f in shared.findings if f] == [3, 9]


def test_matches_come_most_severe_first_and_keep_a_runs_worst_duplicate() -> None:
    a = [finding("CD101", "x", severity=Severity.INFO), finding("CD101", "x", severity=Severity.CRITICAL)]
    b = [finding("CD201", severity=Severity.WARNING)]
    matches = match_findings([a, b])
    assert [(m.code, m.worst) for m in matches] == [("CD101", Severity.CRITICAL), ("CD201", Severity.WARNING)]
    assert matches[0].findings[0] is not None and matches[0].findings[0].severity is Severity.CRITICAL


# -- alignment ---------------------------------------------------------------------------------------
def test_step_alignment_is_the_union_of_steps_with_gaps() -> None:
    x, idx = aligned_indices([np.array([0, 10, 20]), np.array([10, 30])], "step")
    assert x.tolist() == [0, 10, 20, 30]
    assert [i.tolist() for i in idx] == [[0, 1, 2, -1], [-1, 0, -1, 1]]


def test_fraction_alignment_picks_the_step_at_each_fraction_of_training() -> None:
    # 3 points (the shorter run): fractions 0, 0.5, 1 -> step indices round(f * (n - 1)).
    x, idx = aligned_indices([np.arange(0, 30, 10), np.arange(0, 500, 100)], "fraction")
    assert x.tolist() == [0.0, 0.5, 1.0]
    assert [i.tolist() for i in idx] == [[0, 1, 2], [0, 2, 4]]


def test_a_run_without_steps_has_no_point_on_either_axis() -> None:
    for align in ("step", "fraction"):
        x, idx = aligned_indices([np.zeros(0, dtype=np.int64), np.array([5, 6])], align)
        assert len(x) == 2 and idx[0].tolist() == [-1, -1] and idx[1].tolist() == [0, 1]


def test_aligned_series_follow_the_alignment() -> None:
    short, long = diagnosis(steps=np.arange(3)), diagnosis(steps=np.arange(5) * 2)
    by_step = compare([short, long], ["a", "b"]).aligned()
    # zero_adv_rows = k at the k-th step over 10 valid rows; steps 0,1,2 vs 0,2,4,6,8.
    assert by_step["zero_advantage_share"]["a"] == [0.0, 0.1, 0.2, None, None, None]
    assert by_step["zero_advantage_share"]["b"] == [0.0, None, 0.1, 0.2, 0.3, 0.4]
    by_fraction = compare([short, long], ["a", "b"], align="fraction").aligned()
    assert by_fraction["zero_advantage_share"]["b"] == [0.0, 0.2, 0.4]
    assert by_fraction["rel_gain"]["format"]["a"] == [0.8, 0.8, 0.8]


def test_unknown_alignment_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--align 'time'"):
        aligned_indices([np.arange(3)], "time")


def test_comparison_json_matches_its_schema_and_names_the_unshared_findings() -> None:
    a = diagnosis(findings=(finding("CD402", "format", "length"),))
    b = diagnosis(findings=(finding("CD102"),), rel_gain_now={"format": 0.8, "length": 0.4, "extra": float("nan")})
    data = json.loads(compare([a, b], ["A", "A"], gate=GateSettings()).to_json())
    jsonschema.validate(data, SCHEMA)
    assert [r["label"] for r in data["runs"]] == ["A", "A (2)"]
    by_code = {f["code"]: f for f in data["findings"]}
    assert by_code["CD402"]["present_in"] == ["A"] and by_code["CD402"]["absent_in"] == ["A (2)"]
    assert by_code["CD102"]["by_run"]["A"] is None
    assert data["aligned"]["series"]["rel_gain"]["extra"]["A"] == [None] * 4  # a channel the first run lacks
    assert data["exit_code"] == 1 and data["gates"][0]["new_findings"][0]["code"] == "CD102"


@pytest.mark.parametrize("columns", [None, "80"])
def test_one_finding_worded_differently_per_run_shows_each_runs_title(
    columns: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CD101 on `length`: saturated at its ceiling in one run, never earned in the other (the same code and
    channel, another state): the comparison must not print the first run's words for both. Off a terminal (here a
    StringIO, laid out at COLUMNS or 110) the cell is never cut with "…" nor wrapped: its row is one whole line."""
    import io

    from collapse_doctor.report.compare_text import render_comparison

    saturated = Finding("CD101", Severity.INFO, "`length` is saturated at its maximum", "m", ("length",), onset_step=3)
    floor = Finding("CD101", Severity.INFO, "`length` is rarely or never earned", "m", ("length",), onset_step=0)
    comparison = compare([diagnosis(findings=(saturated,)), diagnosis(findings=(floor,))], ["grpo", "fixed"])
    (match,) = comparison.findings
    assert match.titles_differ
    data = json.loads(comparison.to_json())
    jsonschema.validate(data, SCHEMA)
    titles = {label: run["title"] for label, run in data["findings"][0]["by_run"].items()}
    assert titles == {"grpo": saturated.title, "fixed": floor.title}
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    text = io.StringIO()
    render_comparison(comparison, text, color=False)
    (row,) = [line for line in text.getvalue().splitlines() if line.startswith("CD101 ")]
    assert f"   A: {saturated.title} / B: {floor.title}   info @3   info @0" in row
    assert "…" not in text.getvalue()


def test_run_labels_and_arguments() -> None:
    assert unique_labels(["x", "x", "x"]) == ["x", "x (2)", "x (3)"]
    assert parse_run_argument("s3://bucket/logs@exp-a", exists=lambda p: False).run_name == "exp-a"
    with pytest.raises(UsageError, match="PATH@RUN"):
        parse_run_argument("logs@", exists=lambda p: False)


# -- the gate ----------------------------------------------------------------------------------------
def test_a_run_equal_to_its_baseline_passes_every_criterion() -> None:
    d = diagnosis(findings=(finding("CD402", "format", "length"),))
    result = gate(d, d)
    assert not result["failed"]
    names = {name for name, _ in result["criteria"]}
    assert names == {
        "judged",
        "coverage",
        "verdict",
        "new_findings",
        "escalated_findings",
        "zero_advantage_share",
        "rel_gain",
    }
    assert [f.code for f in result["result"].shared_findings] == ["CD402"]


def test_a_shared_finding_that_escalates_and_a_worse_verdict_fail_the_gate() -> None:
    """CD201 warning in the baseline, critical in the run: shared, so not new, but worse; the verdict goes
    at_risk -> collapsed."""
    base = diagnosis(findings=(finding("CD201", severity=Severity.WARNING),))
    run = diagnosis(findings=(finding("CD201", severity=Severity.CRITICAL),), verdict="collapsed")
    result = gate(base, run)
    criteria = result["criteria"]
    assert result["failed"] and not criteria[("new_findings", "findings >= warning")].failed
    escalated = criteria[("escalated_findings", "shared findings")]
    assert escalated.failed and escalated.detail == "escalated: CD201 warning -> critical"
    verdict = criteria[("verdict", "verdict change")]
    assert verdict.failed and verdict.detail == "at_risk -> collapsed"
    better = gate(run, base)
    assert not better["failed"], "a run better than its baseline passes"


def test_a_channel_the_run_lost_or_renamed_fails_the_gate() -> None:
    """Every baseline channel that still ranks is compared: missing, renamed or without a value now, it counts
    against the run, never as ok."""
    base = diagnosis(rel_gain_now={"format": 0.8, "correct": 0.4})
    renamed = gate(base, diagnosis(rel_gain_now={"format": 0.8, "answer": 0.4}))["criteria"]
    lost = renamed[("rel_gain", "rel_gain now of `correct`")]
    assert lost.failed and lost.run is None
    assert lost.detail == "not compared: the run has no channel of this name (it has `answer`: renamed?)"
    dead = diagnosis(rel_gain_now={"format": 0.8, "correct": float("nan")})
    stopped = gate(base, dead)["criteria"][("rel_gain", "rel_gain now of `correct`")]
    assert stopped.failed and "no value now" in stopped.detail
    floor = gate(diagnosis(rel_gain_now={"format": 0.8, "correct": 0.0}), diagnosis(rel_gain_now={"format": 0.8}))
    assert ("rel_gain", "rel_gain now of `correct`") not in floor["criteria"], "a channel that ranks nothing"


def test_zero_advantage_share_fails_beyond_the_absolute_margin() -> None:
    base = diagnosis(zero_share=0.10)
    key = ("zero_advantage_share", "zero-advantage share")
    assert gate(base, diagnosis(zero_share=0.149))["criteria"][key].failed is False  # 0.149 <= 0.10 + 0.05
    failed = gate(base, diagnosis(zero_share=0.151))["criteria"][key]
    assert failed.failed and failed.limit == pytest.approx(0.15)
    assert gate(base, diagnosis(zero_share=0.25), zero_advantage_margin=0.2)["failed"] is False


def test_rel_gain_fails_below_the_relative_margin() -> None:
    base = diagnosis(rel_gain_now={"format": 0.8})
    key = ("rel_gain", "rel_gain now of `format`")
    assert not gate(base, diagnosis(rel_gain_now={"format": 0.61}))["criteria"][key].failed  # limit 0.8 * 0.75
    low = gate(base, diagnosis(rel_gain_now={"format": 0.59}))["criteria"][key]
    assert low.failed and low.limit == pytest.approx(0.6)
    assert not gate(base, diagnosis(rel_gain_now={"format": 0.59}), rel_gain_margin=0.3)["failed"]
    # A baseline channel that ranks nothing (rel_gain 0) cannot get worse: no criterion for it.
    zero = gate(diagnosis(rel_gain_now={"format": 0.0}), diagnosis(rel_gain_now={"format": 0.0}))
    assert key not in zero["criteria"]


def test_new_findings_at_the_gate_level_fail_and_shared_ones_do_not() -> None:
    drowns = finding("CD402", "format", "length")
    base = diagnosis(findings=(drowns,))
    key = ("new_findings", "findings >= warning")
    assert not gate(base, diagnosis(findings=(drowns,)))["criteria"][key].failed
    reversed_channels = gate(base, diagnosis(findings=(finding("CD402", "length", "format"),)))
    assert reversed_channels["criteria"][key].failed
    # The baseline has it only below the gate level: at the gate level in the run it is new.
    info_base = diagnosis(findings=(finding("CD402", "format", "length", severity=Severity.INFO),))
    assert gate(info_base, diagnosis(findings=(drowns,)))["criteria"][key].failed
    # Below the gate level in the run: not counted.
    assert not gate(base, diagnosis(findings=(drowns, finding("CD101", "x", severity=Severity.INFO))))["failed"]
    critical = gate(base, diagnosis(findings=(drowns,)), fail_on="critical")
    assert not critical["criteria"][("new_findings", "findings >= critical")].failed


def test_an_inconclusive_run_fails_the_gate_unless_fail_on_never() -> None:
    base = diagnosis()
    run = diagnosis(verdict="inconclusive")
    assert gate(base, run)["criteria"][("judged", "verdict")].failed
    assert ("judged", "verdict") not in gate(base, run, fail_on="never")["criteria"]


def test_a_run_without_rollouts_cannot_be_cleared_on_zero_advantage() -> None:
    """What the gate could not compare counts against the run; two runs without rollouts have nothing to compare."""
    result = gate(diagnosis(), diagnosis(zero_share=None))
    criterion = result["criteria"][("zero_advantage_share", "zero-advantage share")]
    assert criterion.failed and criterion.run is None and result["failed"]
    assert criterion.detail == "not compared: no rollouts in the run (counts against the run)"
    neither = gate(diagnosis(zero_share=None), diagnosis(zero_share=None))
    assert not neither["criteria"][("zero_advantage_share", "zero-advantage share")].failed


def test_a_check_that_ran_on_the_baseline_and_not_on_the_run_fails_the_gate() -> None:
    """The run was scanned without its scalar log: CD503 (entropy) could not judge it, so the gate cannot say it is
    no worse there."""
    from collapse_doctor.core.result import REQUIREMENTS

    lost = gate(diagnosis(), diagnosis(skipped={"CD503": REQUIREMENTS["scalars"]}))
    criterion = lost["criteria"][("coverage", "checks that ran")]
    assert criterion.failed and lost["failed"] and (criterion.baseline, criterion.run) == (2, 1)
    assert criterion.detail == "not run: CD503 (rollouts only: 1 of 2 checks ran; 1 needs a scalar log)"
    same = gate(diagnosis(skipped={"CD503": REQUIREMENTS["scalars"]}), diagnosis(skipped={"CD503": "x"}))
    assert not same["criteria"][("coverage", "checks that ran")].failed
    assert ("coverage", "checks that ran") not in gate(diagnosis(), diagnosis(skipped={"CD503": "x"}), fail_on="never")[
        "criteria"
    ]


def test_gate_settings_are_checked() -> None:
    with pytest.raises(UsageError, match=r"--rel-gain-margin 1\.5"):
        GateSettings(rel_gain_margin=1.5)
    with pytest.raises(UsageError, match="--fail-on"):
        GateSettings(fail_on="sometimes")
    resolved = GateSettings.resolve({"rel_gain_margin": 0.4}, fail_on="warning", zero_advantage_margin=0.01)
    assert (resolved.zero_advantage_margin, resolved.rel_gain_margin) == (0.01, 0.4)


def test_config_gate_table_is_validated() -> None:
    config = parse_config({"gate": {"rel-gain-margin": 0.4}}, source="t.toml", base=Config())
    assert config.gate == {"rel_gain_margin": 0.4}
    with pytest.raises(UsageError, match=r"unknown key 'gate\.margin'"):
        parse_config({"gate": {"margin": 0.4}}, source="t.toml", base=Config())
    with pytest.raises(UsageError, match=r"'gate\.rel_gain_margin' must be a number between 0 and 1"):
        parse_config({"gate": {"rel_gain_margin": 2}}, source="t.toml", base=Config())
