"""Detectors on hand-built series: severity from measured harm, floor vs ceiling, support, counterfactuals.

Each case writes down what a correct diagnosis says before checking it (see the docstrings): the numbers are
built to make one condition true and everything else healthy (tests/helpers/series.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from collapse_doctor.core.findings import Finding, Severity
from collapse_doctor.judge.detectors import REGISTRY
from tests.helpers.series import GROUPS, SIZE, diagnose_series, make_series

ROWS = GROUPS * SIZE
SWITCH = re.compile(r"--algo gdpo\b|normalize_then_sum|switch to GDPO", re.IGNORECASE)
LOWER = re.compile(r"lower `?(\w+)`?'s weight|--weights (\w+)=0\.\d")


def by_code(findings: tuple[Finding, ...], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def per_channel(steps: int, first: float | np.ndarray, second: float | np.ndarray) -> np.ndarray:
    return np.stack([np.broadcast_to(first, steps), np.broadcast_to(second, steps)], axis=1).astype(float)


def test_healthy_series_gives_no_finding() -> None:
    """The neutral series: every channel ranks, nothing is silent, tied or correlated."""
    diagnosis = diagnose_series(make_series())
    assert diagnosis.findings == ()
    assert diagnosis.verdict == "healthy"


def test_channel_at_its_ceiling_from_the_start_is_information() -> None:
    """`format` is 1 in every group (constant at its maximum): it changes no advantage under either aggregation,
    so the finding is info, says ceiling, proposes no GDPO switch (it would not help) and no lower weight."""
    steps = 100
    series = make_series(
        steps,
        rel_gain=per_channel(steps, 0.0, 0.6),
        reward_std=per_channel(steps, 0.0, 0.2),
        channel_zero_var_share=per_channel(steps, 1.0, 0.0),
        reward_min=per_channel(steps, 1.0, 0.0),
        channel_at_max_groups=per_channel(steps, GROUPS, 0),
        channel_at_min_groups=per_channel(steps, GROUPS, 0),
        signal_share_grpo=per_channel(steps, 0.0, 1.0),
        signal_share_gdpo=per_channel(steps, 0.0, 1.0),
    )
    diagnosis = diagnose_series(series)
    [finding] = by_code(diagnosis.findings, "CD101")
    assert finding.severity == Severity.INFO and finding.channels == ("format",)
    assert finding.evidence["state"] == "ceiling"
    assert finding.gdpo_resolves is False and not SWITCH.search(finding.remedy)
    assert diagnosis.verdict == "healthy"
    assert diagnosis.channel_table()[0]["state"] == "ceiling"


def test_channel_never_earned_is_at_its_floor_and_keeps_its_weight() -> None:
    """`correct` is 0 everywhere (never earned): floor, info, and the remedy must not lower its weight."""
    steps = 100
    series = make_series(
        steps,
        rel_gain=per_channel(steps, 0.6, 0.0),
        reward_std=per_channel(steps, 0.2, 0.0),
        channel_zero_var_share=per_channel(steps, 0.0, 1.0),
        reward_max=per_channel(steps, 1.0, 0.0),
        reward_min=per_channel(steps, 0.0, 0.0),
        channel_at_max_groups=per_channel(steps, 0, GROUPS),
        channel_at_min_groups=per_channel(steps, 0, GROUPS),
    )
    diagnosis = diagnose_series(series)
    [finding] = by_code(diagnosis.findings, "CD101")
    assert finding.channels == ("correct",) and finding.severity == Severity.INFO
    assert finding.evidence["state"] == "floor"
    assert "never earned" in finding.title and "no longer" not in finding.title
    assert not LOWER.search(finding.remedy) and "do not lower its weight" in finding.remedy
    assert diagnosis.channel_table()[1]["state"] == "floor"


def test_channel_earned_then_lost_is_a_warning() -> None:
    """`correct` ranked samples for 40 steps (rel_gain 0.6), then fell to its floor: the policy lost it."""
    steps = 100
    earned = np.where(np.arange(steps) < 40, 0.6, 0.0)
    series = make_series(
        steps,
        rel_gain=per_channel(steps, 0.6, earned),
        channel_zero_var_share=per_channel(steps, 0.0, np.where(earned > 0, 0.0, 1.0)),
        channel_at_min_groups=per_channel(steps, 0, np.where(earned > 0, 0, GROUPS)),
    )
    [finding] = by_code(diagnose_series(series).findings, "CD101")
    assert finding.severity == Severity.WARNING and "no longer earned" in finding.title
    assert finding.onset_step is not None and 38 <= finding.onset_step <= 42


def test_channel_with_too_few_groups_is_not_judged() -> None:
    """One group per step with two values: below min_groups, CD101 says "not enough data" instead of deciding."""
    steps = 60
    series = make_series(steps, channel_groups=per_channel(steps, 1, 1), rel_gain=per_channel(steps, 0.0, 0.0))
    diagnosis = diagnose_series(series, codes=("CD101",))
    assert diagnosis.findings == ()
    assert diagnosis.skipped["CD101"].startswith("not enough data to judge")


def _silent(steps: int, share_grpo: float, share_gdpo: float, **extra: object) -> dict[str, object]:
    silent_grpo, silent_gdpo = round(share_grpo * GROUPS), round(share_gdpo * GROUPS)
    return {
        "silent_groups_grpo": silent_grpo,
        "zero_adv_rows_grpo": silent_grpo * SIZE,
        "silent_groups_gdpo": silent_gdpo,
        "zero_adv_rows_gdpo": silent_gdpo * SIZE,
        **extra,
    }


def test_cancelling_channels_that_gdpo_separates() -> None:
    """90% of GRPO rollouts are silent because two channels cancel, while GDPO's advantages are silent in 10%:
    critical (most rollouts give no gradient), cancelling, and GDPO resolves it (computed, so proposed)."""
    diagnosis = diagnose_series(make_series(100, **_silent(100, 0.9, 0.1)))
    [finding] = by_code(diagnosis.findings, "CD102")
    assert finding.severity == Severity.CRITICAL and diagnosis.verdict == "collapsed"
    assert finding.evidence["cancel_group_share"] == pytest.approx(0.875, abs=0.01)
    assert finding.gdpo_resolves is True and SWITCH.search(finding.remedy)
    assert diagnosis.run.signal is not None
    assert diagnosis.run.signal["zero_advantage_rollout_share"] == pytest.approx(0.875, abs=0.01)


def test_complementary_channels_stay_silent_under_gdpo() -> None:
    """B = 1 - A within groups: z_B = -z_A, so GDPO's fused sum is 0 too. GDPO does not resolve it and the
    remedy does not propose it (unequal weights or a merged reward do)."""
    [finding] = by_code(diagnose_series(make_series(100, **_silent(100, 0.9, 0.9))).findings, "CD102")
    assert finding.gdpo_resolves is False
    assert not SWITCH.search(finding.remedy) and "unequal weights" in finding.remedy


def test_all_fail_groups_point_to_easier_prompts() -> None:
    """60% of groups all-fail (every channel at its run-wide minimum): the fix is easier prompts, not GDPO."""
    extra = {"all_fail_groups_grpo": round(0.6 * GROUPS), "all_fail_groups_gdpo": round(0.6 * GROUPS)}
    [finding] = by_code(diagnose_series(make_series(100, **_silent(100, 0.6, 0.6, **extra))).findings, "CD102")
    assert finding.severity == Severity.WARNING
    assert finding.evidence["all_fail_group_share"] == pytest.approx(0.625, abs=0.01)
    assert "easier prompts" in finding.remedy and not SWITCH.search(finding.remedy)


def test_ties_resolved_by_gdpo_are_counted_on_gdpo_advantages() -> None:
    """GRPO ties 20% of differing pairs, GDPO 5%: warning, and GDPO resolves it."""
    series = make_series(100, tied_pair_share=0.2, tied_pair_share_gdpo=0.05)
    [finding] = by_code(diagnose_series(series).findings, "CD301")
    assert finding.severity == Severity.WARNING and finding.gdpo_resolves is True
    # the same run trained with GDPO: judged on GDPO's ties, it has nothing to report
    assert by_code(diagnose_series(series, algorithm="gdpo").findings, "CD301") == []


def test_ties_gdpo_keeps_are_not_blamed_on_grpo() -> None:
    """Ties in both aggregations (complementary channels): GDPO does not resolve them."""
    [finding] = by_code(
        diagnose_series(make_series(100, tied_pair_share=0.6, tied_pair_share_gdpo=0.6)).findings, "CD301"
    )
    assert finding.severity == Severity.CRITICAL and finding.gdpo_resolves is False
    assert not SWITCH.search(finding.remedy)


def test_negative_correlation_is_called_cancelling() -> None:
    """rho = -0.95 means the channels cancel, not that they count twice."""
    [finding] = by_code(diagnose_series(make_series(100, within_corr=-0.95)).findings, "CD401")
    assert "cancel" in finding.title and "counts twice" not in finding.message


def test_correlation_from_a_few_rows_is_not_judged() -> None:
    """A correlation of 1.0 from 2 co-observed rows per step (a mostly-None channel) decides nothing."""
    diagnosis = diagnose_series(make_series(100, within_corr=1.0, corr_rows=2.0), codes=("CD401",))
    assert diagnosis.findings == ()
    assert diagnosis.skipped["CD401"].startswith("not enough data to judge")


def test_a_weight_choice_is_not_dominance() -> None:
    """Weights 1 and 0.2 under GDPO: `digits` holds ~96% of the variance because the user said so."""
    steps = 100
    series = make_series(
        steps,
        signal_share_gdpo=per_channel(steps, 0.96, 0.04),
        dominance_gdpo=per_channel(steps, 0.95, 0.05),
    )
    diagnosis = diagnose_series(series, algorithm="gdpo", weights={"format": 1.0, "correct": 0.2})
    assert by_code(diagnosis.findings, "CD402") == []


def test_a_channel_drowning_another_at_equal_weights() -> None:
    """At equal weights `format` holds 90% of GRPO's within-group variance and decides 85% of the signs,
    while under GDPO it holds 50%: warning, GDPO resolves it."""
    steps = 100
    series = make_series(
        steps,
        signal_share_grpo=per_channel(steps, 0.9, 0.1),
        dominance_grpo=per_channel(steps, 0.85, 0.15),
    )
    [finding] = by_code(diagnose_series(series).findings, "CD402")
    assert finding.severity == Severity.WARNING and finding.gdpo_resolves is True and SWITCH.search(finding.remedy)


def test_a_rare_bonus_is_not_dominance() -> None:
    """A bonus that holds 99% of the pooled variance but decides the sign in 30% of rows is not dominance."""
    steps = 100
    series = make_series(
        steps,
        signal_share_grpo=per_channel(steps, 0.99, 0.01),
        dominance_grpo=per_channel(steps, 0.3, 0.7),
    )
    assert by_code(diagnose_series(series).findings, "CD402") == []


def test_lone_successes_are_not_outliers_to_squash() -> None:
    """One completion alone succeeds in 20% of groups: information, and no "cap or squash" remedy."""
    findings = by_code(diagnose_series(make_series(100, outlier_lone_share=0.2)).findings, "CD201")
    assert [f.severity for f in findings] == [Severity.INFO]
    assert "squash" not in findings[0].remedy.replace("do not clip or squash", "")


def test_no_detector_is_left_without_a_unit_case() -> None:
    covered = {"CD101", "CD102", "CD103", "CD105", "CD201", "CD301", "CD401", "CD402"}
    rollout_codes = {code for code, d in REGISTRY.items() if d.requires == ("rollouts",)}
    assert rollout_codes <= covered, f"add hand-built cases for {sorted(rollout_codes - covered)}"


def test_sparse_channel_is_information() -> None:
    """`judge` has a value on 10% of rollouts: CD103 says so (info); CD101 does not judge it."""
    steps = 100
    series = make_series(
        steps,
        channel_rows=per_channel(steps, ROWS, 0.1 * ROWS),
        channel_groups=per_channel(steps, GROUPS, 1),
        rel_gain=per_channel(steps, 0.6, 0.0),
    )
    diagnosis = diagnose_series(series)
    assert [(f.code, f.severity) for f in diagnosis.findings] == [("CD103", Severity.INFO)]
    assert diagnosis.channel_table()[1]["state"] == "sparse"


@pytest.mark.parametrize("scenario", ["healthy", "saturating-format", "tied-sums", "collinear", "outlier-groups"])
@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_no_remedy_contradicts_its_counterfactual(tmp_path, scenario: str, algo: str) -> None:  # type: ignore[no-untyped-def]
    """Every finding on every simulated scenario, judged as GRPO and as GDPO: a remedy proposes switching to
    GDPO only when its own gdpo_resolves is true (and never to a GDPO run), and never lowers the weight of a
    channel the run reports at its floor."""
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose
    from tests.helpers import runs

    diagnosis = diagnose([runs.simulated(tmp_path / "run.parquet", scenario, steps=80)], ScanOptions(algo=algo))
    floors = {row["channel"] for row in diagnosis.channel_table() if row.get("state") == "floor"}
    for finding in diagnosis.findings:
        if SWITCH.search(finding.remedy):
            assert algo == "grpo" and finding.gdpo_resolves is True, (finding.code, finding.remedy)
        lowered = {name for pair in LOWER.findall(finding.remedy) for name in pair if name}
        assert not lowered & floors, (finding.code, finding.remedy)


def test_mode_collapse_from_identical_completions() -> None:
    """16 groups a step with logged completions; from step 50 all 16 hold one completion repeated, so they are
    silent under both aggregations (every reward constant in the group): CD105 critical, graded on the last 10
    steps (160 of 160 groups identical), remedies on the policy's side only."""
    steps = 100
    identical = np.where(np.arange(steps) >= 50, float(GROUPS), 0.0)
    silent = {f"silent_groups_{a}": identical for a in ("grpo", "gdpo")}
    zero = {f"zero_adv_rows_{a}": identical * SIZE for a in ("grpo", "gdpo")}
    same = {f"silent_identical_groups_{a}": identical for a in ("grpo", "gdpo")}
    series = make_series(
        steps,
        completion_groups=float(GROUPS),
        identical_completion_groups=identical,
        distinct_completion_share=np.where(identical > 0, 1 / SIZE, 1.0),
        **silent,
        **zero,
        **same,
    )
    diagnosis = diagnose_series(series)
    (finding,) = by_code(diagnosis.findings, "CD105")
    assert finding.severity == Severity.CRITICAL and 50 <= finding.onset_step <= 55
    assert finding.evidence["groups_now"] == 10 * GROUPS and finding.evidence["identical_group_share_now"] == 1.0
    assert not {a.kind for f in diagnosis.findings for a in f.actions if f.code in ("CD102", "CD105")} & {
        "weight",
        "aggregation",
    }


def test_no_mode_collapse_while_completions_differ() -> None:
    series = make_series(100, completion_groups=float(GROUPS), identical_completion_groups=0.0)
    assert not by_code(diagnose_series(series).findings, "CD105")
