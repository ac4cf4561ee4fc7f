"""CD503: the policy's entropy collapsing without a reward gain (scalar logs); the remedy settings CD511
(:mod:`~collapse_doctor.judge.detectors.entropy_arrival`) shares."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import persistent_onset
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, Severity, current_size, register
from collapse_doctor.judge.detectors.remedies import CLIP_HIGHER, HOTTER, LOWER_LR, Remedy, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ScalarDetector,
    fall_start,
    finite_points,
    level_points,
    logged_series,
    support,
    tag_of,
)
from collapse_doctor.judge.detectors.trends import noise_sigma

ENTROPY_BONUS = ChangeSetting("entropy_coef", "raise")
EXPLORE = (HOTTER, ENTROPY_BONUS, CLIP_HIGHER, LOWER_LR)
"""An entropy collapse: sample more widely, reward entropy, let unlikely tokens rise, or move the policy slower."""


@dataclass(frozen=True)
class RewardLevels:
    """The training reward (or the sum of the channel means) early, at the entropy's fall onset and now."""

    source: str
    early: float
    onset: float
    now: float
    noise_early: float
    noise_onset: float
    points: int

    @property
    def rising(self) -> bool:
        """Above both its early level and its level at the onset by more than the noise of each difference.

        >>> RewardLevels("`train/reward`", 0.76, 0.15, 0.25, 0.02, 0.02, 100).rising  # back up from a dip only
        False
        >>> RewardLevels("`train/reward`", 0.2, 0.25, 0.9, 0.02, 0.02, 100).rising
        True
        """
        return bool(self.now - self.early > self.noise_early and self.now - self.onset > self.noise_onset)

    @property
    def noise(self) -> float:
        return max(self.noise_early, self.noise_onset)

    def evidence(self) -> dict[str, Any]:
        return {
            "reward_source": self.source,
            "reward_early": self.early,
            "reward_onset": self.onset,
            "reward_now": self.now,
            "reward_noise": self.noise,
            "reward_points": self.points,
        }


@register
class EntropyCollapse(ScalarDetector):
    """The policy's entropy falls to a small fraction of its early level without a reward gain (scalar logs).

    What it detects
        The logged token entropy (TRL `entropy`, verl `actor/entropy`, NeMo-RL `approx_entropy`). Its early
        level is the median of its first 10% of points (at least the persistence window); its current level
        the median of its last 10% (the current window, at least the persistence window). It fires when the
        smoothed entropy stayed at or below `warn_ratio` of the early level for a persistence window and the
        training reward did not rise over the same stretch. The reward is the `reward` series (else the sum
        of the per-channel means at the steps that log them all); it rose when its median over the current
        window is above both its median over the early window and its median over the persistence window
        before the fall onset (the last point where the entropy stood at 90% of its early level) by more than
        the noise of each difference (twice the standard error of a difference of two medians, from the
        reward's point-to-point changes). Entropy that falls while the reward rises is convergence (a policy
        that commits to what earns the reward): it is not reported. A reward now below where the run started
        has not risen, even if it climbed back a little from a dip at the onset.

        Graded on the current window: still collapsed there (current level at or below `warn_ratio` of the
        early level) is a warning, critical when the zero-std share (TRL `frac_reward_zero_std`) also rose
        over the stretch (its mean over the current window above its mean over the early window by at least
        `zero_std_rise`): the collapse now costs the gradient. A collapse that ended (entropy back above the
        fraction in the current window) is information, "recovered at step N", with its steps (its reward is
        judged at the end of the fall, the same way; a collapse with a reward gain is not reported). Needs
        `min_points` finite entropy points (fewer: not judged, listed as skipped); the reward and the zero-std
        share are used when they have `min_points` points.

    Why it matters
        Entropy that collapses without a reward gain means the policy samples nearly the same completion
        for every prompt for no return: groups stop disagreeing, advantages go to 0 and exploration stops.
        It often follows a reward channel that is easy to game (a format check) pulling every completion
        toward one template. Low entropy on its own does not remove the gradient, so the finding is a
        warning; together with a rising share of silent groups (zero reward std, zero advantage) the
        gradient is going with it, and it is critical.

    Evidence
        The raw entropy tag, its early and current level with the points each rests on, their ratio and the
        fraction, the fall onset and the steps the fall took (from 90% of the early level to the fraction),
        the training reward early, at the onset and now with its noise floor and source, the zero-std share
        early and now when logged, and for a collapse that ended its level while it held (`low`) and the step it
        recovered at (`recovered_step`).

    Remedy
        Raise the sampling temperature or add an entropy bonus, lower the learning rate, clip higher
        (asymmetric clipping, DAPO's clip-higher), and check whether one channel dominates (CD402).
    """

    code = "CD503"
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.ENTROPY,),)
    name = "entropy collapse"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_ratio": 0.3,
        "zero_std_rise": 0.3,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.series(ctx, S.ENTROPY)
        if found is None:
            return []
        steps, values = level_points(found)
        n = len(values)
        persist = self.persistence(ctx, n)
        head = self._window(ctx, n)
        early = nanmedian(values[:head])
        if not (np.isfinite(early) and early > 0):
            return []
        fraction = float(ctx.threshold(self.code, "warn_ratio"))
        with np.errstate(invalid="ignore"):
            ratio = self.smooth(ctx, values) / early
        stretch = persistent_onset(ratio <= fraction, persist)
        if stretch is None:
            return []  # never at the fraction for a persistence window
        start, end = stretch
        tail = n - self._window(ctx, n)
        now = nanmedian(values[tail:])
        ongoing = now <= fraction * early
        if not ongoing and end == n - 1:
            # low again for a persistence window at the very end, not yet most of the current window
            now, ongoing = self.settled_level(values, stretch, persist), True
        onset = fall_start(ratio, start)
        fall_from, first, last = int(steps[onset]), int(steps[start]), int(steps[end])
        # the levels compared: the current window while it holds, else the last persistence window of the fall
        now_from = steps[tail] if ongoing else steps[max(start, end - persist + 1)]
        now_to = steps[-1] if ongoing else steps[end]
        reward = self._reward(ctx, steps[head - 1], steps[onset], now_from, now_to)
        if reward is not None and reward.rising:
            return []  # entropy fell while the reward rose: convergence, not collapse
        tag = tag_of(ctx, S.ENTROPY)
        low = now if ongoing else nanmedian(values[start : end + 1])  # the collapse's level while it held
        evidence: dict[str, Any] = {
            "tag": tag,
            "early": early,
            "early_points": head,
            "now": now,
            "now_points": n - tail,
            "ratio": now / early,
            "fraction": fraction,
            "fall_from_step": fall_from,
            "fall_steps": first - fall_from,
        } | support(len(found.steps), stretch)
        message = (
            f"entropy (`{tag}`, {len(found.steps)} points) fell from {early:.3g} (median of its first {head} points)"
        )
        if ongoing:
            message += (
                f" to {now:.3g} (median of its last {n - tail} points): {_share(now / early)} of its early level, "
                f"at or below the fraction {pct(fraction)} since step {first} (the fall began at step {fall_from})"
            )
        else:
            recovered = int(steps[end + 1])
            evidence |= {"low": low, "recovered_step": recovered}
            message += (
                f" to {low:.3g} ({_share(low / early)} of its early level, at or below the fraction {pct(fraction)}) "
                f"at steps {first}-{last} (the fall began at step {fall_from}) and recovered at step {recovered}: it "
                f"stands at {now:.3g} over its last {n - tail} points ({_share(now / early)})"
            )
        if reward is not None:
            evidence |= reward.evidence()
            message += (
                f", while the training reward ({reward.source}) went from {reward.early:.3g} early and "
                f"{reward.onset:.3g} at the onset to {reward.now:.3g} {'now' if ongoing else 'at the end of the fall'} "
                f"(not rising: not above both by more than its noise, {reward.noise:.2g})."
            )
        else:
            message += " (no reward series to tell convergence from collapse)."
        critical = False
        zero = self._zero_std(ctx, steps[head - 1], steps[tail] if ongoing else steps[start], now_to)
        if zero is not None:
            zero_early, zero_now, zero_points = zero
            evidence |= {"zero_std_share_early": zero_early, "zero_std_share": zero_now, "zero_std_points": zero_points}
            rise = ctx.threshold(self.code, "zero_std_rise")
            critical = ongoing and zero_now - zero_early >= rise
            zero_tag = tag_of(ctx, S.ZERO_STD_SHARE)
            message += (
                f" The zero-std share (`{zero_tag}`) went from {pct(zero_early)} early to {pct(zero_now)} "
                f"{'now' if ongoing else 'over the fall'}"
                + (f": silent groups rose with the collapse (by {pct(rise)} or more)." if critical else ".")
            )
        if ongoing:
            severity = Severity.CRITICAL if critical else Severity.WARNING
            title = "entropy collapsed, silent groups rising" if critical else "entropy collapsed without a reward gain"
        else:
            severity = Severity.INFO
            title = f"entropy collapsed at steps {first}-{last} without a reward gain"  # finding() adds "recovered"
        return [
            self.finding(
                ctx,
                stretch,
                steps=steps,
                severity=severity,
                title=title,
                message=message,
                evidence=evidence,
                remedy=Remedy(
                    "raise the temperature or add an entropy bonus, lower the learning rate, use clip-higher, "
                    "and check whether one reward channel dominates (CD402)",
                    EXPLORE,
                ),
                recovered=None if ongoing else recovered,
            )
        ]

    def _window(self, ctx: DetectionContext, n: int) -> int:
        """Points in the early and the current window: 10% of them, at least the persistence window and 3."""
        return current_size(n, self.persistence(ctx, n), minimum=3)

    def _reward(
        self, ctx: DetectionContext, early_end: float, onset: float, now_from: float, now_to: float
    ) -> RewardLevels | None:
        """The reward's levels: over the entropy's early window (steps up to ``early_end``), over the persistence
        window before ``onset``, and from ``now_from`` to ``now_to``; ``None`` without a reward series."""
        series = reward_points(ctx, self.minimum(ctx))
        if series is None:
            return None
        source, r_steps, r_values = series
        w = max(3, self.persistence(ctx, len(r_values)))
        early = r_values[r_steps <= early_end]
        early = early if len(early) else r_values[:w]
        before = r_values[r_steps <= onset][-w:]
        before = before if len(before) else r_values[:w]
        now = r_values[(r_steps >= now_from) & (r_steps <= now_to)]
        now = now if len(now) else r_values[r_steps <= now_to][-w:]
        if not len(now):
            return None
        sigma = noise_sigma(r_values)

        def noise(a: np.ndarray, b: np.ndarray) -> float:
            return max(2 * 1.2533 * sigma * math.sqrt(1 / len(a) + 1 / len(b)), 1e-12)

        return RewardLevels(
            source,
            nanmedian(early),
            nanmedian(before),
            nanmedian(now),
            noise(early, now),
            noise(before, now),
            len(r_values),
        )

    def _zero_std(
        self, ctx: DetectionContext, early_end: float, now_from: float, now_to: float
    ) -> tuple[float, float, int] | None:
        """The zero-std share's mean over the early window and from ``now_from`` to ``now_to``, and its points
        (``None`` when it is not logged with enough points). Means: a share over few groups moves in quanta,
        and TRL's GDPO flag is 0 or 1 per step."""
        found = self.optional(ctx, S.ZERO_STD_SHARE)
        if found is None:
            return None
        z_steps, z_values = finite_points(found)
        early = z_values[z_steps <= early_end]
        now = z_values[(z_steps >= now_from) & (z_steps <= now_to)]
        if not len(early) or not len(now):
            return None
        return float(np.mean(early)), float(np.mean(now)), len(z_values)


def _share(ratio: float) -> str:
    """A ratio as a percentage, with two decimals below 1% (a collapse to 0.5% is not "0%").

    >>> _share(0.3), _share(0.0047)
    ('30%', '0.47%')
    """
    return pct(ratio) if not math.isfinite(ratio) or ratio >= 0.01 else f"{ratio:.2%}"


def reward_points(ctx: DetectionContext, minimum: int) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The training reward's finite points and where they come from: the ``reward`` series, else the sum of the
    per-channel means at the steps where every channel logged one (each with at least ``minimum`` points).

    ``None`` when neither has ``minimum`` points.
    """
    reward = logged_series(ctx, S.REWARD)
    if reward is not None:
        steps, values = finite_points(reward)
        if len(values) >= minimum:
            return f"`{tag_of(ctx, S.REWARD)}`", steps, values
    if ctx.scalars is None:
        return None
    named = [
        (c, finite_points(ctx.scalars.series[S.CHANNEL_MEAN + c]))
        for c in ctx.scalars.channels
        if S.CHANNEL_MEAN + c in ctx.scalars
    ]
    named = [(c, p) for c, p in named if len(p[1]) >= minimum]
    if not named:
        return None
    parts = [p for _, p in named]
    common = parts[0][0]
    for steps, _ in parts[1:]:
        common = np.intersect1d(common, steps)
    if len(common) < minimum:
        return None
    total = np.zeros(len(common))
    for steps, values in parts:
        total += values[np.searchsorted(steps, common)]
    names = ", ".join(f"`{tag_of(ctx, S.CHANNEL_MEAN + c)}`" for c, _ in named)
    return f"the sum of the channel means {names}", common, total
