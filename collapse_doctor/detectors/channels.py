"""CD4xx: how reward channels relate to each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.detectors.base import (
    DetectionContext,
    Detector,
    Finding,
    Severity,
    persistent_onset,
    register,
)
from collapse_doctor.detectors.remedies import (
    FROM_SCAN,
    aggregation_remedy,
    gdpo_counterfactual,
    nanmedian,
    share_pct,
)
from collapse_doctor.smoothing import ratio_to_running_peak


def variance_inflation(corr: np.ndarray) -> np.ndarray:
    """VIF of each channel from a correlation matrix: the diagonal of its inverse.

    >>> variance_inflation(np.array([[1.0, 0.0], [0.0, 1.0]])).tolist()
    [1.0, 1.0]
    """
    try:
        return np.diag(np.linalg.inv(corr))
    except np.linalg.LinAlgError:
        return np.full(len(corr), np.inf)


@register
class Collinearity(Detector):
    """Two reward channels measure the same thing (reward collinearity).

    What it detects
        The correlation between channels of the rewards demeaned within each group (so prompt
        difficulty, which moves every channel together, does not count), pooled per step. It fires
        when |rho| stays above the threshold; with three or more channels the variance inflation
        factor (VIF) of each channel is reported too.

    Why it matters
        Two channels that rank completions the same way count the same signal twice: its effective
        weight is the sum of both weights, whatever the configured weights say. GDPO does not help
        here: both normalised channels still add up.

    Evidence
        Median |rho| over the stretch and rho pooled over the stretch, the VIFs, both channels'
        weights.

    Remedy
        Drop one of the two channels (the one with the lower weight is named), or merge them into
        one channel with the combined weight. `collapse-doctor retrain --from-scan scan.json` drops
        the named channel.
    """

    code = "CD401"
    name = "reward collinearity"
    default_severity = Severity.WARNING
    targets = "pair"
    thresholds: ClassVar[Mapping[str, float]] = {"warn_rho": 0.85, "critical_rho": 0.95}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if "within_corr" not in series:
            return []
        warn = ctx.threshold(self.code, "warn_rho")
        findings = []
        for p, (a, b) in enumerate(series.pairs):
            rho = series["within_corr"][:, p]
            stretch = ctx.sustained(ctx.smooth(np.abs(rho)) > warn)
            if stretch is None:
                continue
            window = ctx.window(stretch)
            median = nanmedian(rho[window])
            sxy = np.nansum(series["corr_sxy"][window, p])
            sxx = np.nansum(series["corr_sxx"][window, p])
            syy = np.nansum(series["corr_syy"][window, p])
            pooled = float(sxy / np.sqrt(sxx * syy)) if sxx > 0 and syy > 0 else float("nan")
            weights = ctx.run.weights
            drop, keep = (b, a) if weights.get(b, 1.0) <= weights.get(a, 1.0) else (a, b)
            evidence: dict[str, object] = {
                "rho_median": median,
                "rho_pooled": pooled,
                f"weight_{a}": weights.get(a, 1.0),
                f"weight_{b}": weights.get(b, 1.0),
            }
            if len(series.channels) >= 3:
                evidence["vif"] = dict(zip(series.channels, self._vif(ctx, window).tolist(), strict=True))
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.CRITICAL
                    if abs(median) > ctx.threshold(self.code, "critical_rho")
                    else Severity.WARNING,
                    title=f"`{a}` and `{b}` are collinear",
                    message=(
                        f"within-group correlation of `{a}` and `{b}` is {median:.2f} (pooled {pooled:.2f}) from "
                        f"step {int(series.steps[stretch[0]])} on: the shared signal counts twice."
                    ),
                    channels=(a, b),
                    evidence=evidence,
                    remedy=(
                        f"drop `{drop}`: it repeats `{keep}`, rho={median:.2f} (collapse-doctor retrain {FROM_SCAN} "
                        "drops it), or merge the two into one channel"
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, False),
                )
            )
        return findings

    @staticmethod
    def _vif(ctx: DetectionContext, window: slice) -> np.ndarray:
        series = ctx.series
        c = len(series.channels)
        corr = np.eye(c)
        for p, (a, b) in enumerate(series.pairs):
            i, j = series.channels.index(a), series.channels.index(b)
            sxy = np.nansum(series["corr_sxy"][window, p])
            den = np.sqrt(np.nansum(series["corr_sxx"][window, p]) * np.nansum(series["corr_syy"][window, p]))
            corr[i, j] = corr[j, i] = sxy / den if den > 0 else 0.0
        return variance_inflation(corr)


@register
class DominantChannel(Detector):
    """One channel drowns the others in the combined advantage (dominant channel).

    What it detects
        Each channel's share of the within-group variance of the combined reward
        (w_c * Cov_within(r_c, total) / Var_within(total)), and how often its contribution decides
        the sign of a completion's advantage. It fires when one channel holds most of that variance
        over a long stretch (twice the persistence window) while another channel still varies.

    Why it matters
        Summing rewards before normalising lets the channel with the widest spread decide the
        ranking: a binary format check (spread 1) drowns a continuous correctness score (spread
        0.2) even at equal weights. The drowned channel still varies but barely moves the
        advantages, so the policy does not learn it.

    Evidence
        Variance share of the dominant channel under GRPO and GDPO, the share of advantage signs it
        decides, the channels it drowns and their rel_gain, a weight that would balance the spreads.

    Remedy
        Switch to GDPO (each channel normalised in its group first), or lower the dominant channel's
        weight to the suggested value (`retrain --weights name=w`, or TRL's `reward_weights`).
        `collapse-doctor retrain --algo gdpo --from-scan scan.json` (written by `scan RUN --json
        scan.json`) trains GDPO with the weights the findings suggest; with your own TRL trainer set
        `multi_objective_aggregation="normalize_then_sum"`. A run that already is GDPO is pointed to
        `--algo gdpo-dynamic`.
    """

    code = "CD402"
    name = "dominant channel"
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {"share": 0.8, "still_varies_ratio": 0.5, "stretch_factor": 2.0}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        channels = series.channels
        if len(channels) < 2:
            return []
        alg = ctx.algorithm
        share_limit = ctx.threshold(self.code, "share")
        varies_ratio = ctx.threshold(self.code, "still_varies_ratio")
        long_run = max(1, round(ctx.persistence * ctx.threshold(self.code, "stretch_factor")))
        rel = series["rel_gain"]
        smooth_rel = np.stack([ctx.smooth(rel[:, k]) for k in range(len(channels))], axis=1)
        varies = ratio_to_running_peak(smooth_rel)[0] > varies_ratio
        findings = []
        for k, channel in enumerate(channels):
            share = ctx.smooth(series[f"signal_share_{alg}"][:, k])
            others_vary = np.delete(varies, k, axis=1).any(axis=1)
            condition = (share > share_limit) & others_vary
            stretch = persistent_onset(condition, long_run)
            if stretch is None:
                continue
            window = ctx.window(stretch)
            drowned = [channels[j] for j in range(len(channels)) if j != k and varies[window, j].mean() > 0.5]
            share_grpo = nanmedian(series["signal_share_grpo"][window, k])
            share_gdpo = nanmedian(series["signal_share_gdpo"][window, k])
            signs = nanmedian(series[f"dominance_{alg}"][window, k])
            std = series["reward_std"][window]
            w = ctx.run.weights
            spread_self = nanmedian(std[:, k]) * w.get(channel, 1.0)
            spread_others = max(
                (nanmedian(std[:, j]) * w.get(channels[j], 1.0) for j in range(len(channels)) if j != k),
                default=float("nan"),
            )
            suggested = w.get(channel, 1.0) * spread_others / spread_self if spread_self > 0 else float("nan")
            names = ", ".join(f"`{d}`" for d in drowned) or "the other channels"
            share_own, share_other = (share_gdpo, share_grpo) if alg == "gdpo" else (share_grpo, share_gdpo)
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.WARNING,
                    title=f"`{channel}` drowns {names}",
                    message=(
                        f"`{channel}` holds {share_pct(share_own)} of the within-group variance of the combined "
                        f"reward and decides {signs:.0%} of advantage signs while {names} still "
                        f"{'vary' if len(drowned) != 1 else 'varies'} "
                        f"(steps {int(series.steps[stretch[0]])}-{int(series.steps[stretch[1]])}); under "
                        f"{'GRPO' if alg == 'gdpo' else 'GDPO'} its share would be {share_pct(share_other)}."
                    ),
                    channels=(channel, *drowned),
                    evidence={
                        "variance_share_grpo": share_grpo,
                        "variance_share_gdpo": share_gdpo,
                        "sign_decided_share": signs,
                        "drowned_channels": drowned,
                        "suggested_weight": suggested,
                    },
                    remedy=(
                        f"{aggregation_remedy(ctx)}, or lower `{channel}`'s weight: retrain --weights "
                        f"{channel}={suggested:.2g} (TRL: reward_weights)"
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, bool(share_gdpo <= share_limit)),
                )
            )
        return findings
