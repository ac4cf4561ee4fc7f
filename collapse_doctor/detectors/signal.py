"""CD1xx: reward channels that stop giving a learning signal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.detectors.base import DetectionContext, Detector, Finding, Severity, register
from collapse_doctor.detectors.remedies import aggregation_remedy, gdpo_counterfactual, nanmedian, share_pct
from collapse_doctor.smoothing import ratio_to_running_peak


@register
class RelGainDecay(Detector):
    """A reward channel stops ranking the samples of a group (rel_gain decay).

    What it detects
        For each channel, rel_gain is the mean over groups of (max - min) of that channel's reward
        within the group: how much the channel still separates the completions of one prompt. The
        detector fires when a channel's rel_gain falls to a small fraction of its own peak (channels
        often rise before they saturate, so the reference is the peak so far, not step 0) and stays
        there for the persistence window.

    Why it matters
        A channel that is the same for every completion of a prompt adds a constant to the summed
        reward and no ranking signal. Saturation hurts most when it is almost complete: when 7 of 8
        completions pass a format check and one fails, that single failure dominates the group's std
        and squeezes the differences of the other channels (correctness, say) into a narrow band of
        advantages. The run keeps "training" on a signal that no longer points anywhere.

    Evidence
        Peak rel_gain and its step, rel_gain now (median of the last persistence window), the ratio,
        the share of groups where the channel is constant, and the other channels' share of the
        within-group variance of the combined reward under GRPO and under GDPO.

    Remedy
        Lower the saturated channel's weight or drop it, make it harder (a stricter check), or switch
        to GDPO (per-channel normalisation), which keeps the other channels at full resolution in the
        groups where the saturated channel still fails.
        `collapse-doctor retrain --algo gdpo --from-scan scan.json` (written by `scan RUN --json
        scan.json`) trains GDPO with the weights the findings suggest; with your own TRL trainer set
        `multi_objective_aggregation="normalize_then_sum"`. A run that already is GDPO is pointed to
        `--algo gdpo-dynamic`.
    """

    code = "CD101"
    name = "rel_gain decay"
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {"warn_ratio": 0.25, "critical_ratio": 0.1}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        warn = ctx.threshold(self.code, "warn_ratio")
        critical = ctx.threshold(self.code, "critical_ratio")
        findings = []
        for k, channel in enumerate(series.channels):
            raw = series["rel_gain"][:, k]
            smooth = ctx.smooth(raw)
            ratio, peak = ratio_to_running_peak(smooth)
            stretch = ctx.sustained(ratio < warn)
            if stretch is None:
                continue
            start, end = stretch
            peak_value = float(peak[start])
            peak_at = int(
                series.steps[
                    int(np.nanargmax(np.where(np.isfinite(smooth[: start + 1]), smooth[: start + 1], -np.inf)))
                ]
            )
            tail = slice(max(start, end - ctx.persistence + 1), end + 1)
            now = nanmedian(raw[tail])
            now_ratio = now / peak_value
            others = [j for j in range(len(series.channels)) if j != k]
            share_grpo = (
                nanmedian(series["signal_share_grpo"][start : end + 1][:, others].sum(axis=1))
                if others
                else float("nan")
            )
            share_gdpo = (
                nanmedian(series["signal_share_gdpo"][start : end + 1][:, others].sum(axis=1))
                if others
                else float("nan")
            )
            constant = nanmedian(series["channel_zero_var_share"][tail, k])
            severity = Severity.CRITICAL if now_ratio < critical else Severity.WARNING
            resolves = bool(others) and share_gdpo > share_grpo + 0.01
            other_names = ", ".join(f"`{series.channels[j]}`" for j in others)
            message = (
                f"rel_gain of `{channel}` fell from {peak_value:.3g} (step {peak_at}) to {now:.3g} "
                f"({now_ratio:.0%} of its peak) from step {int(series.steps[start])} on; it is constant in "
                f"{constant:.0%} of groups."
            )
            if others:
                message += (
                    f" The other channels ({other_names}) carry {share_pct(share_grpo)} of the within-group "
                    f"variance under GRPO, {share_pct(share_gdpo)} under GDPO."
                )
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=severity,
                    title=f"`{channel}` no longer ranks samples",
                    message=message,
                    channels=(channel,),
                    evidence={
                        "rel_gain_peak": peak_value,
                        "rel_gain_peak_step": peak_at,
                        "rel_gain_now": now,
                        "ratio": now_ratio,
                        "constant_group_share": constant,
                        "other_channels_share_grpo": share_grpo,
                        "other_channels_share_gdpo": share_gdpo,
                    },
                    remedy=(
                        f"lower `{channel}`'s weight (e.g. retrain --weights {channel}=0.1) or drop it, make the "
                        f"check harder, or {aggregation_remedy(ctx)}"
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, resolves),
                )
            )
        return findings


@register
class ZeroVarianceGroups(Detector):
    """Most groups give no gradient at all (zero-variance groups).

    What it detects
        The share of groups whose combined reward is the same for every completion. Their advantages
        are exactly 0, so they contribute nothing to the policy gradient. The detector fires when
        that share stays above a threshold.

    Why it matters
        A batch where most groups are all-pass or all-fail trains on a handful of prompts: the
        effective batch size collapses, updates get noisy, and the run stalls while the loss curve
        looks normal. Under GDPO a group only goes silent when every channel is constant, so a
        combined reward that is flat only because channels cancel out still gives signal there.

    Evidence
        Share of zero-variance groups under GRPO (constant combined reward) and under GDPO (every
        channel constant), median over the stretch, and its peak.

    Remedy
        Filter prompts that are too easy or too hard (dynamic sampling), sample more completions per
        prompt or at a higher temperature, or add a graded reward; if the channels vary but cancel
        out, switch to GDPO.
    """

    code = "CD102"
    name = "zero-variance groups"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.5, "critical_share": 0.8}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        key = "gdpo_zero_var_share" if ctx.algorithm == "gdpo" else "zero_var_share"
        smooth = ctx.smooth_rate(series[key])
        stretch = ctx.sustained(smooth > ctx.threshold(self.code, "warn_share"))
        if stretch is None:
            return []
        start, end = stretch
        window = slice(start, end + 1)
        grpo = nanmedian(series["zero_var_share"][window])
        gdpo = nanmedian(series["gdpo_zero_var_share"][window])
        level = gdpo if ctx.algorithm == "gdpo" else grpo
        critical = ctx.threshold(self.code, "critical_share")
        return [
            self.finding(
                ctx,
                stretch,
                severity=Severity.CRITICAL if level > critical else Severity.WARNING,
                title="most groups give no gradient",
                message=(
                    f"{level:.0%} of groups have every channel constant (median over steps "
                    f"{int(series.steps[start])}-{int(series.steps[end])}); their advantages are exactly 0. "
                    f"Under GRPO {grpo:.0%} of groups would have a constant combined reward."
                    if ctx.algorithm == "gdpo"
                    else f"{level:.0%} of groups have a constant combined reward (median over steps "
                    f"{int(series.steps[start])}-{int(series.steps[end])}); their advantages are exactly 0. "
                    f"Under GDPO {gdpo:.0%} of groups would be silent."
                ),
                evidence={
                    "zero_variance_share_grpo": grpo,
                    "zero_variance_share_gdpo": gdpo,
                    "peak_share": float(np.nanmax(series[key][window])),
                },
                remedy=(
                    "filter prompts that are all-pass or all-fail (dynamic sampling), raise num_generations "
                    "or the temperature, or add a graded reward"
                    + (f"; channels cancel out in many groups: {aggregation_remedy(ctx)}" if gdpo < 0.5 * grpo else "")
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, bool(gdpo < 0.5 * grpo)),
            )
        ]
