"""CD504: the share of rollouts with zero advantage, by the trainer's own zero-std count (scalar logs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import persistent_onset, rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import MORE_GENERATIONS, Remedy
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ZERO,
    ScalarDetector,
    mean_within,
    support,
    tag_of,
)

ALL_FAIL_REMEDY = Remedy(
    "all-fail (too hard or a broken reward): check the reward function on real completions, then easier prompts "
    f"or a curriculum, partial credit, or a higher {MORE_GENERATIONS.trl}",
    (MORE_GENERATIONS,),
)
ALL_PASS_REMEDY = (
    "all-pass (learned): harder prompts, filter solved prompts (dynamic sampling), or drop or down-weight the "
    "channel every completion passes"
)
MIXED_REMEDY = Remedy(
    "filter the groups whose rewards are all equal (dynamic sampling) or raise "
    f"{MORE_GENERATIONS.trl} so that more groups hold both outcomes",
    (MORE_GENERATIONS,),
)
"""Both all-pass and all-fail groups, or a split the log does not give: what helps either way (the prompt fixes of
the two causes are opposite, so neither is proposed without knowing which prompts are which)."""
FILTERED_REMEDY = Remedy(
    "dynamic sampling is on already (the trained batch holds groups with signal only): spend less generation on "
    "dropped groups: take prompts that every completion solves or fails out of the data (an offline pass-rate "
    f"filter or a curriculum), or raise {MORE_GENERATIONS.trl} so that fewer groups come out constant",
    (MORE_GENERATIONS,),
)
"""A run that filters already: never told to add dynamic sampling."""
CANCEL_REMEDY = (
    "channels that cancel (two complementary checks summing to a constant): merge them into one graded reward or "
    "give them unequal weights"
)


@register
class ZeroStdShare(ScalarDetector):
    """Most rollouts carry zero advantage, by the trainer's own zero-std count (scalar logs).

    What it detects
        The logged share of rollouts in groups whose rewards have zero standard deviation: TRL's
        `frac_reward_zero_std`, NeMo-RL's `baseline_reward/pct_0 + pct_1` (in percent: all-fail and
        all-pass prompts, for rewards in [0, 1]), one minus OpenRLHF's `dynamic_filtering_pass_rate`
        (groups its dynamic filter dropped), or verl's `filter_groups/evicted_samples` over the groups generated
        (dropped, surplus and trained: the verl hook logs the trained batch size). It fires when the share,
        averaged over twice the persistence window, stays above a threshold. What TRL's number means depends on
        the aggregation:
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
        (dynamic sampling), or drop or down-weight the channel every completion passes. Both at once, or
        the split unknown: filter groups whose rewards are all equal (dynamic sampling) or raise
        num_generations, never harder and easier prompts together; with the split unknown, scan the
        completions (TRL's completions parquet) to tell which prompts are which. Channels that cancel: merge
        them into one graded reward or give them unequal weights. A run with dynamic sampling (verl
        `filter_groups`, NeMo-RL dynamic sampling, OpenRLHF dynamic filtering) trains on groups with signal only:
        take prompts every completion solves or fails out of the data, or raise num_generations; it is never told
        to add dynamic sampling.
    """

    code = "CD504"
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.ZERO_STD_SHARE,),)
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
        tag = tag_of(ctx, S.ZERO_STD_SHARE)
        part = ctx.window(stretch)
        level = float(np.nanmean(values[part]))
        peak = float(np.nanmax(values[part]))
        span = f"steps {int(steps[stretch[0]])}-{int(steps[stretch[1]])}, {stretch[1] - stretch[0] + 1} points"
        reading = self._reading(ctx, values)
        evidence: dict[str, Any] = {"tag": tag, "reading": reading, "share": level, "peak_share": peak}
        evidence |= support(len(found.steps), stretch)
        critical = level > ctx.threshold(self.code, "critical_share")
        if reading == "filtered":
            severity = Severity.WARNING
            title = "most generated groups are filtered out"
            message = (
                f"{pct(level)} of the generated groups were dropped by dynamic filtering ({span}, from `{tag}`): "
                "their rewards did not differ enough to train on, so generation is spent on groups that never train."
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
        if reading == "filtered":
            remedy = Remedy.join(FILTERED_REMEDY)
        elif split is not None:
            fail, ok = split
            evidence |= {"all_fail_share": fail, "all_pass_share": ok}
            message += f" All-fail: {pct(fail)}, all-pass: {pct(ok)}."
            if fail >= 0.1 and ok >= 0.1:
                remedy = Remedy.join(f"both all-fail ({pct(fail)}) and all-pass ({pct(ok)}) groups", MIXED_REMEDY)
            else:
                remedy = Remedy.join(ALL_FAIL_REMEDY if fail >= ok else ALL_PASS_REMEDY)
        else:
            several = len(ctx.scalars.channels) > 1
            causes = "all-pass or all-fail" + (", or channels that cancel in the sum" if several else "")
            message += f" The log does not say whether they are {causes} (the fixes differ): scan the completions."
            remedy = Remedy.join(
                MIXED_REMEDY,
                CANCEL_REMEDY if several else None,
                "scan the completions to tell all-pass from all-fail groups: their prompt fixes are opposite (a "
                "learned prompt wants a harder one, a failed one an easier one or partial credit) and CD102 gives "
                "the one that applies",
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
        tag = tag_of(ctx, S.ZERO_STD_SHARE)
        if tag.startswith("1 - ") or any(name in ctx.scalars for name in S.DYNAMIC_SAMPLING_SERIES):
            return "filtered"
        if ctx.scalars.framework != "trl" or tag != "train/frac_reward_zero_std":
            return "groups"
        finite = values[np.isfinite(values)]
        flags = bool(len(finite)) and bool(np.all((np.abs(finite) < ZERO) | (np.abs(finite - 1) < ZERO)))
        return "batch" if ctx.algorithm == "gdpo" or flags else "groups"

    def _split(self, ctx: DetectionContext, first: int, last: int) -> tuple[float, float] | None:
        fail = mean_within(self.optional(ctx, S.PCT_ALL_FAIL), first, last)
        ok = mean_within(self.optional(ctx, S.PCT_ALL_PASS), first, last)
        if fail is None or ok is None:
            return None
        return fail / 100.0, ok / 100.0
