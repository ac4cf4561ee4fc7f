"""CD102: most rollouts carry zero advantage, the silent groups split by why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core.findings import ChangeSetting
from collapse_doctor.core.numbers import pct
from collapse_doctor.judge.budget import SignalBudget, signal_budget
from collapse_doctor.judge.detectors.base import DetectionContext, Detector, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.mode_collapse import collapsed_now
from collapse_doctor.judge.detectors.remedies import (
    MORE_GENERATIONS,
    Remedy,
    estimator_remedy,
    gdpo_counterfactual,
    policy_collapse_remedy,
    switch_remedy,
)


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
        The same statistic on the other aggregation's advantages is the counterfactual. Every estimator with
        a group baseline (GRPO, GDPO, RLOO, OPO, GPG, leave-one-out GRPO, REINFORCE++ with a group baseline) is
        silent on exactly these groups; pass@k GRPO also gives 0 to every rollout but each group's best, by
        design, which is not counted as silence. Under REINFORCE++ (a batch baseline) a group of equal rewards
        still gets advantages, so the check is skipped.

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
        Where that floor reaches `warn_share` (n = 2) and the run's silent groups are all-pass and all-fail, the
        condition is reported over the whole run when its silent share is within two standard errors of the
        floor, though sampling keeps it under the cut step by step.

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
        Another estimator (verl `algorithm.adv_estimator`) is named only where its zero-advantage share, computed
        on the same sampled groups (`run.counterfactuals`), is at most half the run's: a batch baseline
        (REINFORCE++) ranks a silent group against the step.
    """

    code = "CD102"
    name = "zero-variance groups"
    default_severity = Severity.WARNING
    requires = ("rollouts", "group_baseline")
    thresholds: ClassVar[Mapping[str, float]] = {"warn_share": 0.5, "critical_share": 0.8, "min_groups": 8}

    @staticmethod
    def _share(ctx: DetectionContext) -> np.ndarray:
        series, alg = ctx.series, ctx.algorithm
        rows = series["valid_rows"]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rows > 0, series[f"zero_adv_rows_{alg}"] / np.maximum(rows, 1), np.nan)

    def _stretch(self, ctx: DetectionContext) -> tuple[int, int] | None:
        return ctx.sustained(ctx.smooth_rate(self._share(ctx)) > ctx.threshold(self.code, "warn_share"))

    def _binary_floor(self, ctx: DetectionContext) -> float | None:
        """The silent share a pass/fail outcome forces at the run's group size (``2 ** (1 - n)``), when it reaches
        ``warn_share`` and the run is consistent with it: its silent groups are all-pass and all-fail (each 10%+
        of the groups, together 90%+ of the silence) and its silent share over the run is not below the floor by
        more than two standard errors (over its groups). None otherwise."""
        size = ctx.run.group_size_max
        if not 2 <= size <= 4:
            return None
        floor = 2.0 ** (1 - size)
        if floor < ctx.threshold(self.code, "warn_share"):
            return None
        run = signal_budget(ctx.series, ctx.algorithm, slice(None))
        if run is None or not run.groups:
            return None
        outcome = run.pass_group_share + run.fail_group_share
        if min(run.pass_group_share, run.fail_group_share) < 0.1 or outcome < 0.9 * run.silent_group_share:
            return None
        error = float(np.sqrt(floor * (1 - floor) / run.groups))
        return floor if run.silent_group_share >= floor - 2 * error else None

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if series.num_steps == 0:
            return []
        if float(np.nansum(series["groups"])) < ctx.threshold(self.code, "min_groups"):
            raise NotEnoughData(f"fewer than {ctx.threshold(self.code, 'min_groups'):g} groups")
        stretch = self._stretch(ctx)
        floor = None
        if stretch is None:
            floor = self._binary_floor(ctx)
            if floor is None:
                return []
            stretch = (0, series.num_steps - 1)
        window = ctx.window(stretch)
        own = signal_budget(series, ctx.algorithm, window)
        other_ctx = ctx.counterfactual()
        other = signal_budget(series, other_ctx.algorithm, window)
        assert own is not None and other is not None
        fires_other = self._stretch(other_ctx) is not None or self._binary_floor(other_ctx) is not None
        level = own.zero_advantage_rollout_share
        alg, alt = ctx.algorithm.upper(), other_ctx.algorithm.upper()
        steps = f"steps {int(series.steps[stretch[0]])}-{int(series.steps[stretch[1]])}"
        groups = float(np.nansum(series["groups"][window]))
        single = (groups - own.groups) / groups if groups > 0 else 0.0
        why = _split(own) if own.groups else "every group holds a single rollout"
        if floor is not None:
            why += (
                f"; under the {pct(ctx.threshold(self.code, 'warn_share'))} cut step by step, but within sampling "
                f"error of the {pct(floor)} a pass/fail outcome leaves silent at group size {ctx.run.group_size_max}"
            )
        if own.groups and single >= 0.1:
            why += f"; {pct(single)} of the groups hold a single rollout"
        # Graded on the current window while the condition holds through it (CURRENT_WINDOW_RULE).
        ongoing = ctx.recovered_at(stretch) is None
        current = signal_budget(series, ctx.algorithm, ctx.current_window) if ongoing else None
        graded_now = current is not None and current.rollouts > 0
        now = current.zero_advantage_rollout_share if graded_now and current is not None else level
        last = ctx.current_window.stop - ctx.current_window.start
        message = (
            f"{pct(level)} of rollouts carry zero advantage under {alg} ({steps}; {own.rollouts:,} rollouts)"
            + (f", {pct(now)} over the last {last} steps" if graded_now else "")
            + f": {why}. Under {alt} {pct(other.zero_advantage_rollout_share)} would"
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
            (
                policy_collapse_remedy(int(series.steps[stretch[0]]))
                if collapsed_now(ctx)
                else "the collapse to identical completions has ended (CD105): nothing to change for it now"
            )
            if own.repeated_group_share >= cause
            else None,
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
            estimator_remedy(
                ctx,
                window,
                "zero_advantage_share",
                "leave {theirs} of rollouts without advantage (a batch baseline ranks a silent group against the step)",
            ),
        )
        return [
            self.finding(
                ctx,
                stretch,
                severity=Severity.CRITICAL if now > ctx.threshold(self.code, "critical_share") else Severity.WARNING,
                title="most rollouts give no gradient",
                message=message,
                evidence={
                    "zero_advantage_rollout_share": level,
                    "zero_advantage_rollout_share_now": now,
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
