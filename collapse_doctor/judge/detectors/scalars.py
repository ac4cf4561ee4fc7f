"""CD5xx: collapse signals in the trainer's own scalar log (TensorBoard, trainer_state.json, verl JSONL).

These detectors need no rollouts: they read the canonical scalar series (:mod:`collapse_doctor.core.scalars`).
Each series has its own steps (tags are logged at different rates), so persistence is counted in logged
points of that series: a condition must hold for the same share of the points as the rollout detectors
require of the steps (5%, at least 3). Levels are judged against the run's own early level, so they work
whatever the reward scale. A series with fewer than ``min_points`` logged points is not judged (the detector
is listed as skipped with "not enough data to judge"); a series the log does not have is simply not judged.

A scalar log says nothing about what the other aggregation would do: CD5xx findings leave ``gdpo_resolves``
unset and never propose switching aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import ratio_to_running_peak, rolling
from collapse_doctor.judge.detectors.base import (
    DetectionContext,
    Detector,
    Finding,
    NotEnoughData,
    Severity,
    persistent_onset,
    register,
)
from collapse_doctor.judge.detectors.remedies import join_remedies, nanmedian

MIN_POINTS = 8
"""Default ``min_points``: fewer logged points than this say nothing about a trend."""

ZERO = 1e-6
"""A std at or below this fraction of a series' own scale is exactly zero (every value the same)."""

ALL_FAIL_REMEDY = (
    "all-fail (too hard or a broken reward): check the reward function on real completions, then easier prompts "
    "or a curriculum, partial credit, or a higher num_generations"
)
ALL_PASS_REMEDY = (
    "all-pass (learned): harder prompts, filter solved prompts (dynamic sampling), or drop or down-weight the "
    "channel every completion passes"
)
CANCEL_REMEDY = (
    "channels that cancel (two complementary checks summing to a constant): merge them into one graded reward or "
    "give them unequal weights"
)


@dataclass(frozen=True)
class Trend:
    """The training reward before a change and at its end, and whether it rose beyond its own noise."""

    before: float
    after: float
    noise: float
    points: int

    @property
    def rising(self) -> bool:
        return bool(np.isfinite(self.before) and np.isfinite(self.after) and self.after - self.before > self.noise)

    def evidence(self) -> dict[str, float]:
        return {"reward_before": self.before, "reward_after": self.after, "reward_noise": self.noise}


class ScalarDetector(Detector):
    """Shared helpers: support, persistence, smoothing and the early reference level on one scalar series."""

    requires: ClassVar[tuple[str, ...]] = ("scalars",)

    def minimum(self, ctx: DetectionContext) -> int:
        return int(ctx.threshold(self.code, "min_points"))

    def series(self, ctx: DetectionContext, name: str) -> TagPoints | None:
        """The series ``name`` (``None`` when the log does not have it); too few points is not enough data."""
        found = ctx.scalars.get(name) if ctx.scalars is not None else None
        if found is None:
            return None
        points = int(np.count_nonzero(np.isfinite(found.values)))
        if points < self.minimum(ctx):
            raise NotEnoughData(
                f"`{_tag(ctx, name)}` has {points} logged point(s); {self.minimum(ctx)} are needed (min_points)"
            )
        return found

    def optional(self, ctx: DetectionContext, name: str) -> TagPoints | None:
        """A second signal: the series when it has enough points, else ``None`` (no error)."""
        found = ctx.scalars.get(name) if ctx.scalars is not None else None
        if found is None or int(np.count_nonzero(np.isfinite(found.values))) < self.minimum(ctx):
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

    def reward_trend(self, ctx: DetectionContext, from_step: int, to_step: int) -> Trend | None:
        """The training reward just before ``from_step`` and over the last points up to ``to_step``.

        Each level is the median of a persistence window of the reward's own points; the noise is twice the
        standard error of the difference of two such medians, from the reward's step-to-step changes (robust
        to a trend). ``None`` when the run logs no reward series with enough points.
        """
        reward = self.optional(ctx, S.REWARD)
        if reward is None:
            return None
        finite = np.isfinite(reward.values)
        steps, values = reward.steps[finite], reward.values[finite]
        w = max(3, self.persistence(ctx, len(values)))
        before = values[steps <= from_step][-w:]
        after = values[steps <= to_step][-w:]
        if len(before) == 0 or len(after) == 0:
            return None
        sigma = 1.4826 * nanmedian(np.abs(np.diff(values))) / math.sqrt(2) if len(values) > 1 else 0.0
        noise = 2 * 1.2533 * sigma * math.sqrt(1 / len(before) + 1 / len(after))
        return Trend(nanmedian(before), nanmedian(after), max(noise, 1e-12), len(values))


def _tag(ctx: DetectionContext, name: str) -> str:
    assert ctx.scalars is not None
    return ctx.scalars.tags.get(name, name)


def _fall_start(ratio: np.ndarray, start: int, level: float = 0.9) -> int:
    """The last point at or before ``start`` where the series still stood at ``level`` of its reference."""
    above = np.flatnonzero(ratio[: start + 1] >= level)
    return int(above[-1]) if len(above) else 0


def holds_at_end(condition: np.ndarray, persist: int) -> bool:
    """Whether a condition still holds at the end of the log (in most of its last persistence window).

    A fall that recovered (a rare reward earned by no completion for three batches, then again) is not a collapse.

    >>> holds_at_end(np.array([0, 1, 1, 1, 0, 0, 0], bool), 3), holds_at_end(np.array([0, 0, 1, 1, 0, 1], bool), 3)
    (False, True)
    """
    tail = np.asarray(condition, dtype=bool)[-max(1, persist) :]
    return bool(len(tail)) and float(np.mean(tail)) >= 0.5


def _rise_start(ratio: np.ndarray, start: int, level: float = 1.1) -> int:
    """The last point at or before ``start`` where the series was still below ``level`` of its reference."""
    below = np.flatnonzero(ratio[: start + 1] <= level)
    return int(below[-1]) if len(below) else 0


def _support(found: TagPoints, stretch: tuple[int, int] | None = None) -> dict[str, int]:
    out = {"points": len(found.steps)}
    if stretch is not None:
        out["stretch_points"] = stretch[1] - stretch[0] + 1
    return out


@register
class AdvantageStdShift(ScalarDetector):
    """The spread of advantages (or of rewards within a batch) spikes or collapses (scalar logs).

    What it detects
        The logged advantage standard deviation, or the logged reward std when the trainer logs no
        advantage std (TRL's `reward_std`, OpenRLHF's `group_reward_std`), compared with its own early
        level: a sustained rise to several times that level (a spike, e.g. 0.6 -> 4) or a sustained
        fall to a small fraction of it (a collapse toward 0). The training reward is the second signal:
        a reward spread that narrows while the reward rises is convergence, and one that widens while
        the reward rises is the policy starting to earn a reward; neither is reported as a problem.

    Why it matters
        The advantage std is the scale of the gradient signal: when it collapses the updates fade while the
        loss looks normal (critical below `critical_collapse_ratio` of its early level). A reward std is one
        step removed: group-normalised advantages keep their scale while rewards still differ within
        groups, so a narrower reward spread is a precursor (the groups are about to stop disagreeing), and
        only a reward std of exactly 0 (every rollout of the batch with the same summed reward: no GRPO
        advantage anywhere) is critical. A spike of the advantage std means the advantages are no longer
        group z-scores of the expected scale; a reward-std spike without a rising reward means a few
        outlier rewards. TRL's `reward_std` changed meaning in 0.27 (mean of per-group stds before, batch
        std after); both fall when the groups stop disagreeing.

    Evidence
        The series used and its raw tag, the early level, the level over the stretch, where it ended and
        the ratio, the training reward before the change and at its end, and the points they rest on.

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
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        name = S.ADVANTAGE_STD if self.optional(ctx, S.ADVANTAGE_STD) is not None else S.REWARD_STD
        found = self.series(ctx, name)
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
        low = ratio < ctx.threshold(self.code, "collapse_ratio")
        collapse = persistent_onset(low, persist) if holds_at_end(low, persist) else None
        for stretch, kind in ((spike, "spike"), (collapse, "collapse")):
            if stretch is not None:
                found_one = self._finding(ctx, found, name, stretch, kind, early, ratio, persist)
                if found_one is not None:
                    findings.append(found_one)
        return findings

    def _finding(
        self,
        ctx: DetectionContext,
        found: TagPoints,
        name: str,
        stretch: tuple[int, int],
        kind: str,
        early: float,
        ratio: np.ndarray,
        persist: int,
    ) -> Finding | None:
        values, steps = found.values, found.steps
        level = nanmedian(values[ctx.window(stretch)])
        tail = self.settled_level(values, stretch, persist)
        advantage = name == S.ADVANTAGE_STD
        label = "advantage std" if advantage else "reward std"
        change = _fall_start(ratio, stretch[0]) if kind == "collapse" else _rise_start(ratio, stretch[0])
        trend = self.reward_trend(ctx, int(steps[change]), int(steps[stretch[1]]))
        from_step = int(steps[stretch[0]])
        message = (
            f"{label} (`{_tag(ctx, name)}`, {len(steps)} points) went from {early:.3g} early in the run to "
            f"{level:.3g} ({level / early:.2g}x) from step {from_step} on and ended at {tail:.3g}."
        )
        evidence: dict[str, Any] = {
            "series": name,
            "tag": _tag(ctx, name),
            "early": early,
            "level": level,
            "now": tail,
            "ratio": tail / early,
        } | _support(found, stretch)
        reward = ""
        if trend is not None:
            evidence |= trend.evidence()
            reward = f" The training reward went from {trend.before:.3g} to {trend.after:.3g}"
        if kind == "spike":
            if not advantage and trend is not None and trend.rising:
                return None  # the spread widens as the policy starts earning a reward: learning
            severity = Severity.WARNING
            title = f"{label} spikes"
            if advantage:
                message += " The advantages are no longer group z-scores of the scale they had early in the run."
            else:
                message += (reward + " (not rising):" if trend is not None else "") + (
                    " the batch's rewards spread several times wider than early in the run without a reward gain"
                    " (outlier rewards, or a channel with a wide range)."
                )
            remedy = "clip or squash the reward channel with outliers, and look at the groups of the spike's steps"
        else:
            exact_zero = tail <= ZERO * early
            if advantage:
                critical = tail / early < ctx.threshold(self.code, "critical_collapse_ratio")
                severity = Severity.CRITICAL if critical else Severity.WARNING
                message += " The advantages themselves shrink: the gradient signal fades while the loss looks normal."
            elif exact_zero and ctx.algorithm != "gdpo":
                severity = Severity.CRITICAL
                message += " Every rollout of the batch got the same summed reward: no GRPO advantage anywhere."
            elif trend is not None and trend.rising:
                severity = Severity.INFO
                message += reward + " over the same stretch: the spread narrows as the reward rises (convergence)."
            else:
                severity = Severity.WARNING
                message += (reward + " (not rising)." if trend is not None else " (no reward series to compare).") + (
                    " The batch's rewards barely differ any more, and a group whose rewards do not differ gives zero"
                    " advantage."
                )
            narrows = f"{label} narrows as the reward rises"
            title = f"{label} collapses toward 0" if severity > Severity.INFO else narrows
            remedy = (
                "filter all-pass/all-fail prompts (dynamic sampling), raise num_generations or the "
                "temperature, or add a graded reward; scan the rollouts to find the saturated channel"
            )
        return self.finding(
            ctx,
            stretch,
            steps=steps,
            severity=severity,
            title=title,
            message=message,
            evidence=evidence,
            remedy=remedy,
        )


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
        moves back and forth between updates, which often comes from unstable advantages (outlier groups,
        a spiking advantage scale, a reward channel that flips) and often precedes a blow-up of the KL and
        of the response length. It is a precursor, never a collapse on its own.

    Evidence
        The raw KL tag, the early and late KL level, the early and late relative swing, and the points
        they rest on.

    Remedy
        Lower the learning rate or raise the KL coefficient, clip advantages, and check the advantage
        std (CD501) and the reward channels for outliers.
    """

    code = "CD502"
    name = "KL oscillation"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "swing_ratio": 3.0,
        "min_swing": 0.3,
        "level_ratio": 1.5,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.series(ctx, S.KL)
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
                    f"KL (`{_tag(ctx, S.KL)}`, {n} points) rose from {early_level:.3g} to {late_level:.3g} and "
                    f"its step-to-step swings grew from {early_swing:.2g} to {late_swing:.2g} of its level from "
                    f"step {int(found.steps[stretch[0]])} on."
                ),
                evidence={
                    "tag": _tag(ctx, S.KL),
                    "kl_early": early_level,
                    "kl_late": late_level,
                    "relative_swing_early": early_swing,
                    "relative_swing_late": late_swing,
                }
                | _support(found, stretch),
                remedy=(
                    "lower the learning rate or raise the KL coefficient, clip advantages, and check the "
                    "advantage std (CD501) and the reward channels for outliers"
                ),
            )
        ]


@register
class EntropyCollapse(ScalarDetector):
    """The policy's entropy falls fast and stays down while the reward does not rise (scalar logs).

    What it detects
        The logged token entropy (TRL `entropy`, verl `actor/entropy`, NeMo-RL `approx_entropy`),
        smoothed, falling below a fraction of its early level and staying there, while the training
        reward did not rise over the fall. Entropy that falls while the reward rises (and has not fallen
        back) is convergence: the policy commits to what earns the reward; it is not reported.

    Why it matters
        Entropy that collapses without a reward gain means the policy samples nearly the same completion
        for every prompt for no return: groups stop disagreeing, advantages go to 0 and exploration stops.
        It often follows a reward channel that is easy to game (a format check) pulling every completion
        toward one template. Low entropy on its own does not remove the gradient, so the finding is a
        warning; it is critical only when the log also shows most rollouts with zero advantage (the
        zero-std share, CD504's series, above `critical_zero_std_share` over the same stretch).

    Evidence
        The raw entropy tag, early level, level now and the ratio, the logged steps the fall took (from
        90% to the threshold of the early level), the training reward before the fall and at its end,
        the zero-std share over the stretch when logged, and the points they rest on.

    Remedy
        Raise the sampling temperature or add an entropy bonus, lower the learning rate, clip higher
        (asymmetric clipping, DAPO's clip-higher), and check whether one channel dominates (CD402).
    """

    code = "CD503"
    name = "entropy collapse"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_ratio": 0.3,
        "critical_ratio": 0.1,
        "critical_zero_std_share": 0.8,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.series(ctx, S.ENTROPY)
        if found is None:
            return []
        relative = self.relative_to_early(ctx, found.values)
        if relative is None:
            return []
        early, ratio = relative
        persist = self.persistence(ctx, len(found.values))
        low = ratio < ctx.threshold(self.code, "warn_ratio")
        stretch = persistent_onset(low, persist)
        if stretch is None or not holds_at_end(low, persist):
            return []  # never fell, or recovered
        start, end = stretch
        now = self.settled_level(found.values, stretch, persist)
        fall_from = int(found.steps[_fall_start(ratio, start)])
        trend = self.reward_trend(ctx, fall_from, int(found.steps[end]))
        if trend is not None and trend.rising:
            return []  # entropy falls while the reward rises: convergence, not collapse
        evidence: dict[str, Any] = {
            "tag": _tag(ctx, S.ENTROPY),
            "early": early,
            "now": now,
            "ratio": now / early,
            "fall_steps": int(found.steps[start]) - fall_from,
        } | _support(found, stretch)
        message = (
            f"entropy (`{_tag(ctx, S.ENTROPY)}`, {len(found.steps)} points) fell from {early:.3g} to {now:.3g} "
            f"({pct(now / early)} of its early level) between step {fall_from} and step {int(found.steps[start])}, "
            "and stayed down"
        )
        if trend is not None:
            evidence |= trend.evidence()
            message += f", while the training reward went from {trend.before:.3g} to {trend.after:.3g} (not rising)."
        else:
            message += " (no reward series to tell convergence from collapse)."
        zero_share = self._zero_std_share(ctx, int(found.steps[start]), int(found.steps[end]))
        critical = False
        if zero_share is not None:
            evidence["zero_std_share"] = zero_share
            critical = now / early < ctx.threshold(self.code, "critical_ratio") and zero_share > ctx.threshold(
                self.code, "critical_zero_std_share"
            )
            zero_tag = _tag(ctx, S.ZERO_STD_SHARE)
            message += f" Over the same steps {pct(zero_share)} of rollouts had zero advantage (`{zero_tag}`)."
        return [
            self.finding(
                ctx,
                stretch,
                steps=found.steps,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                title="entropy collapsed without a reward gain",
                message=message,
                evidence=evidence,
                remedy=(
                    "raise the temperature or add an entropy bonus, lower the learning rate, use clip-higher, "
                    "and check whether one reward channel dominates (CD402)"
                ),
            )
        ]

    def _zero_std_share(self, ctx: DetectionContext, first: int, last: int) -> float | None:
        share = self.optional(ctx, S.ZERO_STD_SHARE)
        if share is None:
            return None
        inside = (share.steps >= first) & (share.steps <= last) & np.isfinite(share.values)
        return float(np.mean(share.values[inside])) if inside.any() else None


@register
class ZeroStdShare(ScalarDetector):
    """Most rollouts carry zero advantage, by the trainer's own zero-std count (scalar logs).

    What it detects
        The logged share of rollouts in groups whose rewards have zero standard deviation: TRL's
        `frac_reward_zero_std`, NeMo-RL's `baseline_reward/pct_0 + pct_1` (in percent: all-fail and
        all-pass prompts, for rewards in [0, 1]), or one minus OpenRLHF's `dynamic_filtering_pass_rate`
        (groups its dynamic filter dropped). It fires when the share, averaged over twice the
        persistence window, stays above a threshold. What TRL's number means depends on the aggregation:
        under GRPO with per-group scaling it is the share of rows in zero-std groups (exact); under GDPO
        (`normalize_then_sum`) and under batch-scaled GRPO (`scale_rewards="batch"`) TRL flags the whole
        batch (every rollout or none), so a logged point is the share of the step's generation batches in
        which every fused reward was equal, and the share over the stretch is a lower bound on the
        rollouts with zero advantage (a 0 says nothing about single groups). The run's aggregation comes
        from the rollouts or `--algo`; a scalar-only run is read as GRPO, and a series that only takes the
        values 0 and 1 is read as a whole-batch flag whatever the aggregation.

    Why it matters
        A rollout whose group has zero reward spread has an advantage of exactly 0 and gives no gradient.
        When most of the batch is like that the effective batch is a handful of prompts: updates get
        noisy and the run stalls while the loss curve looks normal (critical above `critical_share`).
        The fix depends on why the groups are silent, and it is opposite for the two main causes:
        all-fail groups are too hard or a broken reward, all-pass groups are learned; with several
        channels a constant sum can also be channels that cancel. NeMo-RL logs the all-fail / all-pass
        split; TRL and OpenRLHF do not (the finding says so). OpenRLHF drops the filtered groups and samples
        others, so there the cost is generation spent on groups that never train (a warning at most).
        This is the scalar-log view of CD102.

    Evidence
        The series and its raw tag(s), how it was read (share of groups, whole-batch flag, filtered
        groups), the share over the stretch and its peak, the all-fail and all-pass shares when logged,
        and the points they rest on.

    Remedy
        All-fail: check the reward function on real completions, then easier prompts or a curriculum,
        partial credit, or a higher num_generations. All-pass: harder prompts, filter solved prompts
        (dynamic sampling), or drop or down-weight the channel every completion passes. With the split
        unknown, scan the completions (TRL's completions parquet) to tell which. Channels that cancel:
        merge them into one graded reward or give them unequal weights.
    """

    code = "CD504"
    name = "zero-std group share"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.5, "critical_share": 0.8, "min_points": MIN_POINTS}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.series(ctx, S.ZERO_STD_SHARE)
        if found is None:
            return []
        values, steps = found.values, found.steps
        persist = self.persistence(ctx, len(values))
        share = rolling(values, 2 * persist + 1, how="mean")
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return []
        assert ctx.scalars is not None
        tag = _tag(ctx, S.ZERO_STD_SHARE)
        part = ctx.window(stretch)
        level = float(np.nanmean(values[part]))
        peak = float(np.nanmax(values[part]))
        span = f"steps {int(steps[stretch[0]])}-{int(steps[stretch[1]])}, {stretch[1] - stretch[0] + 1} points"
        reading = self._reading(ctx, values)
        evidence: dict[str, Any] = {"tag": tag, "reading": reading, "share": level, "peak_share": peak}
        evidence |= _support(found, stretch)
        critical = level > ctx.threshold(self.code, "critical_share")
        if reading == "filtered":
            severity = Severity.WARNING
            title = "most generated groups are filtered out"
            message = (
                f"{pct(level)} of the generated groups were dropped by dynamic filtering ({span}, from `{tag}`): "
                "their mean reward fell outside the kept range, so generation is spent on groups that never train."
            )
        elif reading == "batch":
            severity = Severity.CRITICAL if critical else Severity.WARNING
            title = "whole batches give no gradient"
            message = (
                f"in {pct(level)} of the generation batches every rollout had zero advantage ({span}, from `{tag}`, "
                "which TRL computes over the whole batch under GDPO or batch scaling): at least that share of "
                "the rollouts gave no gradient; the log does not count single silent groups."
            )
        else:
            severity = Severity.CRITICAL if critical else Severity.WARNING
            title = "most rollouts give no gradient"
            message = (
                f"{pct(level)} of rollouts were in groups with identical rewards for every completion ({span}, "
                f"from `{tag}`): their advantages are exactly 0."
            )
        split = self._split(ctx, steps[stretch[0]], steps[stretch[1]])
        if split is not None:
            fail, ok = split
            evidence |= {"all_fail_share": fail, "all_pass_share": ok}
            message += f" All-fail: {pct(fail)}, all-pass: {pct(ok)}."
            remedy = join_remedies(
                ALL_FAIL_REMEDY if fail >= 0.1 or fail >= ok else None,
                ALL_PASS_REMEDY if ok >= 0.1 or ok > fail else None,
            )
        else:
            several = len(ctx.scalars.channels) > 1
            causes = "all-pass or all-fail" + (", or channels that cancel in the sum" if several else "")
            message += f" The log does not say whether they are {causes} (the fixes differ): scan the completions."
            remedy = join_remedies(
                ALL_FAIL_REMEDY,
                ALL_PASS_REMEDY,
                CANCEL_REMEDY if several else None,
                "scan the completions to tell which applies",
            )
        return [
            self.finding(
                ctx,
                stretch,
                steps=steps,
                severity=severity,
                title=title,
                message=message,
                evidence=evidence,
                remedy=remedy,
            )
        ]

    @staticmethod
    def _reading(ctx: DetectionContext, values: np.ndarray) -> str:
        """``groups`` (share of rows in zero-std groups), ``batch`` (TRL's whole-batch flag) or ``filtered``."""
        assert ctx.scalars is not None
        tag = _tag(ctx, S.ZERO_STD_SHARE)
        if tag.startswith("1 - "):
            return "filtered"
        if ctx.scalars.framework != "trl" or tag != "train/frac_reward_zero_std":
            return "groups"
        finite = values[np.isfinite(values)]
        flags = bool(len(finite)) and bool(np.all((np.abs(finite) < ZERO) | (np.abs(finite - 1) < ZERO)))
        return "batch" if ctx.algorithm == "gdpo" or flags else "groups"

    def _split(self, ctx: DetectionContext, first: int, last: int) -> tuple[float, float] | None:
        fail, ok = self.optional(ctx, S.PCT_ALL_FAIL), self.optional(ctx, S.PCT_ALL_PASS)
        if fail is None or ok is None:
            return None
        shares = []
        for found in (fail, ok):
            inside = (found.steps >= first) & (found.steps <= last) & np.isfinite(found.values)
            if not inside.any():
                return None
            shares.append(float(np.mean(found.values[inside])) / 100.0)
        return shares[0], shares[1]


@register
class ChannelStdSaturation(ScalarDetector):
    """One reward channel's std falls to ~0 while the others still vary (scalar logs).

    What it detects
        Per channel, the logged std of its reward over the batch (TRL `rewards/<name>/std`, verl GDPO
        `gdpo/<name>/std`), smoothed, compared with its own peak so far. The detector reports a channel
        whose std stays below a small fraction of an earlier sustained peak while at least one other
        channel still varies at half its peak or more, and says which way it went from the channel's
        mean: up to a level it never reached before (all-pass: learned), down to one below every earlier
        level (all-fail: a channel the policy is losing), or stuck in between. A channel that never
        varied in a sustained way (constant, or a rare failure now and then, from its first logged
        point) did not collapse from a peak: at most information, and only for a run without rollouts
        (with rollouts, CD101 judges it per group).

    Why it matters
        A channel that is the same for every completion adds a constant to every sum: it changes no
        advantage, under GRPO or GDPO, so a saturated channel on its own is information (the run trains
        on fewer channels than configured). It matters when it is lost: a channel the policy earned
        before and now fails everywhere, or one stuck at an intermediate constant (a broken reward
        function), is a warning. This is the scalar-log view of rel_gain decay (CD101).

    Evidence
        The channel, its peak std and step, its std now and the ratio, its mean before and now, the
        direction (all-pass, all-fail, intermediate, never varied), the other channels' ratio to their
        own peaks, and the points they rest on.

    Remedy
        All-pass: drop the channel or make its check harder, or keep it as a gate for the other rewards.
        All-fail: check what the reward function returns on recent completions, then easier prompts or
        partial credit; do not lower its weight. Intermediate: check the reward function. Scan the
        rollouts (TRL's completions parquet) for the per-group picture.
    """

    code = "CD505"
    name = "channel std saturation"
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_ratio": 0.2,
        "others_ratio": 0.5,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        if ctx.scalars is None:
            return []
        logged = [c for c in ctx.scalars.channels if S.CHANNEL_STD + c in ctx.scalars]
        channels = [c for c in logged if self.optional(ctx, S.CHANNEL_STD + c) is not None]
        if len(channels) < 2:
            if len(logged) >= 2:
                raise NotEnoughData(f"fewer than two channels have {self.minimum(ctx)} logged std points (min_points)")
            return []
        ratios: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for channel in channels:
            found = ctx.scalars.get(S.CHANNEL_STD + channel)
            assert found is not None
            smooth = self.smooth(ctx, found.values)
            ratio, peak = ratio_to_running_peak(smooth)
            ratios[channel] = (found.steps, ratio, peak, found.values)
        findings = []
        for channel in channels:
            found_one = self._channel(ctx, channel, channels, ratios)
            if found_one is not None:
                findings.append(found_one)
        return findings

    def _channel(
        self,
        ctx: DetectionContext,
        channel: str,
        channels: list[str],
        ratios: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ) -> Finding | None:
        steps, ratio, peak, values = ratios[channel]
        persist = self.persistence(ctx, len(steps))
        scale = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0
        if scale <= 0:
            return self._never_varied(ctx, channel, steps, values, persist)
        others_ok = np.zeros(len(steps), dtype=bool)
        other_now: dict[str, float] = {}
        for other in channels:
            if other == channel:
                continue
            o_steps, o_ratio, _, _ = ratios[other]
            aligned = np.interp(steps, o_steps, np.nan_to_num(o_ratio, nan=0.0))
            others_ok |= aligned >= ctx.threshold(self.code, "others_ratio")
            other_now[other] = nanmedian(o_ratio[-max(1, len(o_ratio) // 10) :])
        warn = ctx.threshold(self.code, "warn_ratio")
        condition = (ratio < warn) & others_ok
        stretch = persistent_onset(condition, persist)
        if stretch is None or not holds_at_end(condition, persist):
            return None  # never fell, or varies again by the end of the log
        start = stretch[0]
        # a collapse from a peak needs a sustained stretch of real spread (no batch of identical values) before it
        varied = (ratio[:start] >= ctx.threshold(self.code, "others_ratio")) & (values[:start] > ZERO * scale)
        if persistent_onset(varied, persist) is None:
            if ctx.run.rollouts:
                return None  # never varied in a sustained way: CD101 judges the channel per group
            return self._never_varied(ctx, channel, steps, values, persist, stretch=stretch)
        peak_value = float(peak[start])
        head = np.where(np.isfinite(values[: start + 1]), values[: start + 1], -1)
        peak_at = int(steps[int(np.argmax(head))])
        now = self.settled_level(values, stretch, persist)
        now_ratio = now / peak_value if peak_value > 0 else float("nan")
        direction, mean_before, mean_now = self._direction(ctx, channel, steps, stretch, persist)
        severity = Severity.INFO if direction == "all-pass" else Severity.WARNING
        what = {
            "all-pass": "every completion now earns its highest level so far (learned): it adds a constant",
            "all-fail": "every completion now scores below every earlier level: the policy lost a channel it earned",
            "intermediate": "it is stuck at a constant between its earlier levels: check the reward function",
            "unknown": "its mean is not logged, so whether it passes or fails everywhere is unknown",
        }[direction]
        mean_text = (
            f" Its mean went from {mean_before:.3g} to {mean_now:.3g}."
            if np.isfinite(mean_before) and np.isfinite(mean_now)
            else ""
        )
        remedy = {
            "all-pass": f"drop `{channel}` or make its check harder, or keep it as a gate for the other rewards",
            "all-fail": (
                f"check what `{channel}`'s reward function returns on recent completions, then easier prompts or "
                "partial credit; do not lower its weight"
            ),
            "intermediate": f"check `{channel}`'s reward function on recent completions",
            "unknown": f"scan the rollouts to see whether `{channel}` passes or fails everywhere",
        }[direction]
        return self.finding(
            ctx,
            stretch,
            steps=steps,
            severity=severity,
            title=f"`{channel}` saturated ({direction}): its reward std fell to ~0",
            message=(
                f"the std of `{channel}` fell from {peak_value:.3g} (step {peak_at}) to {now:.3g} "
                f"({pct(now_ratio)} of its peak) from step {int(steps[start])} on, while the other "
                f"channel(s) ({', '.join(f'`{o}`' for o in other_now)}) still vary: {what}.{mean_text}"
            ),
            channels=(channel,),
            evidence={
                "tag": _tag(ctx, S.CHANNEL_STD + channel),
                "direction": direction,
                "std_peak": peak_value,
                "std_peak_step": peak_at,
                "std_now": now,
                "ratio": now_ratio,
                "mean_before": mean_before,
                "mean_now": mean_now,
                "other_channels_ratio": other_now,
            }
            | {"points": len(steps), "stretch_points": stretch[1] - stretch[0] + 1},
            remedy=join_remedies(remedy, "scan the rollouts for the per-group picture"),
        )

    def _direction(
        self, ctx: DetectionContext, channel: str, steps: np.ndarray, stretch: tuple[int, int], persist: int
    ) -> tuple[str, float, float]:
        """Where the channel's mean went: ``all-pass`` (above every earlier level), ``all-fail`` (below every
        earlier level), ``intermediate`` or ``unknown`` (no mean series); and its mean before and now."""
        mean = self.optional(ctx, S.CHANNEL_MEAN + channel)
        if mean is None:
            return "unknown", float("nan"), float("nan")
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        finite = np.isfinite(mean.values)
        before = mean.values[finite & (mean.steps < first)]
        inside = mean.values[finite & (mean.steps >= first) & (mean.steps <= last)]
        if len(before) == 0 or len(inside) == 0:
            return "unknown", nanmedian(before), nanmedian(inside)
        now = nanmedian(inside[-persist:])
        spread = float(np.nanmax(before) - np.nanmin(before))
        tol = max(1e-9, 0.05 * spread)
        if now >= float(np.nanmax(before)) - tol:
            direction = "all-pass"
        elif now <= float(np.nanmin(before)) + tol:
            direction = "all-fail"
        else:
            direction = "intermediate"
        return direction, nanmedian(before), now

    def _never_varied(
        self,
        ctx: DetectionContext,
        channel: str,
        steps: np.ndarray,
        values: np.ndarray,
        persist: int,
        *,
        stretch: tuple[int, int] | None = None,
    ) -> Finding | None:
        """Information on a channel constant (or nearly) from its first logged point, for a scalar-only run."""
        if ctx.run.rollouts:
            return None
        mean = self.optional(ctx, S.CHANNEL_MEAN + channel)
        constant_share = float(np.mean(np.abs(np.nan_to_num(values, nan=0.0)) <= ZERO))
        level = nanmedian(mean.values) if mean is not None else float("nan")
        level_text = f" (mean {level:.3g})" if np.isfinite(level) else ""
        value = f"{level:.3g}" if np.isfinite(level) else "its level"
        stretch = stretch or (0, len(steps) - 1)
        return self.finding(
            ctx,
            stretch,
            steps=steps,
            severity=Severity.INFO,
            title=f"`{channel}` never varied",
            message=(
                f"`{channel}` was the same for every completion of the batch in {pct(constant_share)} of its "
                f"{len(steps)} logged steps{level_text}, from its first logged point: it was at its floor or "
                "its ceiling from the start (not a fall from a peak) and changes no advantage there."
            ),
            channels=(channel,),
            evidence={
                "tag": _tag(ctx, S.CHANNEL_STD + channel),
                "direction": "never varied",
                "constant_step_share": constant_share,
                "mean": level,
                "points": len(steps),
            },
            remedy=(
                f"if {value} is `{channel}`'s minimum it is never earned: check the reward function, then easier "
                "prompts or partial credit (do not lower its weight); if it is its maximum, drop it or make it harder"
            ),
        )


@register
class LoggedAdvantageBound(ScalarDetector):
    """Logged advantage max/min beyond what a group z-score allows (scalar logs).

    What it detects
        The logged maximum and minimum advantage of each step (verl `critic/advantages/max|min`,
        NeMo-RL `train/advantages/max|min`) against the bound (n-1)/sqrt(n) that a group z-score of
        n samples (with the sample std) cannot exceed (2.47 for n = 8; n from the rollouts when scanned
        together, else the `group_size` threshold). NeMo-RL's leave-one-out baseline widens the bound by
        n/(n-1). GDPO advantages (a batch-normalised sum of per-channel z-scores) have no such bound, so
        a GDPO run (detected, `--algo gdpo`, or verl's `gdpo/` tags) is not judged.

    Why it matters
        Advantages beyond the bound are not per-group z-scores of n samples: batch scaling, no std
        normalisation, stale or asynchronous reward windows, eps trouble, or an off-by-one group layout.
        Either the run is not doing the GRPO it is configured for, or the groups are mixed up, and the
        advantages' scale is not what the loss expects.

    Evidence
        The bound and the group size it assumes, the largest |advantage| over the stretch, the share of
        points beyond, the raw tags and the points they rest on.

    Remedy
        Check the group size (num_generations / rollout.n) and the advantage estimator's settings; with
        batch scaling on purpose (TRL scale_rewards="batch"), raise `group_size` or ignore CD506
        (`--ignore CD506`); scan the rollouts with `collapse-doctor scan` to compare against the
        recomputation (CD202).
    """

    code = "CD506"
    name = "logged advantage bound"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"group_size": 8, "tolerance": 0.05, "min_points": MIN_POINTS}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        high = self.series(ctx, S.ADVANTAGE_MAX)
        low = self.series(ctx, S.ADVANTAGE_MIN)
        if high is None and low is None:
            return []
        assert ctx.scalars is not None
        if ctx.algorithm == "gdpo" or any(tag.startswith("gdpo/") for tag in ctx.scalars.tags.values()):
            return []  # GDPO's advantages are not group z-scores: the bound does not apply
        n = int(ctx.run.group_size_max) if ctx.run.group_size_max > 1 else int(ctx.threshold(self.code, "group_size"))
        bound = (n - 1) / math.sqrt(n)
        if ctx.scalars.framework == "nemo_rl":
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
                        f"group z-score with {n} samples per group, from step {int(found.steps[stretch[0]])} on "
                        f"({pct(float(np.mean(beyond)))} of {len(found.steps)} points): the advantages are not "
                        "per-group z-scores of that size."
                    ),
                    evidence={
                        "tag": _tag(ctx, name),
                        "bound": bound,
                        "group_size": n,
                        "largest_abs_advantage": extreme,
                        "share_of_points_beyond": float(np.mean(beyond)),
                    }
                    | _support(found, stretch),
                    remedy=(
                        "check num_generations / rollout.n and the advantage settings; if the batch scaling is "
                        "intended, rescan with --ignore CD506 (or raise [thresholds.CD506] group_size)"
                    ),
                )
            )
        return findings
