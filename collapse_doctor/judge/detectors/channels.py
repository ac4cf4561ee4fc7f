"""CD4xx: how reward channels relate to each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core.findings import ConditionChannel, DropChannel, Remedy, SetRecipe, SetWeight
from collapse_doctor.core.series import MAX_PAIRED_CHANNELS, PAIRS_CAPPED
from collapse_doctor.core.smoothing import ratio_to_running_peak
from collapse_doctor.judge.budget import applies_share, channel_extreme_shares, run_extreme
from collapse_doctor.judge.detectors.base import (
    DetectionContext,
    Detector,
    Finding,
    NotEnoughData,
    NotJudged,
    Severity,
    persistent_onset,
    register,
)
from collapse_doctor.judge.detectors.remedies import (
    FROM_SCAN,
    estimator_remedy,
    gdpo_counterfactual,
    nanmedian,
    share_pct,
    switch_remedy,
)
from collapse_doctor.judge.summary import STATE_SHARE


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
        when |rho| stays above the threshold on steps with enough co-observed rollouts, and says
        whether the channels double-count (rho > 0) or cancel (rho < 0); with three or more channels the
        variance inflation factor (VIF) of each channel is reported too. A run of more than 64 channels is
        not judged (listed as skipped): its pairwise statistics, whose cost grows with the square of the
        channel count, are not computed.

    Why it matters
        Two channels that rank completions the same way (rho > 0) count the same signal twice: its
        effective weight is the sum of both weights, whatever the configured weights say. Two channels
        that rank them in opposite ways (rho < 0) cancel: their sum hides both, and tied sums follow
        (CD301). GDPO does not undo either when the channels are affine in each other within a group
        (their z-scores are equal or opposite). A correlation is judged only on steps with enough
        co-observed rollouts (a sparse channel shares few rows with the others).

    Evidence
        Median rho over the stretch and rho pooled over the stretch, the co-observed rollouts it rests on,
        the VIFs, both channels' weights.

    Remedy
        Positive: drop one of the two channels (the one with the lower weight is named), or merge them
        into one channel with the combined weight; `collapse-doctor retrain --from-scan scan.json` drops
        the named channel. Negative: merge them into one graded reward, or give them unequal weights.
    """

    code = "CD401"
    name = "reward collinearity"
    default_severity = Severity.WARNING
    targets = "pair"
    thresholds: ClassVar[Mapping[str, float]] = {"warn_rho": 0.85, "min_rows": 30, "min_steps_share": 0.5}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if len(series.channels) > MAX_PAIRED_CHANNELS:
            raise NotJudged(f"not judged: {len(series.channels)} channels; {PAIRS_CAPPED}")
        if "within_corr" not in series:
            return []
        warn = ctx.threshold(self.code, "warn_rho")
        min_rows = ctx.threshold(self.code, "min_rows")
        findings = []
        judged = 0
        for p, (a, b) in enumerate(series.pairs):
            rho = series["within_corr"][:, p]
            rows = series["corr_rows"][:, p]
            # A per-step correlation from a handful of co-observed rows says nothing: judge only steps with
            # enough rows, and only pairs that have such steps for most of the run.
            supported = np.isfinite(rho) & (rows >= min_rows / max(ctx.persistence, 1))
            if supported.mean() < ctx.threshold(self.code, "min_steps_share"):
                continue
            judged += 1
            stretch = ctx.sustained(ctx.smooth(np.where(supported, np.abs(rho), np.nan)) > warn)
            if stretch is None:
                continue
            window = ctx.window(stretch)
            if float(np.nansum(np.where(supported[window], rows[window], 0.0))) < min_rows:
                continue
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
            evidence["rows"] = float(np.nansum(np.where(supported[window], rows[window], 0.0)))
            from_step = int(series.steps[stretch[0]])
            if median > 0:
                title = f"`{a}` and `{b}` are collinear"
                meaning = "they rank completions the same way, so the shared signal counts twice"
                dropped = DropChannel(drop)
                remedy: str | Remedy = Remedy(
                    f"{dropped.describe()}: it repeats `{keep}`, rho={median:.2f} (collapse-doctor retrain "
                    f"{FROM_SCAN} drops it), or merge the two into one channel",
                    (dropped,),
                )
            else:
                title = f"`{a}` and `{b}` cancel each other"
                meaning = (
                    "they rank completions in opposite ways, so their sum hides both (tied sums under GRPO; "
                    "under GDPO too when one is an affine copy of the other)"
                )
                remedy = (
                    f"merge `{a}` and `{b}` into one graded reward, or give them unequal weights (TRL reward_weights) "
                    "so that their sum still ranks"
                )
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    severity=Severity.WARNING,
                    title=title,
                    message=(
                        f"within-group correlation of `{a}` and `{b}` is {median:.2f} (pooled {pooled:.2f}, "
                        f"{evidence['rows']:,.0f} co-observed rollouts) from step {from_step} on: {meaning}."
                    ),
                    channels=(a, b),
                    evidence=evidence,
                    remedy=remedy,
                    gdpo_resolves=gdpo_counterfactual(ctx, False),
                )
            )
        if series.pairs and not judged:
            raise NotEnoughData(f"no channel pair is observed together on {min_rows:g}+ rollouts for most steps")
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


NOT_RECOMPUTED = Remedy(
    "scan the rollouts (CollapseDoctorCallback writes them to OUTPUT/rollouts) to see whether GDPO would resolve it"
)
"""CD402's remedy on a run judged from the callback's scalars: the counterfactual needs the rollouts."""


@register
class DominantChannel(Detector):
    """One channel drowns the others in the combined advantage (dominant channel).

    What it detects
        Each channel's share of the within-group variance of the combined reward
        (w_c * Cov_within(r_c, total) / Var_within(total)), and how often its contribution decides
        the sign of a completion's advantage, under the run's aggregation. It fires when one channel holds
        most of that variance (more than `share`, and more than its configured weight intends by `margin`:
        a weight of 1 against 0.2 is a choice, not a pathology) and decides the sign of most advantages,
        over a long stretch (twice the persistence window), while another channel still varies within most
        groups. A rare large bonus holds most of the pooled variance but decides only the groups it occurs
        in, so it does not count as dominance. A run read from its scalar log only is judged on the
        per-channel series CollapseDoctorCallback logs (under the run's aggregation; the other aggregation's
        share, and so whether it would resolve the finding, is then not computed).

    Why it matters
        Summing rewards before normalising lets the channel with the widest spread decide the
        ranking: a binary format check (spread 1) drowns a continuous correctness score (spread
        0.2) even at equal weights. The drowned channel still varies but barely moves the
        advantages, so the policy does not learn it. The squeeze usually ends by itself (the dominant
        channel saturates and stops varying), but the steps it covered trained the drowned channel less:
        the finding keeps its severity after it ends (the current-window rule does not downgrade it).

    Evidence
        Variance share of the dominant channel under GRPO and GDPO, the share of advantage signs it
        decides, the channels it drowns and their rel_gain, a weight that would balance the spreads.

    Remedy
        Lower the dominant channel's weight to the suggested value (`retrain --weights name=w`, or TRL's
        `reward_weights`), and switch to GDPO when the same condition does not hold on its recomputed
        advantages (each channel normalised in its group first; the finding says whether it does).
        `collapse-doctor retrain --algo gdpo --from-scan scan.json` (written by `scan RUN --json
        scan.json`) trains GDPO with the weights the findings suggest; with your own TRL trainer set
        `multi_objective_aggregation="normalize_then_sum"`. A run that already is GDPO is pointed to
        `--algo gdpo-dynamic`. Gate the dominant channel on the objective it drowns (`condition = {x =
        "y >= 1"}`: it counts only where `y` passes, so it cannot be farmed while `y` fails; not when `y`
        is at its ceiling by the end, where it would gate nothing, nor when `y` never reaches 1, where it would
        count `x` nowhere); on a GRPO run where it began in the
        first half of the run and GDPO resolves it, switch when it shows (`hybrid_switch =
        "on-finding:CD402@warning"`). The finding's actions carry each of these; `--from-scan` applies them.
        Judged from the callback's scalars, the remedy points to the rollouts for the GDPO counterfactual.
        Another estimator (verl `algorithm.adv_estimator`) is named only where, on the same sampled groups
        (`run.counterfactuals`), the drowned channel decides at least twice the share of signs it decides under
        the run's own, and it leaves at most 5 points more rollouts without gradient (pass@k, which signs only
        each group's best rollout, is never a cure for drowning).
    """

    code = "CD402"
    name = "dominant channel"
    requires = ("channel_series",)
    graded_on_current_window = False  # the squeeze is the transition's harm; it ends when the channel saturates
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {
        "share": 0.8,
        "margin": 0.15,
        "sign_share": 0.5,
        "still_varies_ratio": 0.5,
        "stretch_factor": 2.0,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        channels = series.channels
        if len(channels) < 2:
            return []
        alg = ctx.algorithm
        varies = self._varies(ctx)
        findings = []
        for k, channel in enumerate(channels):
            stretch = self._stretch(ctx, k, varies)
            if stretch is None:
                continue
            # the other aggregation's shares exist only where the rollouts were recomputed (None: not computed)
            fires_other = self._stretch(ctx.counterfactual(), k, varies) is not None if ctx.recomputed else None
            resolves = None if fires_other is None else not fires_other
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
                        f"(steps {int(series.steps[stretch[0]])}-{int(series.steps[stretch[1]])}); "
                        + self._other_share(ctx, share_other)
                    ),
                    channels=(channel, *drowned),
                    evidence={
                        "variance_share_grpo": share_grpo,
                        "variance_share_gdpo": share_gdpo,
                        "sign_decided_share": signs,
                        "drowned_channels": drowned,
                        "suggested_weight": suggested,
                    },
                    remedy=Remedy.join(
                        switch_remedy(ctx, resolves) if ctx.recomputed else NOT_RECOMPUTED,
                        self._lower(channel, suggested),
                        self._recipes(ctx, stretch, channel, drowned, resolves=resolves is True),
                        estimator_remedy(
                            ctx,
                            window,
                            "decides",
                            f"let `{drowned[0]}` decide {{theirs}} of advantage signs",
                            channel=drowned[0],
                        )
                        if drowned and ctx.recomputed
                        else None,
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, resolves),
                )
            )
        return findings

    @staticmethod
    def _other_share(ctx: DetectionContext, share: float) -> str:
        """The clause on the other aggregation's share: its recomputed value, or why there is none."""
        other = ctx.other_algorithm.upper()
        if not ctx.recomputed:
            return f"its share under {other} was not computed (no rollouts were read to recompute them)."
        return f"under {other} its share would be {share_pct(share)}."

    @staticmethod
    def _lower(channel: str, suggested: float) -> Remedy:
        """Lower the loud channel's weight to the suggested value (two significant digits, as worded)."""
        if not (np.isfinite(suggested) and suggested > 0):
            return Remedy(f"lower `{channel}`'s weight (TRL: reward_weights)")
        weight = SetWeight(channel, float(f"{suggested:.2g}"))
        return Remedy(f"lower `{channel}`'s weight: retrain {weight.flag} (TRL: reward_weights)", (weight,))

    def _recipes(
        self, ctx: DetectionContext, stretch: tuple[int, int], channel: str, drowned: list[str], *, resolves: bool
    ) -> Remedy:
        """The retrain recipes for a loud channel: condition it on the objective it drowns (it then counts only
        where the objective passes, so it cannot be farmed while the objective fails; 1 is a binary verifier's pass
        value), unless that objective is at its ceiling by the end (a channel earned almost everywhere gates
        nothing); and on a GRPO run where it began in the first half of the run and GDPO's advantages do not show
        it, switch to GDPO only from the step after the monitor sees it (summed rewards while the channels agree).
        """
        series = ctx.series
        n = series.num_steps
        tail = slice(max(0, n - max(1, n // 10)), n)  # the channel table's "by the end" (its state column)
        ceiling = channel_extreme_shares(series, tail)[0]
        applies = applies_share(series, tail)
        at_ceiling = {
            c for k, c in enumerate(series.channels) if applies[k] >= STATE_SHARE and ceiling[k] >= STATE_SHARE
        }
        # a gate at 1 on an objective that never reaches 1 would count the loud channel nowhere: not proposed
        highest = run_extreme(series, "reward_max", "max")
        reaches = {c for k, c in enumerate(series.channels) if highest[k] >= 1.0}
        objective = next((c for c in drowned if c != channel and c not in at_ceiling and c in reaches), None)
        parts: list[Remedy] = []
        if objective is not None:
            gate = ConditionChannel(channel, objective, ">=", 1.0)
            parts.append(Remedy(f"{gate.describe()} (retrain: {gate.setting})", (gate,)))
        onset = int(series.steps[stretch[0]])
        if ctx.run.algorithm == "grpo" and resolves and onset <= ctx.run.steps // 2:
            switch = SetRecipe("hybrid_switch", f"on-finding:{self.code}@{Severity.WARNING.label}")
            parts.append(Remedy(f"switch when it shows (retrain: {switch.setting})", (switch,)))
        return Remedy.join(*parts)

    def _varies(self, ctx: DetectionContext) -> np.ndarray:
        """``[S, C]`` whether each channel still has something to say: it varies within most groups and its
        rel_gain is at least half its own peak so far (a channel constant in most groups is not drowned)."""
        series = ctx.series
        rel = series["rel_gain"]
        smooth_rel = np.stack([ctx.smooth(rel[:, k]) for k in range(rel.shape[1])], axis=1)
        varying = np.stack(
            [ctx.smooth(1.0 - series["channel_zero_var_share"][:, k]) for k in range(rel.shape[1])], axis=1
        )
        ratio = ratio_to_running_peak(smooth_rel)[0]
        return np.asarray((ratio > ctx.threshold(self.code, "still_varies_ratio")) & (varying >= 0.5))

    def _stretch(self, ctx: DetectionContext, k: int, varies: np.ndarray) -> tuple[int, int] | None:
        """Where channel ``k`` has far more say than its weight gives it under ``ctx``'s aggregation.

        It holds more than ``share`` of the within-group variance, more than its configured weights intend
        (``w_k^2 / sum w^2`` over the varying channels, what GDPO's unit-spread channels give) plus ``margin``,
        and decides the sign of most advantages, while another channel still varies.
        """
        series, alg = ctx.series, ctx.algorithm
        share = ctx.smooth(series[f"signal_share_{alg}"][:, k])
        signs = ctx.smooth(series[f"dominance_{alg}"][:, k])
        weights = np.array([ctx.run.weights.get(c, 1.0) for c in series.channels]) ** 2
        active = varies.copy()
        active[:, k] = True  # its own intended share among the channels that vary
        intended = weights[k] / np.maximum((active * weights).sum(axis=1), 1e-12)
        others_vary = np.delete(varies, k, axis=1).any(axis=1)
        limit = np.maximum(ctx.threshold(self.code, "share"), intended + ctx.threshold(self.code, "margin"))
        condition = (share > limit) & (signs > ctx.threshold(self.code, "sign_share")) & others_vary
        long_run = max(1, round(ctx.persistence * ctx.threshold(self.code, "stretch_factor")))
        return persistent_onset(condition, long_run)
