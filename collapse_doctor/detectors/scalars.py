"""CD5xx: collapse signals in the trainer's own scalar log (TensorBoard, trainer_state.json, verl JSONL).

These detectors need no rollouts: they read the canonical scalar series (:mod:`collapse_doctor.scalars`).
Each series has its own steps (tags are logged at different rates), so persistence is counted in logged
points of that series: a condition must hold for the same share of the points as the rollout detectors
require of the steps (5%, at least 3). Levels are judged against the run's own early level, so they work
whatever the reward scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor import scalars as S
from collapse_doctor.detectors.base import DetectionContext, Detector, Finding, Severity, persistent_onset, register
from collapse_doctor.detectors.remedies import aggregation_remedy, nanmedian
from collapse_doctor.scalars import TagPoints
from collapse_doctor.smoothing import ratio_to_running_peak, rolling

MIN_POINTS = 8
"""Fewer logged points than this say nothing about a trend: the detectors stay silent."""


class ScalarDetector(Detector):
    """Shared helpers: persistence, smoothing and the early reference level on one scalar series."""

    requires: ClassVar[tuple[str, ...]] = ("scalars",)

    @staticmethod
    def points(ctx: DetectionContext, name: str) -> TagPoints | None:
        if ctx.scalars is None:
            return None
        found = ctx.scalars.get(name)
        if found is None or len(found.steps) < MIN_POINTS:
            return None
        return found

    @staticmethod
    def persistence(ctx: DetectionContext, n: int) -> int:
        return ctx.config.persistence_steps(n)

    def smooth(self, ctx: DetectionContext, values: np.ndarray) -> np.ndarray:
        return rolling(values, max(1, self.persistence(ctx, len(values)) // 2) | 1)

    def early(self, ctx: DetectionContext, values: np.ndarray) -> float:
        """The run's early level: median of the first 10% of the points (at least the persistence window)."""
        n = len(values)
        head = max(self.persistence(ctx, n), math.ceil(0.1 * n), 3)
        return nanmedian(values[: min(n, head)])

    def relative_to_early(self, ctx: DetectionContext, values: np.ndarray) -> tuple[float, np.ndarray] | None:
        """The early level of the smoothed series and the series over it (``None`` when that level is not > 0)."""
        smooth = self.smooth(ctx, values)
        early = self.early(ctx, smooth)
        if not (np.isfinite(early) and early > 0):
            return None
        with np.errstate(invalid="ignore"):
            return early, smooth / early

    @staticmethod
    def settled_level(values: np.ndarray, stretch: tuple[int, int], persist: int) -> float:
        """Median over the last persistence window of a stretch: where the series stands at its end."""
        start, end = stretch
        return nanmedian(values[max(start, end - persist + 1) : end + 1])


def _tag(ctx: DetectionContext, name: str) -> str:
    assert ctx.scalars is not None
    return ctx.scalars.tags.get(name, name)


@register
class AdvantageStdShift(ScalarDetector):
    """The spread of advantages (or of rewards within a batch) spikes or collapses (scalar logs).

    What it detects
        The logged advantage standard deviation, or the logged reward std when the trainer logs no
        advantage std (TRL's `reward_std`, OpenRLHF's `group_reward_std`), compared with its own early
        level: a sustained rise to several times that level (a spike, e.g. 0.6 -> 4) or a sustained
        fall to a small fraction of it (a collapse toward 0).

    Why it matters
        Group-normalised advantages have a spread near 1 while groups still disagree. A collapse means
        the groups stopped disagreeing: the rewards no longer rank completions and the gradient fades
        while the loss looks normal. A spike means a few outlier groups or rewards now set the scale of
        the whole batch, so every other sample's update shrinks by comparison. Note that TRL's
        `reward_std` changed meaning in 0.27 (mean of per-group stds before, batch std after); both
        collapse when the groups stop disagreeing.

    Evidence
        The series used and its raw tag, the early level, the level over the stretch and the ratio.

    Remedy
        For a collapse: filter prompts that every completion passes or fails (dynamic sampling), raise
        num_generations or the temperature, or add a graded reward; scan the rollouts to see which
        channel saturated. For a spike: clip or squash the reward channel with outliers and look at the
        groups of that step.
    """

    code = "CD501"
    name = "advantage std shift"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "spike_ratio": 4.0,
        "collapse_ratio": 0.2,
        "critical_collapse_ratio": 0.05,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        name = S.ADVANTAGE_STD if self.points(ctx, S.ADVANTAGE_STD) is not None else S.REWARD_STD
        found = self.points(ctx, name)
        if found is None:
            return []
        values = found.values
        relative = self.relative_to_early(ctx, values)
        if relative is None:
            return []
        early, ratio = relative
        persist = self.persistence(ctx, len(values))
        findings = []
        spike = persistent_onset(ratio > ctx.threshold(self.code, "spike_ratio"), persist)
        collapse = persistent_onset(ratio < ctx.threshold(self.code, "collapse_ratio"), persist)
        for stretch, kind in ((spike, "spike"), (collapse, "collapse")):
            if stretch is None:
                continue
            level = nanmedian(values[ctx.window(stretch)])
            tail = self.settled_level(values, stretch, persist)
            factor = level / early
            critical = kind == "collapse" and tail / early < ctx.threshold(self.code, "critical_collapse_ratio")
            label = "advantage std" if name == S.ADVANTAGE_STD else "reward std"
            title = f"{label} {'spikes' if kind == 'spike' else 'collapses toward 0'}"
            message = (
                f"{label} (`{_tag(ctx, name)}`) went from {early:.3g} early in the run to {level:.3g} "
                f"({factor:.2g}x) from step {int(found.steps[stretch[0]])} on."
            )
            if kind == "collapse":
                message += " Groups stopped disagreeing: the gradient fades while the loss looks normal."
                remedy = (
                    "filter all-pass/all-fail prompts (dynamic sampling), raise num_generations or the "
                    "temperature, or add a graded reward; scan the rollouts to find the saturated channel"
                )
            else:
                message += " A few outlier groups or rewards now set the advantage scale of the batch."
                remedy = f"clip or squash the reward channel with outliers, or {aggregation_remedy(ctx)}"
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    steps=found.steps,
                    severity=Severity.CRITICAL if critical else Severity.WARNING,
                    title=title,
                    message=message,
                    evidence={"series": name, "tag": _tag(ctx, name), "early": early, "level": level, "now": tail},
                    remedy=remedy,
                )
            )
        return findings


@register
class KlOscillation(ScalarDetector):
    """The KL to the reference policy starts to oscillate while it climbs (scalar logs).

    What it detects
        The step-to-step changes of the logged KL, relative to the KL level (rolling std of the changes
        over rolling median level), compared with their early size: the detector fires when the
        relative swings grow several-fold and stay large while the KL level has risen well above its
        early level.

    Why it matters
        A smooth, slowly rising KL is normal. Swings that grow while the level climbs mean the policy
        is being pushed back and forth by unstable advantages (outlier groups, a spiking advantage
        scale, a reward channel that flips), which usually precedes a blow-up of the KL and of the
        response length.

    Evidence
        The raw KL tag, the early and late KL level, the early and late relative swing and their ratio.

    Remedy
        Lower the learning rate or raise the KL coefficient, clip advantages, and check the advantage
        std (CD501) and reward channels for outliers; GDPO keeps one channel's outliers from setting
        the scale of the others.
    """

    code = "CD502"
    name = "KL oscillation"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"swing_ratio": 3.0, "min_swing": 0.3, "level_ratio": 1.5}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.points(ctx, S.KL)
        if found is None:
            return []
        values = found.values
        n = len(values)
        persist = self.persistence(ctx, n)
        window = max(5, 2 * persist + 1)
        change = np.diff(values)
        diffs = np.concatenate([change[:1], change])
        mean = rolling(diffs, window, how="mean")
        square = rolling(diffs**2, window, how="mean")
        swing_std = np.sqrt(np.maximum(square - mean**2, 0.0))
        level = rolling(np.abs(values), window)
        with np.errstate(invalid="ignore", divide="ignore"):
            swing = np.where(level > 0, swing_std / level, np.nan)
        head = max(window, n // 4)
        early_swing = nanmedian(swing[:head])
        early_level = nanmedian(level[:head])
        if not (np.isfinite(early_swing) and np.isfinite(early_level)):
            return []
        ratio = ctx.threshold(self.code, "swing_ratio")
        condition = (
            (swing > max(ratio * early_swing, ctx.threshold(self.code, "min_swing")))
            & (level > ctx.threshold(self.code, "level_ratio") * max(early_level, 1e-12))
            & np.isfinite(swing)
        )
        stretch = persistent_onset(condition, persist)
        if stretch is None:
            return []
        part = ctx.window(stretch)
        late_swing = nanmedian(swing[part])
        late_level = nanmedian(level[part])
        return [
            self.finding(
                ctx,
                stretch,
                steps=found.steps,
                severity=Severity.WARNING,
                title="KL oscillates while it climbs",
                message=(
                    f"KL (`{_tag(ctx, S.KL)}`) rose from {early_level:.3g} to {late_level:.3g} and its step-to-step "
                    f"swings grew from {early_swing:.2g} to {late_swing:.2g} of its level from step "
                    f"{int(found.steps[stretch[0]])} on."
                ),
                evidence={
                    "tag": _tag(ctx, S.KL),
                    "kl_early": early_level,
                    "kl_late": late_level,
                    "relative_swing_early": early_swing,
                    "relative_swing_late": late_swing,
                },
                remedy=(
                    "lower the learning rate or raise the KL coefficient, clip advantages, and check the "
                    "advantage std (CD501) and the reward channels for outliers"
                ),
            )
        ]


@register
class EntropyCollapse(ScalarDetector):
    """The policy's entropy falls fast and stays down (scalar logs).

    What it detects
        The logged token entropy (TRL `entropy`, verl `actor/entropy`, NeMo-RL `approx_entropy`),
        smoothed, falling below a fraction of its early level and staying there.

    Why it matters
        Entropy that collapses means the policy samples nearly the same completion for every prompt:
        groups stop disagreeing, advantages go to 0 and exploration stops. It often follows a reward
        channel that is easy to game (a format check) pulling every completion toward one template.

    Evidence
        The raw entropy tag, early level, level now and the ratio, and the number of logged steps the
        fall took (from 90% to the threshold of the early level).

    Remedy
        Raise the sampling temperature or add an entropy bonus, lower the learning rate, clip higher
        (asymmetric clipping, DAPO's clip-higher), and check whether one channel dominates (CD402).
    """

    code = "CD503"
    name = "entropy collapse"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_ratio": 0.3, "critical_ratio": 0.1}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.points(ctx, S.ENTROPY)
        if found is None:
            return []
        relative = self.relative_to_early(ctx, found.values)
        if relative is None:
            return []
        early, ratio = relative
        persist = self.persistence(ctx, len(found.values))
        stretch = persistent_onset(ratio < ctx.threshold(self.code, "warn_ratio"), persist)
        if stretch is None:
            return []
        start = stretch[0]
        now = self.settled_level(found.values, stretch, persist)
        below_90 = np.flatnonzero(ratio[: start + 1] >= 0.9)
        fall_from = int(found.steps[below_90[-1]]) if len(below_90) else int(found.steps[0])
        critical = now / early < ctx.threshold(self.code, "critical_ratio")
        return [
            self.finding(
                ctx,
                stretch,
                steps=found.steps,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                title="entropy collapsed",
                message=(
                    f"entropy (`{_tag(ctx, S.ENTROPY)}`) fell from {early:.3g} to {now:.3g} "
                    f"({now / early:.0%} of its early level) between step {fall_from} and step "
                    f"{int(found.steps[start])}, and stayed down."
                ),
                evidence={
                    "tag": _tag(ctx, S.ENTROPY),
                    "early": early,
                    "now": now,
                    "ratio": now / early,
                    "fall_steps": int(found.steps[start]) - fall_from,
                },
                remedy=(
                    "raise the temperature or add an entropy bonus, lower the learning rate, use clip-higher, "
                    "and check whether one reward channel dominates (CD402)"
                ),
            )
        ]


@register
class ZeroStdShare(ScalarDetector):
    """Most groups of a batch have identical rewards (scalar logs).

    What it detects
        The logged share of groups whose rewards have zero standard deviation: TRL's
        `frac_reward_zero_std`, NeMo-RL's `baseline_reward/pct_0 + pct_1` (in percent), or one minus
        OpenRLHF's `dynamic_filtering_pass_rate`. It fires when the share, averaged over the
        persistence window, stays above a threshold.

    Why it matters
        A group whose completions all get the same reward has advantages of exactly 0 and gives no
        gradient. When most of the batch is like that the effective batch is a handful of prompts:
        updates get noisy and the run stalls while the loss curve looks normal. This is the scalar-log
        view of CD102.

    Evidence
        The series and its raw tag(s), the median share over the stretch and its peak.

    Remedy
        Filter prompts that are all-pass or all-fail (dynamic sampling), raise num_generations or the
        temperature, or add a graded reward; with several channels, GDPO keeps signal in groups where
        the channels cancel out.
    """

    code = "CD504"
    name = "zero-std group share"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.5, "critical_share": 0.8}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.points(ctx, S.ZERO_STD_SHARE)
        if found is None:
            return []
        persist = self.persistence(ctx, len(found.values))
        share = rolling(found.values, 2 * persist + 1, how="mean")
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return []
        part = ctx.window(stretch)
        level = nanmedian(found.values[part])
        peak = float(np.nanmax(found.values[part]))
        critical = level > ctx.threshold(self.code, "critical_share")
        return [
            self.finding(
                ctx,
                stretch,
                steps=found.steps,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                title="most groups give no gradient",
                message=(
                    f"{level:.0%} of groups had identical rewards for every completion (median over steps "
                    f"{int(found.steps[stretch[0]])}-{int(found.steps[stretch[1]])}, from "
                    f"`{_tag(ctx, S.ZERO_STD_SHARE)}`); their advantages are exactly 0."
                ),
                evidence={"tag": _tag(ctx, S.ZERO_STD_SHARE), "share": level, "peak_share": peak},
                remedy=(
                    "filter all-pass/all-fail prompts (dynamic sampling), raise num_generations or the "
                    f"temperature, or add a graded reward; with several channels, {aggregation_remedy(ctx)}"
                ),
            )
        ]


@register
class ChannelStdSaturation(ScalarDetector):
    """One reward channel's std falls to ~0 while the others still vary (scalar logs).

    What it detects
        Per channel, the logged std of its reward (TRL `rewards/<name>/std`, verl GDPO
        `gdpo/<name>/std`), smoothed, compared with its own peak so far. The detector fires when one
        channel's std stays below a small fraction of its peak while at least one other channel still
        varies at half its peak or more.

    Why it matters
        A channel whose reward is the same for every completion adds a constant and no ranking signal,
        but under GRPO (sum, then normalise) it keeps its weight in the sum. This is the scalar-log
        view of rel_gain decay (CD101): the run "trains" on a signal that no longer points anywhere.

    Evidence
        The channel, its peak std and step, its std now and the ratio, and the other channels' ratio
        to their own peaks.

    Remedy
        Lower the saturated channel's weight or drop it, make its check harder, or switch to GDPO;
        scan the rollouts (TRL's completions parquet) for the per-group picture.
    """

    code = "CD505"
    name = "channel std saturation"
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {"warn_ratio": 0.2, "critical_ratio": 0.05, "others_ratio": 0.5}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        if ctx.scalars is None:
            return []
        channels = [c for c in ctx.scalars.channels if self.points(ctx, S.CHANNEL_STD + c) is not None]
        if len(channels) < 2:
            return []
        ratios: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for channel in channels:
            found = self.points(ctx, S.CHANNEL_STD + channel)
            assert found is not None
            smooth = self.smooth(ctx, found.values)
            ratio, peak = ratio_to_running_peak(smooth)
            ratios[channel] = (found.steps, ratio, peak, found.values)
        warn = ctx.threshold(self.code, "warn_ratio")
        others_floor = ctx.threshold(self.code, "others_ratio")
        findings = []
        for channel in channels:
            steps, ratio, peak, values = ratios[channel]
            others_ok = np.zeros(len(steps), dtype=bool)
            other_now: dict[str, float] = {}
            for other in channels:
                if other == channel:
                    continue
                o_steps, o_ratio, _, _ = ratios[other]
                aligned = np.interp(steps, o_steps, np.nan_to_num(o_ratio, nan=0.0))
                others_ok |= aligned >= others_floor
                other_now[other] = nanmedian(o_ratio[-max(1, len(o_ratio) // 10) :])
            persist = self.persistence(ctx, len(steps))
            stretch = persistent_onset((ratio < warn) & others_ok, persist)
            if stretch is None:
                continue
            start = stretch[0]
            peak_value = float(peak[start])
            peak_at = int(steps[int(np.nanargmax(np.where(np.isfinite(values[: start + 1]), values[: start + 1], -1)))])
            now = self.settled_level(values, stretch, persist)
            now_ratio = now / peak_value if peak_value > 0 else float("nan")
            critical = now_ratio < ctx.threshold(self.code, "critical_ratio")
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    steps=steps,
                    severity=Severity.CRITICAL if critical else Severity.WARNING,
                    title=f"`{channel}` saturated: its reward std fell to ~0",
                    message=(
                        f"the std of `{channel}` fell from {peak_value:.3g} (step {peak_at}) to {now:.3g} "
                        f"({now_ratio:.0%} of its peak) from step {int(steps[start])} on, while the other "
                        f"channel(s) ({', '.join(f'`{o}`' for o in other_now)}) still vary: it adds a constant "
                        "and no ranking signal."
                    ),
                    channels=(channel,),
                    evidence={
                        "tag": _tag(ctx, S.CHANNEL_STD + channel),
                        "std_peak": peak_value,
                        "std_peak_step": peak_at,
                        "std_now": now,
                        "ratio": now_ratio,
                        "other_channels_ratio": other_now,
                    },
                    remedy=(
                        f"lower `{channel}`'s weight or drop it, make its check harder, or {aggregation_remedy(ctx)}; "
                        "scan the rollouts for the per-group picture"
                    ),
                    gdpo_resolves=True if ctx.algorithm != "gdpo" else None,
                )
            )
        return findings


@register
class LoggedAdvantageBound(ScalarDetector):
    """Logged advantage max/min beyond what a group z-score allows (scalar logs).

    What it detects
        The logged maximum and minimum advantage of each step (verl `critic/advantages/max|min`,
        NeMo-RL `train/advantages/max|min`) against the bound (n-1)/sqrt(n) that a group z-score of
        n samples cannot exceed (2.47 for n = 8; n from the rollouts when scanned together, else the
        `group_size` threshold). NeMo-RL's leave-one-out baseline widens the bound by n/(n-1).

    Why it matters
        Advantages beyond the bound mean the trainer did not normalise each group with its own
        statistics: stale or asynchronous reward windows, eps trouble, batch scaling, or an
        off-by-one group layout. Either the run is not doing the GRPO it is configured for, or the
        groups are mixed up, and the advantages' scale is not what the loss expects.

    Evidence
        The bound and the group size it assumes, the largest |advantage| over the stretch, and the
        raw tags.

    Remedy
        Check the group size (num_generations / rollout.n) and the advantage estimator's settings; with
        batch scaling on purpose (TRL scale_rewards="batch"), raise `group_size` or ignore CD506
        (`--ignore CD506`); scan the rollouts with `collapse-doctor scan` to compare against the
        recomputation (CD202).
    """

    code = "CD506"
    name = "logged advantage bound"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"group_size": 8, "tolerance": 0.05}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        high = self.points(ctx, S.ADVANTAGE_MAX)
        low = self.points(ctx, S.ADVANTAGE_MIN)
        if high is None and low is None:
            return []
        n = int(ctx.run.group_size_max) if ctx.run.group_size_max > 1 else int(ctx.threshold(self.code, "group_size"))
        bound = (n - 1) / math.sqrt(n)
        if ctx.scalars is not None and ctx.scalars.framework == "nemo_rl":
            bound *= n / (n - 1)
        limit = bound * (1 + ctx.threshold(self.code, "tolerance"))
        findings = []
        for found, sign, name in ((high, 1.0, S.ADVANTAGE_MAX), (low, -1.0, S.ADVANTAGE_MIN)):
            if found is None:
                continue
            beyond = sign * found.values > limit
            stretch = persistent_onset(beyond, self.persistence(ctx, len(found.values)))
            if stretch is None:
                continue
            part = ctx.window(stretch)
            extreme = float(np.nanmax(sign * found.values[part]))
            findings.append(
                self.finding(
                    ctx,
                    stretch,
                    steps=found.steps,
                    severity=Severity.WARNING,
                    title="logged advantages exceed the group z-score bound",
                    message=(
                        f"`{_tag(ctx, name)}` reached {sign * extreme:+.3g}, beyond the bound +-{bound:.3g} of a "
                        f"group z-score with {n} samples per group, from step {int(found.steps[stretch[0]])} on: "
                        "the trainer did not normalise each group by its own statistics."
                    ),
                    evidence={
                        "tag": _tag(ctx, name),
                        "bound": bound,
                        "group_size": n,
                        "largest_abs_advantage": extreme,
                        "share_of_points_beyond": float(np.mean(beyond)),
                    },
                    remedy=(
                        "check num_generations / rollout.n and the advantage settings; if the batch scaling is "
                        "intended, rescan with --ignore CD506 (or raise [thresholds.CD506] group_size)"
                    ),
                )
            )
        return findings
