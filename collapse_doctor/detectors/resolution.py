"""CD3xx: distinct reward vectors that the advantage can no longer tell apart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from collapse_doctor.detectors.base import DetectionContext, Detector, Finding, Severity, register
from collapse_doctor.detectors.remedies import aggregation_remedy, gdpo_counterfactual, nanmedian


@register
class TiedSums(Detector):
    """Different reward vectors collapse to one GRPO advantage (tied-sum resolution loss).

    What it detects
        Among pairs of completions in a group whose reward vectors differ, the share whose weighted
        sums are equal: GRPO normalises the sum, so it gives both the same advantage ((1, 0) and
        (0, 1) are indistinguishable). Also reported: distinct advantage values per group under GRPO
        and GDPO. A run with a single channel can never have this finding.

    Why it matters
        The policy cannot learn which of two different behaviours was better when both get the same
        advantage. With several binary channels of equal weight, a large part of every batch carries
        no information about which channel was satisfied.

    Evidence
        Tied share of differing pairs (median over the stretch), the number of differing pairs per
        step, and the distinct-value ratio of advantages per group under GRPO and GDPO.

    Remedy
        Switch to GDPO (each channel normalised in its group before the sum keeps the vectors
        apart), or give the channels distinct weights that reflect their priority.
        `collapse-doctor retrain --algo gdpo --from-scan scan.json` (written by `scan RUN --json
        scan.json`) trains GDPO with the weights the findings suggest; with your own TRL trainer set
        `multi_objective_aggregation="normalize_then_sum"`. A run that already is GDPO is pointed to
        `--algo gdpo-dynamic`.
    """

    code = "CD301"
    name = "tied-sum resolution loss"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.1, "critical_share": 0.3}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if len(series.channels) < 2:
            return []
        smooth = ctx.smooth_rate(series["tied_pair_share"])
        stretch = ctx.sustained(smooth > ctx.threshold(self.code, "warn_share"))
        if stretch is None:
            return []
        window = ctx.window(stretch)
        share = nanmedian(series["tied_pair_share"][window])
        distinct_grpo = nanmedian(series["distinct_ratio_grpo"][window])
        distinct_gdpo = nanmedian(series["distinct_ratio_gdpo"][window])
        resolves = distinct_gdpo > distinct_grpo + 0.05
        severity = Severity.CRITICAL if share > ctx.threshold(self.code, "critical_share") else Severity.WARNING
        if ctx.algorithm == "gdpo":
            severity = Severity.INFO  # the run already keeps the vectors apart
        return [
            self.finding(
                ctx,
                stretch,
                severity=severity,
                title="different reward vectors get the same advantage",
                message=(
                    f"{share:.0%} of completion pairs with different reward vectors have equal summed rewards "
                    f"(median {nanmedian(series['differing_pairs'][window]):.0f} differing pairs per step); "
                    f"distinct advantage values per group: {distinct_grpo:.0%} under GRPO, {distinct_gdpo:.0%} "
                    "under GDPO."
                ),
                channels=tuple(series.channels),
                evidence={
                    "tied_pair_share": share,
                    "distinct_ratio_grpo": distinct_grpo,
                    "distinct_ratio_gdpo": distinct_gdpo,
                },
                remedy=(
                    f"{aggregation_remedy(ctx)}, or give the channels distinct weights (e.g. retrain --weights "
                    "a=1,b=0.5)"
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, bool(resolves)),
            )
        ]
