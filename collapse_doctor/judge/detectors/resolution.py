"""CD3xx: distinct reward vectors that the advantage can no longer tell apart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.judge.detectors.base import DetectionContext, Detector, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import (
    Remedy,
    estimator_remedy,
    gdpo_counterfactual,
    nanmedian,
    switch_remedy,
)


@register
class TiedSums(Detector):
    """Different reward vectors collapse to one advantage (tied-sum resolution loss).

    What it detects
        Among pairs of completions in a group whose reward vectors differ, the share that get the same
        advantage under the run's aggregation: under GRPO those whose weighted sums are equal ((1, 0) and
        (0, 1) are indistinguishable), under GDPO those whose fused per-channel z-scores are equal. The
        same share on the other aggregation's recomputed advantages is the counterfactual. GDPO separates
        most ties, but not two channels that are affine in each other within a group (B = 1 - A with equal
        weights: z_B = -z_A, so every pair ties under GDPO too); unequal weights, three or more channels, or
        groups that also hold other vectors break those ties. A run with a single channel can never have
        this finding.

    Why it matters
        The policy cannot learn which of two different behaviours was better when both get the same
        advantage. With several binary channels of equal weight, a large part of every batch carries
        no information about which channel was satisfied.

    Evidence
        Tied share of differing pairs under the run's aggregation and under the other one (over the
        stretch), the number of differing pairs it rests on, and the distinct-value ratio of advantages per
        group under GRPO and GDPO.

    Remedy
        Give the channels distinct weights that reflect their priority, and switch to GDPO when its
        recomputed advantages keep the vectors apart (the finding says whether they do).
        `collapse-doctor retrain --algo gdpo --from-scan scan.json` (written by `scan RUN --json
        scan.json`) trains GDPO with the weights the findings suggest; with your own TRL trainer set
        `multi_objective_aggregation="normalize_then_sum"`. A run that already is GDPO is pointed to
        `--algo gdpo-dynamic`. Another estimator (verl `algorithm.adv_estimator`) is named only where its tied
        share, computed on the same sampled groups (`run.counterfactuals`), is at most half the run's and it
        leaves at most 5 points more rollouts without gradient.
    """

    code = "CD301"
    name = "tied-sum resolution loss"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.1, "critical_share": 0.5, "min_pairs": 20}

    @staticmethod
    def _name(ctx: DetectionContext) -> str:
        return "tied_pair_share_gdpo" if ctx.algorithm == "gdpo" else "tied_pair_share"

    def _stretch(self, ctx: DetectionContext) -> tuple[int, int] | None:
        smooth = ctx.smooth_rate(ctx.series[self._name(ctx)])
        return ctx.sustained(smooth > ctx.threshold(self.code, "warn_share"))

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if len(series.channels) < 2:
            return []
        if float(np.nansum(series["differing_pairs"])) < ctx.threshold(self.code, "min_pairs"):
            raise NotEnoughData(f"fewer than {ctx.threshold(self.code, 'min_pairs'):g} pairs with different rewards")
        stretch = self._stretch(ctx)
        if stretch is None:
            return []
        window = ctx.window(stretch)
        other_ctx = ctx.counterfactual()
        fires_other = self._stretch(other_ctx) is not None
        share = float(np.nanmean(series[self._name(ctx)][window]))
        share_other = float(np.nanmean(series[self._name(other_ctx)][window]))
        pairs = float(np.nansum(series["differing_pairs"][window]))
        distinct_grpo = nanmedian(series["distinct_ratio_grpo"][window])
        distinct_gdpo = nanmedian(series["distinct_ratio_gdpo"][window])
        alg, alt = ctx.algorithm.upper(), other_ctx.algorithm.upper()
        severity = Severity.CRITICAL if share > ctx.threshold(self.code, "critical_share") else Severity.WARNING
        resolves = not fires_other
        channels = list(series.channels)
        weights_hint = ",".join(f"{c}={1.0 if i == 0 else 0.5:g}" for i, c in enumerate(channels[:2]))
        return [
            self.finding(
                ctx,
                stretch,
                severity=severity,
                title="different reward vectors get the same advantage",
                message=(
                    f"{share:.0%} of completion pairs with different reward vectors get the same {alg} advantage "
                    f"({pairs:,.0f} differing pairs over the stretch); under {alt} {share_other:.0%} would"
                    + (" (the same condition fires)." if fires_other else " (below the threshold).")
                    + f" Distinct advantage values per group: {distinct_grpo:.0%} under GRPO, {distinct_gdpo:.0%} "
                    "under GDPO."
                ),
                channels=tuple(series.channels),
                evidence={
                    "tied_pair_share": share,
                    f"tied_pair_share_{other_ctx.algorithm}": share_other,
                    "differing_pairs": pairs,
                    "distinct_ratio_grpo": distinct_grpo,
                    "distinct_ratio_gdpo": distinct_gdpo,
                },
                remedy=Remedy.join(
                    switch_remedy(ctx, resolves),
                    estimator_remedy(ctx, window, "tied_pair_share", "tie {theirs} of those pairs"),
                    f"give the channels distinct weights that reflect their priority (e.g. retrain --weights "
                    f"{weights_hint}; TRL reward_weights)",
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, resolves),
            )
        ]
