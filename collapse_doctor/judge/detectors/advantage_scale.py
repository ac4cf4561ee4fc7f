"""CD501, CD506: the scale of the logged advantages (or of the batch's reward spread) against the run's own early
level, and against the bound a group z-score allows (scalar logs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import persistent_onset
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import HOTTER, MORE_GENERATIONS, Remedy, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ZERO,
    ScalarDetector,
    extremes,
    fall_start,
    holds_at_end,
    rise_start,
    support,
    tag_of,
)


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
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.ADVANTAGE_STD, S.REWARD_STD),)
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
        change = fall_start(ratio, stretch[0]) if kind == "collapse" else rise_start(ratio, stretch[0])
        trend = self.reward_trend(ctx, int(steps[change]), int(steps[stretch[1]]))
        from_step = int(steps[stretch[0]])
        message = (
            f"{label} (`{tag_of(ctx, name)}`, {len(steps)} points) went from {early:.3g} early in the run to "
            f"{level:.3g} ({level / early:.2g}x) from step {from_step} on and ended at {tail:.3g}."
        )
        evidence: dict[str, Any] = {
            "series": name,
            "tag": tag_of(ctx, name),
            "early": early,
            "level": level,
            "now": tail,
            "ratio": tail / early,
        } | support(len(found.steps), stretch)
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
            remedy: str | Remedy = (
                "clip or squash the reward channel with outliers, and look at the groups of the spike's steps"
            )
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
            filters = ctx.scalars is not None and any(n in ctx.scalars for n in S.DYNAMIC_SAMPLING_SERIES)
            remedy = Remedy(
                ("" if filters else "filter all-pass/all-fail prompts (dynamic sampling), ")
                + f"raise {MORE_GENERATIONS.trl} or the {HOTTER.trl}, or add a graded reward; scan the rollouts to "
                "find the saturated channel",
                (MORE_GENERATIONS, HOTTER),
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
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {"group_size": ThresholdRange(2.0, whole=True)}
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.ADVANTAGE_MAX, S.ADVANTAGE_MIN),)
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
        for series, sign, name in ((high, 1.0, S.ADVANTAGE_MAX), (low, -1.0, S.ADVANTAGE_MIN)):
            if series is None:
                continue
            found = extremes(series, high=sign > 0)  # a folded series: each bucket's extreme, not its mean
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
                        f"`{tag_of(ctx, name)}` reached {sign * extreme:+.3g}, beyond the bound +-{bound:.3g} of a "
                        f"group z-score with {n} samples per group, from step {int(found.steps[stretch[0]])} on "
                        f"({pct(float(np.mean(beyond)))} of {len(found.steps)} points): the advantages are not "
                        "per-group z-scores of that size."
                    ),
                    evidence={
                        "tag": tag_of(ctx, name),
                        "bound": bound,
                        "group_size": n,
                        "largest_abs_advantage": extreme,
                        "share_of_points_beyond": float(np.mean(beyond)),
                    }
                    | support(len(found.steps), stretch),
                    remedy=(
                        "check num_generations / rollout.n and the advantage settings; if the batch scaling is "
                        "intended, rescan with --ignore CD506 (or raise [thresholds.CD506] group_size)"
                    ),
                )
            )
        return findings
