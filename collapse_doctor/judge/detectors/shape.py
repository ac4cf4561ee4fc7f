"""CD2xx: the distribution of advantages, recomputed and logged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.estimators import ESTIMATORS
from collapse_doctor.core.series import RunSeries
from collapse_doctor.judge.algorithm import match_shape, possible_shapes, unchecked
from collapse_doctor.judge.budget import channel_extreme_shares
from collapse_doctor.judge.detectors.base import POSITIVE, DetectionContext, Detector, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import Remedy, gdpo_counterfactual, nanmedian, switch_remedy


@register
class AdvantageShape(Detector):
    """Outlier-dominated groups, bimodal or heavy-tailed advantages (advantage shape).

    What it detects
        Three shapes of the advantage distribution, each over a sustained stretch of steps:
        outlier-dominated groups (the most extreme completion's combined reward lies more than 8
        standard deviations of the rest of its group away from them, and more than 3 of the step's pooled
        within-group standard deviations, while the rest still differ on the channel that makes it
        extreme: a lone success or failure on a bounded channel, the rest of the group constant on it, is
        how GRPO learns from rare successes and is not counted);
        a bimodal batch distribution (Sarle's bimodality coefficient above its cutoff on advantages
        that take many distinct values); heavy tails (excess kurtosis above the threshold). Group
        z-scores are bounded by (n-1)/sqrt(n), so heavy tails in recomputed advantages show up as
        outlier-dominated groups rather than as large values. Outlier groups are judged under
        the run's own aggregation: when its advantages still spread the rest of such groups (std at
        least `squeezed_rest_std`, as GDPO's per-channel normalisation usually does), the finding is
        only informational. Outlier and lone-success groups need 4 or more completions: in a group of
        2 a "lone success" is just a 1/0 pair, and a rest of one or two completions has no spread to
        squeeze.

        Bimodality and heavy tails are judged only on advantages whose values are not forced by the
        layout, on steps that pass two tests. (1) The layout allows at least `min_support` distinct
        advantage values per step. In a group of 2 whose rewards differ the group z-score is
        +-|r_1 - r_2| / 2 / (|r_1 - r_2| / sqrt(2) + 1e-4), i.e. +-1/sqrt(2) (0.707) whatever the
        rewards: GRPO advantages take 2 values, GDPO's fused sum of per-channel z-scores
        sum_k w_k s_k / sqrt(2), s_k in {-1, 0, 1}, at most 3^C (its batch re-normalisation is affine),
        counted with the run's weights (5 for two equally weighted channels). Such a histogram is two
        spikes (or a small lattice) by construction and says nothing about outliers; with one binary
        reward at group size 2 a step holds only -0.707, 0 and +0.707. (2) In a group whose totals
        differ at least 2 advantages differ, so the distinct-value ratio per group is at least 2/n;
        the mean of distinct values per completion over such groups must reach `min_distinct_ratio`.
        That separates few-valued rewards at n >= 3 (a binary channel gives 2 values per group, a
        ratio of 2/n <= 0.67; over the step 2(n-1) values, bimodal by construction) from rewards that
        rank every completion; at n = 2 the ratio is 1 by construction, hence test (1). A reward that ranks
        the completions of every group alike (each group a permutation of the same n levels) passes both, but
        its batch is an evenly spaced lattice of n values, whose bimodality coefficient is at most 2/3 (n = 3)
        and whose excess kurtosis is negative: neither shape fires on it.

    Why it matters
        In an outlier-dominated group one completion takes almost all of the group's advantage and
        the others are squeezed into a narrow band near one value: the policy learns "be the outlier"
        and nothing about the differences among the rest. A bimodal distribution usually means one
        coarse channel decides the sign of every advantage.

    Evidence
        Share of outlier-dominated groups, the spread (std) of the remaining completions' advantages
        in those groups under GRPO and GDPO, bimodality coefficient, excess kurtosis, distinct-value ratio.

    Remedy
        Clip or rescale the channel that produces the extreme rewards (or cap it with a bounded
        transform), inspect the outlier completions, or switch to GDPO, whose per-channel
        normalisation bounds each channel's say in the group. For bimodal advantages: rebalance the
        channel that decides the signs (CD402); with a single channel, give it finer levels (partial
        credit).
    """

    code = "CD201"
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {
        "squeezed_rest_std": POSITIVE,
        "excess_kurtosis": ThresholdRange(-2.0),
    }
    name = "advantage shape"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "outlier_share": 0.05,
        "outlier_share_critical": 0.2,
        "squeezed_rest_std": 0.5,
        "bimodality": 0.7,
        "min_distinct_ratio": 0.9,
        "min_support": 10,
        "excess_kurtosis": 3.0,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        alg = ctx.algorithm
        findings = []
        share = ctx.smooth_rate(series["outlier_group_share"])
        stretch = ctx.sustained(share > ctx.threshold(self.code, "outlier_share"))
        if stretch is not None:
            window = ctx.window(stretch)
            # The rate over the stretch (what the smoothed decision saw); a median of per-step shares is 0
            # when the run has few groups per step and most steps hold none.
            level = float(np.nanmean(series["outlier_group_share"][window]))
            rest_grpo = nanmedian(series["outlier_rest_std_grpo"][window])
            rest_gdpo = nanmedian(series["outlier_rest_std_gdpo"][window])
            spreads = {"grpo": f"{rest_grpo:.2f} under GRPO", "gdpo": f"{rest_gdpo:.2f} under GDPO"}
            own, other = ("gdpo", "grpo") if alg == "gdpo" else ("grpo", "gdpo")
            critical = level > ctx.threshold(self.code, "outlier_share_critical")
            rest_own = rest_gdpo if own == "gdpo" else rest_grpo
            rest_other = rest_grpo if own == "gdpo" else rest_gdpo
            resolves = bool(rest_other >= ctx.threshold(self.code, "squeezed_rest_std"))
            severity = Severity.CRITICAL if critical else Severity.WARNING
            rest = f"the rest are squeezed to an advantage spread of {spreads[own]} ({spreads[other]})"
            if rest_own >= ctx.threshold(self.code, "squeezed_rest_std"):
                severity = Severity.INFO  # the run's aggregation keeps the rest of those groups apart
                rest = f"the rest keep an advantage spread of {spreads[own]}, this run's aggregation ({spreads[other]})"
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=severity,
                    title="outlier completions dominate their groups",
                    message=(
                        f"in {level:.0%} of groups one completion's reward lies far outside the rest of its "
                        f"group; {rest}."
                    ),
                    channels=_heavy_tailed_channels(series, window),
                    evidence={
                        "outlier_group_share": level,
                        "rest_advantage_std_grpo": rest_grpo,
                        "rest_advantage_std_gdpo": rest_gdpo,
                        "excess_kurtosis": nanmedian(series[f"adv_kurtosis_{alg}"][window]),
                    },
                    remedy=Remedy.join(
                        "cap or squash (tanh) the channel with extreme rewards (find them: collapse-doctor advantages "
                        "RUN -o adv.parquet)",
                        switch_remedy(ctx, resolves),
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, resolves),
                )
            )
        findings += self._lone(ctx)
        bimodal = ctx.smooth(series[f"adv_bimodality_{alg}"])
        distinct = ctx.smooth(series[f"distinct_ratio_{alg}"])
        # Shape is judged only where the values are not forced: the layout must allow enough of them per step
        # (groups of 2 allow 2 under GRPO) and the groups must hold many (binary rewards at n >= 3: 2 per group).
        many_valued = (distinct >= ctx.threshold(self.code, "min_distinct_ratio")) & (
            forced_support(series, ctx.run.weights, alg) >= ctx.threshold(self.code, "min_support")
        )
        condition = (bimodal > ctx.threshold(self.code, "bimodality")) & many_valued
        stretch = ctx.sustained(condition)
        if stretch is not None:
            window = ctx.window(stretch)
            other = "gdpo" if alg == "grpo" else "grpo"
            value = nanmedian(series[f"adv_bimodality_{alg}"][window])
            value_other = nanmedian(series[f"adv_bimodality_{other}"][window])
            resolves_bimodal = bool(value_other <= ctx.threshold(self.code, "bimodality"))
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.WARNING,
                    title="advantages split into two modes",
                    message=(
                        f"the batch distribution of {alg.upper()} advantages is bimodal (bimodality coefficient "
                        f"{value:.2f} > {ctx.threshold(self.code, 'bimodality'):.2f}; {other.upper()}: "
                        f"{value_other:.2f}): one coarse signal decides most advantage signs."
                    ),
                    evidence={f"bimodality_{alg}": value, f"bimodality_{other}": value_other},
                    remedy=Remedy.join(
                        (
                            "see which channel dominates (CD402) and rebalance its weight"
                            if len(series.channels) > 1
                            else "the single reward is coarse: give it finer levels (partial credit)"
                        ),
                        switch_remedy(ctx, resolves_bimodal),
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, resolves_bimodal),
                )
            )
        kurt = ctx.smooth(series[f"adv_kurtosis_{alg}"])
        # Few-valued advantages (bounded, binary rewards) get their tails from lone successes and failures, which is
        # how GRPO learns from them: heavy tails are judged only on advantages that take many values.
        stretch = ctx.sustained((kurt > ctx.threshold(self.code, "excess_kurtosis")) & many_valued)
        if stretch is not None:
            window = ctx.window(stretch)
            value = nanmedian(series[f"adv_kurtosis_{alg}"][window])
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.WARNING,
                    title="heavy-tailed advantages",
                    message=f"excess kurtosis of the advantages is {value:.1f}: a few completions carry the update.",
                    evidence={"excess_kurtosis": value},
                    remedy=(
                        "find the extreme completions (collapse-doctor advantages RUN -o adv.parquet) and clip or "
                        "squash the channel that produces them"
                    ),
                    gdpo_resolves=None,
                )
            )
        return findings

    def _lone(self, ctx: DetectionContext) -> list[Finding]:
        """Groups whose advantage is one completion's lone success or failure: how GRPO learns (information)."""
        series = ctx.series
        limit = ctx.threshold(self.code, "outlier_share")
        stretch = ctx.sustained(ctx.smooth_rate(series["outlier_lone_share"]) > limit)
        if stretch is None:
            return []
        window = ctx.window(stretch)
        level = float(np.nanmean(series["outlier_lone_share"][window]))
        # The channels the lone successes or failures come from: constant in most groups, but not in all.
        ceiling, floor, _ = channel_extreme_shares(series, window)
        lone = tuple(c for k, c in enumerate(series.channels) if 0.5 <= max(ceiling[k], floor[k]) < 0.995)
        others = len(series.channels) > len(lone)
        # Per-channel normalisation keeps the other channels at unit spread in those groups; with no other channel
        # GDPO's advantages are GRPO's up to the batch step.
        resolves = others and bool(lone)
        squeeze = ""
        if ctx.algorithm == "grpo" and others:
            squeeze = " Under GRPO the other channels' differences in those groups are squeezed by it" + (
                "; GDPO keeps them at full spread." if resolves else "."
            )
        names = ", ".join(f"`{c}`" for c in lone) or "a channel"
        return [
            self.finding(
                ctx,
                stretch,
                severity=Severity.INFO,
                title="rare successes carry the signal",
                message=(
                    f"in {level:.0%} of groups a single completion alone succeeds or fails on {names}, on which the "
                    "rest of its group agrees; it takes the group's largest advantage. That is how GRPO learns from "
                    f"rare successes: do not clip or squash that channel.{squeeze}"
                ),
                channels=lone,
                evidence={"lone_outlier_group_share": level},
                remedy=Remedy.join(
                    "nothing to fix; more generations per prompt find more such successes",
                    switch_remedy(ctx, resolves),
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, resolves),
            )
        ]


PAIR_SUPPORT_CAP = 1_000
"""Stop counting a group-of-2 GDPO lattice once it holds this many values (far above any ``min_support``)."""


def forced_support(series: RunSeries, weights: Mapping[str, float], algorithm: str) -> np.ndarray:
    """Per step, the most distinct advantage values the layout allows over the rows of groups with signal.

    Bounded only where every group has at most 2 valid rows (``group_size_max <= 2``): such a group's z-score
    is +-1/sqrt(2) whatever the rewards, so GRPO advantages take 2 values and GDPO's fused sum
    ``sum_k w_k s_k / sqrt(2)`` (``s_k`` in {-1, 0, 1}; a constant or NaN channel gives 0) at most the distinct
    values of that sum, which batch re-normalisation maps one to one. ``inf`` elsewhere: with 3+ rows the support
    depends on the reward levels (the distinct-value ratio judges it).

    >>> series = RunSeries(np.arange(3), ("a", "b"), [("a", "b")], {"group_size_max": np.array([2.0, 2.0, 8.0])})
    >>> forced_support(series, {}, "grpo").tolist(), forced_support(series, {}, "gdpo").tolist()
    ([2.0, 2.0, inf], [5.0, 5.0, inf])
    >>> forced_support(series, {"a": 1.0, "b": 0.7}, "gdpo").tolist()
    [9.0, 9.0, inf]
    """
    pairs_only = series["group_size_max"] <= 2
    if algorithm == "grpo":
        bound = 2.0
    else:
        # An equal-weight lattice is coarser than an unequal one: (1, 1) gives 0, +-1, +-2 (times 1/sqrt(2)).
        values = {0.0}
        for channel in series.channels:
            w = float(weights.get(channel, 1.0))
            values = {round(v + s * w, 9) for v in values for s in (-1.0, 0.0, 1.0)}
            if len(values) > PAIR_SUPPORT_CAP:
                break
        bound = float(len(values))
    with np.errstate(invalid="ignore"):
        return np.where(pairs_only, bound, np.inf)


def _heavy_tailed_channels(series: RunSeries, window: slice) -> tuple[str, ...]:
    """Channels whose step range spans far more of their within-group std than the others' (the extreme values).

    A bounded or normal channel's range is a few stds (about 4 for 128 draws of a uniform or normal); one with rare
    extreme values spans several times that. Named when its median range/std is above twice the channels' median
    and above 8.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = (series["reward_max"][window] - series["reward_min"][window]) / series["reward_std"][window]
    ratio = np.array([nanmedian(spread[:, k]) for k in range(len(series.channels))])
    typical = nanmedian(ratio)
    return tuple(c for k, c in enumerate(series.channels) if ratio[k] > max(8.0, 2 * typical))


@register
class AdvantageBound(Detector):
    """Logged advantages beyond the group z-score bound or unlike any recomputation (advantage bound).

    What it detects
        Compares the advantage column the trainer logged with what collapse-doctor recomputes from
        the logged rewards. With group size n, a group z-score satisfies |A| <= (n-1)/sqrt(n) (2.47
        for n = 8); the detector fires when a share of logged advantages exceeds that bound, or when
        the logged values match none of the estimators it recomputes: GRPO (group, batch or no
        scaling, population std), GDPO (TRL's and verl's token-weighted), NeMo-RL's leave-one-out
        GRPO, RLOO, OPO, GPG, pass@k GRPO, REINFORCE++ and its group-baseline variant (the table
        in docs/input-formats.md). OPO, REINFORCE++ and verl's GDPO weight by response tokens; without
        completion_length they are fitted up to what the token counts decide: OPO and REINFORCE++
        match by that fit; REINFORCE++ with a group baseline and verl's GDPO stay possible when it fits
        (GRPO or GDPO under rescaled weights fits too), and a mismatch is then reported at info level,
        naming what could not be checked, instead of as a warning. The bound is checked
        only where it holds: when the logged values match group-scaled GRPO, or match no
        recomputation (unless the run is GDPO by --algo). The other estimators exceed it by design.
        Rollouts with weight/<channel> columns (gdpo-dynamic) are reported as using dynamic
        weights (info), not as a mismatch.

    Why it matters
        A logged advantage beyond the bound means the trainer did not use the group statistics it
        claims: stale or asynchronous reward windows, a broken epsilon, batch scaling, rewards
        changed after the advantage was computed. Either the log or the training is wrong, and every
        other diagnosis of the run rests on it.

    Evidence
        Share of logged advantages beyond the bound, the largest |A| logged and the bound, the mean
        absolute difference from each recomputation that could be computed, and those that could not
        (not_checked, by missing column).

    Remedy
        Check that advantages are computed from the same rewards and groups that are logged (no
        off-by-one step, no asynchronous reward window), the scale_rewards and
        multi_objective_aggregation settings, and that num_generations matches the group size.
    """

    code = "CD202"
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {"mismatch_mae": POSITIVE, "match_mae": POSITIVE}
    name = "advantage bound"
    default_severity = Severity.WARNING
    requires = ("rollouts", "logged_advantage")
    thresholds: ClassVar[Mapping[str, float]] = {
        "beyond_share": 0.01,
        "beyond_share_critical": 0.1,
        "mismatch_mae": 0.05,
        "match_mae": 0.01,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        findings: list[Finding] = []
        compared = tuple(spec.key for spec in ESTIMATORS if f"logged_mae_{spec.key}" in series)
        every = {c: nanmedian(series[f"logged_mae_{c}"]) for c in compared}
        # an estimator that needs a column the run lacks has no MAE: named as not checked, never as a mismatch
        not_checked = unchecked(every)
        not_checked_keys = {key for keys in not_checked.values() for key in keys}
        candidates = tuple(c for c in compared if np.isfinite(every[c]))
        maes = {c: every[c] for c in candidates}
        if not candidates:
            return findings  # no step with both a logged advantage and rewards to recompute it from
        best = min(candidates, key=lambda c: maes[c])
        matched = best if maes[best] <= ctx.threshold(self.code, "match_mae") else None
        shapes = {
            c: nanmedian(series[f"logged_shape_mae_{c}"]) for c in not_checked_keys if f"logged_shape_mae_{c}" in series
        }
        if matched is None:
            # a token-weighted estimator without the lengths: matched up to its token weighting, nothing to flag
            matched = match_shape(shapes)
        # estimators not checked even up to their shape, or whose shape fits but would fit GRPO or GDPO under other
        # weights too: a mismatch may be theirs, so it is only reported
        unknowable = {k for k in not_checked_keys if not np.isfinite(shapes.get(k, np.nan))}
        unknowable |= set(possible_shapes(shapes))
        dynamic = ctx.run.dynamic_weight_channels if matched is None else ()
        # A GDPO run (by --algo or detected) re-normalises over the batch: the group bound does not hold for it.
        claims_gdpo = ctx.run.algorithm == "gdpo"
        # The bound holds only for group-scaled GRPO: batch scaling and GDPO's batch re-normalisation exceed
        # it by design. Logged values that match one of those are what the trainer claims to do.
        check_bound = not claims_gdpo and (matched == "grpo" or (matched is None and not dynamic))
        stretch = None
        if check_bound:
            beyond = ctx.smooth_rate(series["logged_beyond_bound_share"])
            stretch = ctx.sustained(beyond > ctx.threshold(self.code, "beyond_share"))
        if stretch is not None:
            window = ctx.window(stretch)
            level = nanmedian(series["logged_beyond_bound_share"][window])
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=(
                        Severity.CRITICAL
                        if level > ctx.threshold(self.code, "beyond_share_critical")
                        else Severity.WARNING
                    ),
                    title="logged advantages exceed the group z-score bound",
                    message=(
                        f"{level:.1%} of logged advantages exceed (n-1)/sqrt(n) = "
                        f"{nanmedian(series['logged_bound'][window]):.2f} (largest |A| "
                        f"{float(np.nanmax(series['logged_abs_max'][window])):.2f}): the trainer did not use "
                        "plain group statistics."
                    ),
                    evidence={
                        "beyond_bound_share": level,
                        "logged_abs_max": float(np.nanmax(series["logged_abs_max"][window])),
                        "bound": nanmedian(series["logged_bound"][window]),
                        **{f"mae_{c}": maes[c] for c in candidates},
                    },
                    remedy=(
                        "check scale_rewards / multi_objective_aggregation, that num_generations equals the "
                        "group size, and that rewards are not recomputed after the advantages (async windows)"
                    ),
                    gdpo_resolves=None,
                )
            )
        per_step = np.stack([series[f"logged_mae_{c}"] for c in candidates])
        # a step whose rewards are all NaN has no MAE under any recomputation: NaN, never a warning on stderr
        missing = np.isnan(per_step)
        best_series = np.where(missing.all(axis=0), np.nan, np.where(missing, np.inf, per_step).min(axis=0))
        stretch = ctx.sustained(ctx.smooth(best_series) > ctx.threshold(self.code, "mismatch_mae"))
        if stretch is not None and dynamic:
            window = ctx.window(stretch)
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.INFO,
                    title="logged advantages use dynamic channel weights",
                    message=(
                        f"the rollouts carry per-step weights (weight/ columns for {', '.join(dynamic)}, as "
                        "collapse-doctor retrain --algo gdpo-dynamic writes them); the recomputations use fixed "
                        f"weights, so they differ (closest: {best}, mean absolute difference "
                        f"{nanmedian(best_series[window]):.3f}). This is expected, not a misconfiguration."
                    ),
                    evidence={"dynamic_weight_channels": list(dynamic), **{f"mae_{c}": maes[c] for c in candidates}},
                    remedy="none needed; compare with fixed weights: collapse-doctor advantages RUN -o adv.parquet",
                    gdpo_resolves=None,
                )
            )
        elif stretch is not None and matched is None:
            window = ctx.window(stretch)
            missing = "; ".join(
                f"cannot check {', '.join(k for k in keys if k in unknowable)} without {column} (a fit up to their "
                "token weighting cannot tell them from GRPO or GDPO under other weights)"
                if unknowable & set(keys)
                else f"{', '.join(keys)}, not checked exactly without {column}, do not fit up to their token weighting"
                for column, keys in not_checked.items()
            )
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.INFO if unknowable else Severity.WARNING,
                    title="logged advantages match no estimator that could be checked"
                    if unknowable
                    else "logged advantages match no recomputation",
                    message=(
                        f"logged advantages differ from every recomputation from the logged rewards; the "
                        f"closest is {best} with a mean absolute difference of "
                        f"{nanmedian(best_series[window]):.3f}." + (f" {missing}." if missing else "")
                    ),
                    evidence={
                        **{f"mae_{c}": maes[c] for c in candidates},
                        **({"not_checked": {k: list(v) for k, v in not_checked.items()}} if not_checked else {}),
                    },
                    remedy=(
                        "check that the logged rewards and groups are the ones the advantages were computed "
                        "from; if the trainer weights its channels, rescan with its reward_weights: "
                        "collapse-doctor scan RUN --weights name=w,..."
                    ),
                    gdpo_resolves=None,
                )
            )
        return findings
