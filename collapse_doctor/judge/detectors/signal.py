"""CD1xx: reward channels that stop (or never start) giving a learning signal, and silent groups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core.findings import ChangeSetting
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import ratio_to_running_peak
from collapse_doctor.judge.budget import SignalBudget, applies_share, channel_extreme_shares, signal_budget
from collapse_doctor.judge.detectors.base import DetectionContext, Detector, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import (
    HOTTER,
    MORE_GENERATIONS,
    Remedy,
    gdpo_counterfactual,
    nanmedian,
    policy_collapse_remedy,
    switch_remedy,
)

LEARNED = (
    "it is learned: drop it, make the check stricter or the prompts harder, or keep it as a gate "
    "(count the other rewards only where it passes); while it is constant it changes no advantage"
)
NEVER_EARNED = Remedy(
    "check what the reward function returns on real completions (a broken or too strict check looks the same), "
    f"then use easier prompts or a curriculum, give partial credit, or raise {MORE_GENERATIONS.trl} so that some "
    "completion of a group earns it; do not lower its weight: it is not drowning anything",
    (MORE_GENERATIONS,),
)
EXPLORATION = (HOTTER, MORE_GENERATIONS)
"""A fading channel: sample more widely (a higher temperature, more completions per prompt)."""


def channel_support(ctx: DetectionContext, k: int) -> float:
    """Median number of groups per step in which channel ``k`` has two or more values."""
    return nanmedian(ctx.series["channel_groups"][:, k])


@register
class RelGainDecay(Detector):
    """A reward channel does not rank the samples of a group: saturated, never earned, or fading (rel_gain).

    What it detects
        For each channel, rel_gain is the mean over groups of (max - min) of that channel's reward
        within the group: how much the channel separates the completions of one prompt. The detector
        reports a channel that is constant within most groups, and says which way: at its ceiling (its
        run-wide maximum: learned or too easy), at its floor (its run-wide minimum: never earned, too hard,
        too sparse or a broken reward function), or, when rel_gain fell from its own peak to a small
        fraction of it while the channel is neither at its floor nor its ceiling, a channel whose spread is
        fading. rel_gain that never rose is not a decay: a channel constant from the start is reported as
        saturated or never earned, not as decaying.

    Why it matters
        A channel that is constant within a group adds the same number to every completion's sum: it
        changes no advantage, under GRPO or GDPO. So a saturated channel on its own costs compute and
        leaves the run training on fewer channels than configured (information). The harm is in the
        transition, while most completions pass and a few fail: under GRPO a lone failure then dominates
        the group's std and squeezes the other channels (CD402 measures that). A channel that was earned
        and is now at its floor, or whose spread fades while it still varies, is a channel the policy is
        losing (warning). A channel that was never earned is the opposite of saturation: lowering its
        weight would remove the objective.

    Evidence
        The channel's state (ceiling, floor, fading), the share of its groups constant at its run-wide
        maximum and minimum, rel_gain at its peak and now, the ratio, and the number of groups per step the
        statistics rest on.

    Remedy
        Ceiling: drop the channel, make it harder, or use it as a gate for the other rewards. Floor:
        check the reward function on real completions, then easier prompts or a curriculum, partial credit,
        or more generations per prompt; never a lower weight. Fading: more exploration (temperature,
        num_generations) and a look at the completions for mode collapse. GDPO does not change any of
        these (a constant channel has z = 0 under GDPO too), so it is not proposed.
    """

    code = "CD101"
    name = "rel_gain decay"
    default_severity = Severity.WARNING
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_ratio": 0.25,
        "constant_share": 0.5,
        "min_groups": 2,
        "min_applies": 0.5,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        findings = []
        min_groups = ctx.threshold(self.code, "min_groups")
        applies = applies_share(series)
        judged = 0
        for k in range(len(series.channels)):
            if channel_support(ctx, k) < min_groups or applies[k] < ctx.threshold(self.code, "min_applies"):
                continue  # too few groups rank on this channel to judge it (a sparse channel: CD103)
            judged += 1
            found = self._channel(ctx, k)
            if found is not None:
                findings.append(found)
        if series.channels and not judged:
            raise NotEnoughData(f"no channel has {min_groups:g}+ groups per step with two or more values")
        return findings

    def _channel(self, ctx: DetectionContext, k: int) -> Finding | None:
        series = ctx.series
        channel = series.channels[k]
        raw = series["rel_gain"][:, k]
        smooth = ctx.smooth(raw)
        ratio, peak = ratio_to_running_peak(smooth)
        constant = ctx.smooth_rate(series["channel_zero_var_share"][:, k])
        limit = ctx.threshold(self.code, "constant_share")
        decayed = ctx.sustained(ratio < ctx.threshold(self.code, "warn_ratio"))
        flat = ctx.sustained(constant > limit)
        rose = decayed is not None and self._ranked_before(ctx, peak, constant, decayed[0])
        # The onset of a channel that ranked samples and stopped is where rel_gain fell (below warn_ratio of its
        # peak); one that never ranked them is reported from where it is constant in most groups.
        stretch = decayed if rose else (flat or decayed)
        if stretch is None:
            return None
        window = ctx.window(stretch)
        ceiling, floor, _ = channel_extreme_shares(series, window)
        at_ceiling, at_floor = float(ceiling[k]), float(floor[k])
        start, end = stretch
        tail = slice(max(start, end - ctx.persistence + 1), end + 1)
        now = nanmedian(raw[tail])
        before = np.where(np.isfinite(smooth[: start + 1]), smooth[: start + 1], -np.inf)
        peak_value = float(peak[start]) if np.isfinite(peak[start]) else float("nan")
        peak_at = int(series.steps[int(np.argmax(before))])
        support = nanmedian(series["channel_groups"][window, k])
        from_step = int(series.steps[start])
        evidence: dict[str, object] = {
            "ceiling_group_share": at_ceiling,
            "floor_group_share": at_floor,
            "constant_group_share": nanmedian(series["channel_zero_var_share"][window, k]),
            "rel_gain_peak": peak_value,
            "rel_gain_peak_step": peak_at,
            "rel_gain_now": now,
            "groups_per_step": support,
        }
        remedy: str | Remedy
        if at_ceiling >= limit:
            state, severity = "ceiling", Severity.INFO
            title = f"`{channel}` is saturated at its maximum"
            message = (
                f"`{channel}` is constant at its run-wide maximum in {pct(at_ceiling)} of groups from step "
                f"{from_step} on: every completion earns it, so it adds the same value to each and ranks nothing."
            )
            remedy = LEARNED
        elif at_floor >= limit:
            state = "floor"
            was_earned = rose
            severity = Severity.WARNING if was_earned else Severity.INFO
            title = f"`{channel}` is no longer earned" if was_earned else f"`{channel}` is rarely or never earned"
            message = (
                f"`{channel}` is constant at its run-wide minimum in {pct(at_floor)} of groups from step "
                f"{from_step} on"
                + (
                    f", after ranking samples earlier (rel_gain {peak_value:.3g} at step {peak_at}): the policy "
                    "lost it."
                    if was_earned
                    else ": no completion of those groups earns it, so it gives them no signal"
                    + (f" (it varies in {pct(1 - at_floor)} of groups)." if at_floor < 0.995 else ".")
                )
            )
            remedy = NEVER_EARNED
        elif rose:
            state, severity = "fading", Severity.WARNING
            title = f"`{channel}` no longer ranks samples"
            message = (
                f"rel_gain of `{channel}` fell from {peak_value:.3g} (step {peak_at}) to {now:.3g} "
                f"({now / peak_value:.0%} of its peak) from step {from_step} on, while it is neither at its "
                f"floor ({pct(at_floor)} of groups) nor its ceiling ({pct(at_ceiling)})."
            )
            remedy = Remedy(
                f"raise exploration ({', '.join(str(a.trl) for a in EXPLORATION)}) and read the completions for mode "
                "collapse (collapse-doctor report RUN --html report.html shows examples)",
                EXPLORATION,
            )
        else:
            return None
        evidence["state"] = state
        return self.finding(
            ctx,
            stretch,
            severity=severity,
            title=title,
            message=message + f" ({support:.0f} groups per step with two or more values.)",
            channels=(channel,),
            evidence=evidence,
            remedy=remedy,
            gdpo_resolves=gdpo_counterfactual(ctx, False),
        )

    @staticmethod
    def _ranked_before(ctx: DetectionContext, peak: np.ndarray, constant: np.ndarray, start: int) -> bool:
        """Whether the channel ranked samples before ``start``: rel_gain had a positive peak earlier, and the channel
        varied within most groups for a sustained stretch (a lone early success is not "earned")."""
        if start <= 0 or not (np.isfinite(peak[start]) and peak[start] > 0):
            return False
        limit = ctx.threshold(RelGainDecay.code, "constant_share")
        return ctx.sustained(constant[:start] < limit) is not None


@register
class SparseChannel(Detector):
    """A reward channel applies to few rollouts (None elsewhere): its statistics rest on little data.

    What it detects
        The share of rollouts on which a channel has a value (TRL's reward functions return None where
        they do not apply). It reports a channel that applies to less than `max_applies` of the rollouts,
        with the number of groups in which it can rank at all.

    Why it matters
        A channel that applies to 8% of the rollouts ranks only the few groups where two or more
        completions are scored; the other detectors do not judge it below their minimum support, so
        this finding says why. Under GRPO TRL sums None as 0, so such a channel also rewards being
        applicable (the scored completions get its value, the others 0); under GDPO each channel is
        normalised over the rows where it applies.

    Evidence
        Share of rollouts with a value, groups per step with two or more values, and the share of groups
        in which it varies.

    Remedy
        Nothing is wrong if the channel is meant to apply rarely. If it should apply more often, check
        when the reward function returns None; if "not applicable" should mean "no reward", return 0.
    """

    code = "CD103"
    name = "sparse channel"
    default_severity = Severity.INFO
    targets = "channel"
    thresholds: ClassVar[Mapping[str, float]] = {"max_applies": 0.5}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if series.num_steps == 0:
            return []
        applies = applies_share(series)
        findings = []
        for k, channel in enumerate(series.channels):
            if not applies[k] < ctx.threshold(self.code, "max_applies"):
                continue
            groups = nanmedian(series["channel_groups"][:, k])
            varies = 1.0 - nanmedian(series["channel_zero_var_share"][:, k])
            findings.append(
                self.finding(
                    ctx,
                    (0, series.num_steps - 1),
                    severity=Severity.INFO,
                    title=f"`{channel}` applies to {pct(applies[k])} of rollouts",
                    message=(
                        f"`{channel}` has a value on {pct(applies[k])} of the rollouts (None elsewhere); it can "
                        f"rank {groups:.0f} group(s) per step (median) with two or more values."
                    ),
                    channels=(channel,),
                    evidence={"applies_share": float(applies[k]), "groups_per_step": groups, "varies_share": varies},
                    remedy=(
                        "nothing to do if it is meant to apply rarely; otherwise check when the reward function "
                        "returns None (return 0 where 'not applicable' means 'no reward')"
                    ),
                    gdpo_resolves=gdpo_counterfactual(ctx, False),
                )
            )
        return findings


@register
class ZeroVarianceGroups(Detector):
    """Most rollouts carry zero advantage: silent groups, split by why (zero-variance groups).

    What it detects
        The share of rollouts whose advantage, recomputed under the run's own aggregation, is exactly 0:
        the members of groups whose advantages do not vary, and groups of one (a lone rollout is its own
        baseline: its advantage is 0 under any aggregation). The silent groups of 2+ are split by why,
        exclusively and in this order: one completion repeated (every member wrote the same text: a collapsed
        policy, known where the rollouts carry completion text; CD105 reports the collapse), all-pass (every
        channel at its run-wide maximum), all-fail (every channel at its minimum), equal rewards from different
        completions (every channel constant at a middle value: the reward cannot tell them apart), or
        cancelling (some channel varies but the advantages sum to a constant, e.g. two complementary binaries).
        The same statistic on the other aggregation's advantages is the counterfactual.

    Why it matters
        Rollouts with zero advantage contribute nothing to the policy gradient: the effective batch
        shrinks, updates get noisy, and the run stalls while the loss curve looks normal. The fix depends on
        why: one completion repeated is the policy's collapse (no weighting or aggregation changes a group of
        identical completions), all-pass groups are learned prompts (harder prompts or filtering), all-fail groups
        are too hard or a broken reward (easier prompts, partial credit, more generations), equal rewards from
        different completions need a graded reward, and cancelling channels are an aggregation problem, which
        GDPO fixes only when the channels are not affine in each other within a group (two complementary
        binaries with equal weights stay silent under GDPO too). Both all-pass and all-fail groups at once, with
        few completions per prompt, are what a pass/fail outcome does at a small group size: at size n a binary
        reward leaves at least 2^(1-n) of the groups silent (half of them at n = 2), whatever the prompts.

    Evidence
        Share of rollouts with zero advantage and of silent groups (over the stretch), the silent groups by
        cause, the same shares under the other aggregation, the group size, and the number of rollouts and
        groups they rest on.

    Remedy
        One completion repeated: the policy's step size, sampling or a KL anchor (CD105). All-pass: harder
        prompts, or filter solved prompts (dynamic sampling: skip groups whose rewards are all equal). All-fail:
        easier prompts or a curriculum, partial credit, a higher num_generations. Both at a small group size: a
        higher num_generations (not harder and easier prompts at once). Equal rewards from different completions:
        a graded reward (partial credit). Cancelling: give the channels unequal weights (TRL `reward_weights`) or
        merge them into one graded reward; switch to GDPO only when its recomputed advantages are not silent too.
    """

    code = "CD102"
    name = "zero-variance groups"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.5, "critical_share": 0.8, "min_groups": 8}

    @staticmethod
    def _share(ctx: DetectionContext) -> np.ndarray:
        series, alg = ctx.series, ctx.algorithm
        rows = series["valid_rows"]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rows > 0, series[f"zero_adv_rows_{alg}"] / np.maximum(rows, 1), np.nan)

    def _stretch(self, ctx: DetectionContext) -> tuple[int, int] | None:
        return ctx.sustained(ctx.smooth_rate(self._share(ctx)) > ctx.threshold(self.code, "warn_share"))

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if series.num_steps == 0:
            return []
        if float(np.nansum(series["groups"])) < ctx.threshold(self.code, "min_groups"):
            raise NotEnoughData(f"fewer than {ctx.threshold(self.code, 'min_groups'):g} groups")
        stretch = self._stretch(ctx)
        if stretch is None:
            return []
        window = ctx.window(stretch)
        own = signal_budget(series, ctx.algorithm, window)
        other_ctx = ctx.counterfactual()
        other = signal_budget(series, other_ctx.algorithm, window)
        assert own is not None and other is not None
        fires_other = self._stretch(other_ctx) is not None
        level = own.zero_advantage_rollout_share
        alg, alt = ctx.algorithm.upper(), other_ctx.algorithm.upper()
        steps = f"steps {int(series.steps[stretch[0]])}-{int(series.steps[stretch[1]])}"
        groups = float(np.nansum(series["groups"][window]))
        single = (groups - own.groups) / groups if groups > 0 else 0.0
        why = _split(own) if own.groups else "every group holds a single rollout"
        if own.groups and single >= 0.1:
            why += f"; {pct(single)} of the groups hold a single rollout"
        message = (
            f"{pct(level)} of rollouts carry zero advantage under {alg} ({steps}; {own.rollouts:,} rollouts): "
            f"{why}. Under {alt} {pct(other.zero_advantage_rollout_share)} would"
            + (" (the same condition fires)." if fires_other else " (below the threshold).")
        )
        resolves = not fires_other
        groups_of_two = ChangeSetting("num_generations", "raise", 2)
        cause = 0.1
        """A cause of silence gets its remedy when it holds this share of the groups."""
        passing, failing_ = own.pass_group_share >= cause, own.fail_group_share >= cause
        size = ctx.run.group_size_max
        both = passing and failing_ and 2 <= size <= 4
        remedy = Remedy.join(
            Remedy(
                f"sample several completions per prompt (TRL {groups_of_two.trl}, verl {groups_of_two.verl}: "
                f"{groups_of_two.value_text} or more): a group of one is its own baseline, so its advantage is 0 under "
                "any aggregation",
                (groups_of_two,),
            )
            if single >= 0.1
            else None,
            policy_collapse_remedy(int(series.steps[stretch[0]])) if own.repeated_group_share >= cause else None,
            Remedy(
                f"both all-pass ({pct(own.pass_group_share)}) and all-fail ({pct(own.fail_group_share)}) groups at "
                f"group size {size}: a pass/fail outcome leaves at least {pct(2.0 ** (1 - size))} of such groups "
                f"silent whatever the prompts; raise {MORE_GENERATIONS.trl} (verl {MORE_GENERATIONS.verl})",
                (MORE_GENERATIONS,),
            )
            if both
            else None,
            "harder prompts, or filter solved prompts (dynamic sampling)" if passing and not both else None,
            Remedy(
                f"easier prompts or a curriculum, partial credit, or a higher {MORE_GENERATIONS.trl}",
                (MORE_GENERATIONS,),
            )
            if failing_ and not both
            else None,
            "the reward gives different completions the same value: a graded reward (partial credit) ranks them"
            if own.equal_group_share >= cause
            else None,
            "the channels cancel within groups: give them unequal weights (TRL reward_weights) or merge them into "
            "one graded reward"
            if own.cancel_group_share >= cause
            else None,
            switch_remedy(ctx, resolves and own.cancel_group_share >= cause),
        )
        return [
            self.finding(
                ctx,
                stretch,
                severity=Severity.CRITICAL if level > ctx.threshold(self.code, "critical_share") else Severity.WARNING,
                title="most rollouts give no gradient",
                message=message,
                evidence={
                    "zero_advantage_rollout_share": level,
                    "silent_group_share": own.silent_group_share,
                    "all_pass_group_share": own.all_pass_group_share,
                    "all_fail_group_share": own.all_fail_group_share,
                    "identical_completion_group_share": own.identical_group_share,
                    "equal_reward_group_share": own.equal_group_share,
                    "cancel_group_share": own.cancel_group_share,
                    "group_size": size,
                    f"zero_advantage_rollout_share_{other_ctx.algorithm}": other.zero_advantage_rollout_share,
                    "single_rollout_group_share": single,
                    "rollouts": own.rollouts,
                    "groups": int(groups),
                },
                remedy=remedy if remedy.text else "filter prompts whose groups are silent (dynamic sampling)",
                gdpo_resolves=gdpo_counterfactual(ctx, resolves),
            )
        ]


def _split(budget: SignalBudget) -> str:
    """``"40% of groups all-pass, 15% all-fail, 7% cancelling"``: the silent groups by cause, exclusive, a collapse
    to one completion first and equal rewards where some groups have them."""
    parts = []
    if budget.repeated_group_share > 0:
        parts.append(f"{pct(budget.repeated_group_share)} hold one completion repeated (mode collapse)")
    parts += [f"{pct(budget.pass_group_share)} all-pass", f"{pct(budget.fail_group_share)} all-fail"]
    if budget.equal_group_share >= 0.005:
        parts.append(f"{pct(budget.equal_group_share)} equal rewards from different completions")
    parts.append(f"{pct(budget.cancel_group_share)} cancelling")
    first, *rest = parts
    number, _, words = first.partition(" ")
    return ", ".join([f"{number} of groups {words}", *rest])
