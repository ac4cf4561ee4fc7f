"""CD505: one reward channel's std falling to ~0 while the others still vary (scalar logs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import persistent_onset, ratio_to_running_peak
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import join_remedies, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ZERO,
    ScalarDetector,
    holds_at_end,
    support,
    tag_of,
)


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
        (with rollouts, or the TRL callback's per-channel series in the log, CD101 judges it per group).

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
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.CHANNEL_STD,),)
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
            if ctx.judges_groups:
                return None  # never varied in a sustained way: CD101 judges the channel per group (or its series)
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
                "tag": tag_of(ctx, S.CHANNEL_STD + channel),
                "direction": direction,
                "std_peak": peak_value,
                "std_peak_step": peak_at,
                "std_now": now,
                "ratio": now_ratio,
                "mean_before": mean_before,
                "mean_now": mean_now,
                "other_channels_ratio": other_now,
            }
            | support(len(steps), stretch),
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
        if ctx.judges_groups:
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
                "tag": tag_of(ctx, S.CHANNEL_STD + channel),
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
