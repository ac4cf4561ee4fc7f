"""CD101, CD103: reward channels that stop (or never start) giving a learning signal, or that apply to few rollouts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core.numbers import pct
from collapse_doctor.core.series import RunSeries
from collapse_doctor.core.smoothing import finite_peak, ratio_to_running_peak
from collapse_doctor.judge.budget import applies_share, channel_extreme_shares
from collapse_doctor.judge.detectors.base import DetectionContext, Detector, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.mode_collapse import identical_share_over
from collapse_doctor.judge.detectors.remedies import (
    HOTTER,
    MORE_GENERATIONS,
    Remedy,
    gdpo_counterfactual,
    nanmedian,
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


NEAR_CEILING = 0.9
"""A channel whose mean is this far (share of the way from its run-wide minimum to its maximum) is near its ceiling:
its spread shrinks because it is learned, not because it fades."""


def _mean_level(series: RunSeries, k: int, window: slice, start: int) -> dict[str, float]:
    """Channel ``k``'s mean before the stretch and during it, and where the latter sits between the channel's
    run-wide minimum (0) and maximum (1)."""
    mean = series["reward_mean"][:, k]
    low, high = np.nanmin(series["reward_min"][:, k]), np.nanmax(series["reward_max"][:, k])
    during = nanmedian(mean[window])
    before = nanmedian(mean[:start]) if start > 0 else float("nan")
    span = float(high - low)
    position = (during - float(low)) / span if np.isfinite(span) and span > 0 else float("nan")
    return {"mean_before": before, "mean_during": during, "position": position}


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
        saturated or never earned, not as decaying. The words follow the numbers: a channel constant because
        most groups hold one completion repeated is constant because the policy collapsed (info, pointing to
        CD105); a channel at its floor in most groups whose mean rose is "all or nothing within groups" (info,
        not "lost"); a channel whose spread shrinks while its mean sits at 90% or more of the way from its
        run-wide minimum to its maximum is "near its maximum" (info, learned), not fading. A run read from its
        scalar log only is judged on the per-channel series CollapseDoctorCallback logs (the same statistics,
        one point per log, the ceiling and floor against the extremes so far); without them it is skipped.

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
        maximum and minimum, rel_gain at its peak over the run (the channel table's, smoothed) and before the
        onset (what the message's "fell from" compares with), rel_gain now, and the number of groups per step
        the statistics rest on.

    Remedy
        Ceiling: drop the channel, make it harder, or use it as a gate for the other rewards. Floor:
        check the reward function on real completions, then easier prompts or a curriculum, partial credit,
        or more generations per prompt; never a lower weight. Fading: more exploration (temperature,
        num_generations) and a look at the completions for mode collapse. GDPO does not change any of
        these (a constant channel has z = 0 under GDPO too), so it is not proposed.
    """

    code = "CD101"
    name = "rel_gain decay"
    requires = ("channel_series",)
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
        # The run's peak as the channel table shows it (smoothed, over every step), beside the peak before the onset
        run_peak, run_peak_at = finite_peak(smooth, series.steps)
        support = nanmedian(series["channel_groups"][window, k])
        from_step = int(series.steps[start])
        evidence: dict[str, object] = {
            "ceiling_group_share": at_ceiling,
            "floor_group_share": at_floor,
            "constant_group_share": nanmedian(series["channel_zero_var_share"][window, k]),
            "rel_gain_peak": run_peak,
            "rel_gain_peak_step": run_peak_at,
            "rel_gain_peak_before_onset": peak_value,
            "rel_gain_peak_before_onset_step": peak_at,
            "rel_gain_now": now,
            "groups_per_step": support,
        }
        remedy: str | Remedy
        level = _mean_level(series, k, window, start)
        identical = identical_share_over(ctx, window)[0] if "completion_groups" in series else float("nan")
        evidence |= level | ({"identical_completion_group_share": identical} if np.isfinite(identical) else {})
        if identical >= limit and not at_ceiling >= limit:
            # Constant because the completions are: the policy collapsed (CD105), the reward did not change.
            state, severity = "collapsed", Severity.INFO
            title = f"`{channel}` is constant within groups because their completions are identical"
            message = (
                f"`{channel}` is constant in {pct(evidence['constant_group_share'])} of groups from step {from_step} "
                f"on, and {pct(identical)} of those steps' groups hold one completion repeated: the policy collapsed "
                "(CD105), so no reward can vary in them; the reward itself is not the cause."
            )
            remedy = "see CD105 (mode collapse): the fix is the policy's, not this reward's"
        elif at_ceiling >= limit:
            state, severity = "ceiling", Severity.INFO
            title = f"`{channel}` is saturated at its maximum"
            message = (
                f"`{channel}` is constant at its run-wide maximum in {pct(at_ceiling)} of groups from step "
                f"{from_step} on: every completion earns it, so it adds the same value to each and ranks nothing."
            )
            remedy = LEARNED
        elif at_floor >= limit:
            state = "floor"
            # "Lost" only where it was earned before and its mean fell: a mean that rose is not a loss.
            mean_rose = level["mean_during"] > level["mean_before"]  # NaN (no history) or flat: not a rise
            was_earned = rose and not mean_rose
            severity = Severity.WARNING if was_earned else Severity.INFO
            if was_earned:
                title = f"`{channel}` is no longer earned"
                ending = (
                    f", after ranking samples earlier (rel_gain {peak_value:.3g} at step {peak_at}): "
                    "the policy lost it."
                )
            elif rose and mean_rose:
                title = f"`{channel}` is all or nothing within most groups"
                ending = (
                    f", while its mean rose from {level['mean_before']:.3g} to {level['mean_during']:.3g}: a group "
                    "either all earns it or none of it does, so it ranks nothing inside the group."
                )
            else:
                title = f"`{channel}` is rarely or never earned"
                ending = ": no completion of those groups earns it, so it gives them no signal" + (
                    f" (it varies in {pct(1 - at_floor)} of groups)." if at_floor < 0.995 else "."
                )
            message = (
                f"`{channel}` is constant at its run-wide minimum in {pct(at_floor)} of groups from step {from_step} on"
            )
            message += ending
            remedy = NEVER_EARNED
        elif rose and level["position"] >= NEAR_CEILING:
            state, severity = "ceiling", Severity.INFO
            title = f"`{channel}` is near its maximum"
            message = (
                f"rel_gain of `{channel}` fell from {peak_value:.3g} (step {peak_at}) to {now:.3g} from step "
                f"{from_step} on while its mean stands at {pct(level['position'])} of the way from its run-wide "
                "minimum to its maximum: most completions earn nearly all of it, so little is left to rank."
            )
            remedy = LEARNED
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
    """A reward channel applies to few rollouts (None elsewhere), or stopped: its statistics rest on little data.

    What it detects
        The share of rollouts on which a channel has a value (TRL's reward functions return None where
        they do not apply). It reports a channel that applies to less than `max_applies` of the rollouts,
        with the number of groups in which it can rank at all. A channel that had a value for a sustained
        stretch (the persistence window) and then has none at any step to the end of the run, for the
        persistence window or longer, stopped: a warning (a reward function that now fails or times out
        and returns None, a judge that went away), with the step it stopped at; critical when no channel is
        left on those steps (every rollout unscored: no gradient at all). Rollouts without any reward (every
        channel None) are reported when they are more than `max_unscored` of the run's for a sustained
        stretch: their advantage is 0 and they are left out of the baselines, so they cost generation and
        train nothing; critical when at least `critical_unscored` of the current window's rollouts are.

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
    thresholds: ClassVar[Mapping[str, float]] = {"max_applies": 0.5, "max_unscored": 0.5, "critical_unscored": 0.9}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if series.num_steps == 0:
            return []
        applies = applies_share(series)
        findings: list[Finding] = []
        stopped = self._stopped(ctx)
        findings += stopped.values()
        if not stopped:
            findings += self._unscored(ctx)
        for k, channel in enumerate(series.channels):
            if channel in stopped or not applies[k] < ctx.threshold(self.code, "max_applies"):
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

    def _unscored(self, ctx: DetectionContext) -> list[Finding]:
        """Rollouts without any reward (every channel None), more than ``max_unscored`` of them for a stretch."""
        series = ctx.series
        total, valid = series["rollouts"], series["valid_rows"]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, (total - valid) / np.maximum(total, 1.0), np.nan)
        limit = ctx.threshold(self.code, "max_unscored")
        stretch = ctx.sustained(ctx.smooth_rate(share) > limit)
        if stretch is None:
            return []
        window = ctx.window(stretch)
        unscored = int(np.nansum((total - valid)[window]))
        rows = int(np.nansum(total[window]))
        now = float(np.nanmean(share[ctx.current_window]))
        # Critical only where almost nothing trains any more; half the rollouts unscored is waste, not a collapse
        severity = Severity.CRITICAL if now >= ctx.threshold(self.code, "critical_unscored") else Severity.WARNING
        first, last = int(series.steps[stretch[0]]), int(series.steps[stretch[1]])
        return [
            self.finding(
                ctx,
                stretch,
                severity=severity,
                title=f"{pct(unscored / max(rows, 1))} of rollouts have no reward at all",
                message=(
                    f"{unscored:,} of the {rows:,} rollouts of steps {first}-{last} have no value on any channel "
                    f"(every reward function returned None): their advantage is 0 and they train nothing "
                    f"({pct(now)} of the rollouts of the last steps)."
                ),
                evidence={"unscored_rollouts": unscored, "rollouts": rows, "unscored_share_now": now},
                remedy=(
                    "check why the reward functions return None for these completions (a parser that fails on "
                    "the output format, a judge that times out); return 0 where 'not applicable' means 'no reward'"
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, False),
            )
        ]

    def _stopped(self, ctx: DetectionContext) -> dict[str, Finding]:
        """The channels that had values for a sustained stretch and then none at any step to the end."""
        series = ctx.series
        persist = ctx.persistence
        out = {}
        rows = series["channel_rows"]
        for k, channel in enumerate(series.channels):
            has = np.nan_to_num(rows[:, k]) > 0
            if not has.any():
                continue
            stop = int(np.flatnonzero(has)[-1]) + 1  # the first step of the silence that lasts to the end
            if series.num_steps - stop < persist or ctx.sustained(has[:stop]) is None:
                continue
            before = float(np.nansum(rows[:stop, k]) / max(float(np.nansum(series["rollouts"][:stop])), 1.0))
            first, last, until = int(series.steps[stop]), int(series.steps[-1]), int(series.steps[stop - 1])
            silent_rows = int(np.nansum(series["rollouts"][stop:]))
            others = int(np.nansum(series["valid_rows"][stop:]))  # rollouts another channel still scores
            consequence = (
                "so the run trains on the other channels alone since then."
                if others
                else "and no other channel scores them either: their advantages are 0 and the run trains nothing "
                "since then."
            )
            out[channel] = self.finding(
                ctx,
                (stop, series.num_steps - 1),
                severity=Severity.WARNING if others else Severity.CRITICAL,
                title=f"`{channel}` stopped: no value since step {first}",
                message=(
                    f"`{channel}` had a value on {pct(before)} of the rollouts until step {until} "
                    f"and has none on the {silent_rows:,} rollouts of steps {first}-{last}: "
                    f"the reward function returns None (or is no longer called) for every completion, {consequence}"
                ),
                channels=(channel,),
                evidence={
                    "applies_share_before": before,
                    "last_step_with_value": until,
                    "rollouts_without_value": silent_rows,
                },
                remedy=(
                    "check the reward function's errors and timeouts since that step (a judge or sandbox that fails "
                    "and returns None); restart from a checkpoint before it once it is fixed"
                ),
                gdpo_resolves=gdpo_counterfactual(ctx, False),
            )
        return out
