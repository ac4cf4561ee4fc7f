"""CD508: the trust region clipping a large share of tokens, or one side far more than the other (scalar logs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting, Remedy
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import persistent_onset, rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import CLIP_HIGHER, LOWER_LR
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ScalarDetector,
    finite_points,
    logged_series,
    mean_within,
    support,
    tag_of,
)

FEWER_ITERATIONS = ChangeSetting("num_iterations", "lower")
"""Fewer updates per generation batch: each moves the policy less far from the one that sampled."""


@register
class ClipSaturation(ScalarDetector):
    """The trust region clips a large share of tokens, or clips one side far more than the other (scalar logs).

    What it detects
        The share of tokens whose probability ratio the PPO-style trust region clipped: TRL
        `clip_ratio/region_mean` with its sides `clip_ratio/low_mean` (ratio below 1 - `epsilon` on a
        negative advantage) and `clip_ratio/high_mean` (above 1 + `epsilon_high` on a positive one), verl
        `actor/pg_clipfrac` (both sides; `actor/pg_clipfrac_lower`, the dual clip, is shown as evidence),
        OpenRLHF `ppo_clip_ratio`. Averaged over twice the persistence window, it fires when the share stays
        above `warn_share` (critical above `critical_share`), or when one side stays at least `asymmetry`
        times the other with the larger side above `min_side_share`. A share of 0 (one update per
        generation batch: the ratio is exactly 1) never fires.

    Why it matters
        A clipped token contributes no gradient: when a large share is clipped, most of each update is
        thrown away and the policy moves as far as the trust region allows on every step (critical when
        most tokens are clipped). Clipping mostly on the high side caps how fast unlikely tokens with a
        positive advantage can rise: exploration is starved and entropy falls (the case for DAPO's
        clip-higher). Clipping mostly on the low side means the updates push negative-advantage tokens down
        faster than the trust region allows.

    Evidence
        The raw tags, the share over the stretch and its peak, the low and high sides when logged and their
        ratio, the dual-clip share when logged, and the points they rest on.

    Remedy
        High share: lower the learning rate (TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`)
        or the number of updates per generation batch (TRL `num_iterations`, verl
        `actor_rollout_ref.actor.ppo_epochs`). High side: clip-higher (TRL `epsilon_high=0.28`, verl
        `actor_rollout_ref.actor.clip_ratio_high=0.28`). Low side: lower the learning rate and check the
        advantages for outlier groups (CD201/CD501).
    """

    code = "CD508"
    reads: ClassVar[tuple[tuple[str, ...], ...]] = (
        (S.CLIP_RATIO, S.CLIP_RATIO_LOW, S.CLIP_RATIO_HIGH, S.CLIP_RATIO_DUAL),
    )
    name = "clip saturation"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_share": 0.2,
        "critical_share": 0.5,
        "asymmetry": 4.0,
        "min_side_share": 0.05,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        region = self.series(ctx, S.CLIP_RATIO)
        low = self.series(ctx, S.CLIP_RATIO_LOW)
        high = self.series(ctx, S.CLIP_RATIO_HIGH)
        findings = []
        if region is not None:
            found = self._saturation(ctx, region, low, high)
            if found is not None:
                findings.append(found)
        if low is not None and high is not None:
            found = self._asymmetry(ctx, low, high)
            if found is not None:
                findings.append(found)
        return findings

    def _rate(self, ctx: DetectionContext, values: np.ndarray) -> np.ndarray:
        # means from running sums, the rounding CD508's shares have always been judged with (bit for bit)
        return rolling(values, 2 * self.persistence(ctx, len(values)) + 1, how="mean", cumulative=True)

    @staticmethod
    def _sides(
        ctx: DetectionContext, low: TagPoints | None, high: TagPoints | None, first: int, last: int
    ) -> dict[str, float]:
        """The share each side clipped over the steps, and the dual clip's, those the log has."""
        dual = logged_series(ctx, S.CLIP_RATIO_DUAL)
        shares = {
            "low_side_share": mean_within(low, first, last),
            "high_side_share": mean_within(high, first, last),
            "dual_clip_share": mean_within(dual, first, last),
        }
        return {key: share for key, share in shares.items() if share is not None}

    def _saturation(
        self, ctx: DetectionContext, region: TagPoints, low: TagPoints | None, high: TagPoints | None
    ) -> Finding | None:
        steps, values = finite_points(region)
        share = self._rate(ctx, values)
        persist = self.persistence(ctx, len(values))
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return None
        part = ctx.window(stretch)
        level, peak = float(np.mean(values[part])), float(np.max(values[part]))
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        critical = level > ctx.threshold(self.code, "critical_share")
        tag = tag_of(ctx, S.CLIP_RATIO)
        evidence: dict[str, Any] = {"tag": tag, "share": level, "peak_share": peak}
        evidence |= self._sides(ctx, low, high, first, last)
        evidence |= support(len(values), stretch)
        sides = ""
        if "low_side_share" in evidence and "high_side_share" in evidence:
            sides = f" (low side {pct(evidence['low_side_share'])}, high side {pct(evidence['high_side_share'])})"
        return self.finding(
            ctx,
            stretch,
            steps=steps,
            severity=Severity.CRITICAL if critical else Severity.WARNING,
            title="most tokens are clipped by the trust region" if critical else "the trust region clips many tokens",
            message=(
                f"{pct(level)} of tokens were clipped (`{tag}`{sides}) over steps {first}-{last} "
                f"({stretch[1] - stretch[0] + 1} of {len(values)} points, peak {pct(peak)}): clipped tokens give no "
                "gradient, so that share of each update is thrown away and the policy moves as far as the trust "
                "region allows."
            ),
            evidence=evidence,
            remedy=Remedy(
                f"lower the learning rate ({LOWER_LR.frameworks}) or the updates per generation batch "
                f"({FEWER_ITERATIONS.frameworks}); widen the trust region (TRL `epsilon`/`epsilon_high`, verl "
                "`actor_rollout_ref.actor.clip_ratio_low`/`clip_ratio_high`) only on purpose",
                (LOWER_LR, FEWER_ITERATIONS),
            ),
        )

    def _asymmetry(self, ctx: DetectionContext, low: TagPoints, high: TagPoints) -> Finding | None:
        steps, ia, ib = np.intersect1d(low.steps, high.steps, return_indices=True)
        lo, hi = low.values[ia], high.values[ib]
        keep = np.isfinite(lo) & np.isfinite(hi)
        steps, lo, hi = steps[keep], lo[keep], hi[keep]
        if len(steps) < self.minimum(ctx):
            raise NotEnoughData(
                f"`{tag_of(ctx, S.CLIP_RATIO_LOW)}` and `{tag_of(ctx, S.CLIP_RATIO_HIGH)}` share {len(steps)} logged "
                f"step(s); {self.minimum(ctx)} are needed (min_points)"
            )
        lo_rate, hi_rate = self._rate(ctx, lo), self._rate(ctx, hi)
        ratio, floor = ctx.threshold(self.code, "asymmetry"), ctx.threshold(self.code, "min_side_share")
        persist = self.persistence(ctx, len(steps))
        for side, big, small, big_raw, small_raw in (
            ("high", hi_rate, lo_rate, hi, lo),
            ("low", lo_rate, hi_rate, lo, hi),
        ):
            stretch = persistent_onset((big > floor) & (big >= ratio * small), persist)
            if stretch is None:
                continue
            part = ctx.window(stretch)
            big_level, small_level = float(np.mean(big_raw[part])), float(np.mean(small_raw[part]))
            first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
            times = big_level / small_level if small_level > 0 else float("inf")
            times_text = f"{times:.1f}x" if math.isfinite(times) else "while the other side clipped none"
            if side == "high":
                meaning = (
                    "tokens with a positive advantage hit the upper bound: unlikely tokens cannot rise faster than "
                    "1 + epsilon_high per update, so exploration is starved"
                )
                remedy = Remedy(
                    f"clip-higher: raise the upper bound (TRL `{CLIP_HIGHER.trl}`, e.g. 0.28 as in DAPO; verl "
                    f"`{CLIP_HIGHER.verl}`), and watch the entropy (CD503/CD511)",
                    (CLIP_HIGHER,),
                )
            else:
                meaning = (
                    "tokens with a negative advantage hit the lower bound: the updates push them down faster than "
                    "the trust region allows"
                )
                remedy = Remedy(
                    f"lower the learning rate ({LOWER_LR.frameworks}) and check the advantages for outlier groups "
                    "(CD201, CD501)",
                    (LOWER_LR,),
                )
            return self.finding(
                ctx,
                stretch,
                steps=steps,
                severity=Severity.WARNING,
                title=f"clipping is one-sided ({side} side)",
                message=(
                    f"the {side} side clipped {pct(big_level)} of tokens against {pct(small_level)} on the other "
                    f"({times_text}; `{tag_of(ctx, S.CLIP_RATIO_LOW)}`, `{tag_of(ctx, S.CLIP_RATIO_HIGH)}`) over steps "
                    f"{first}-{last}: {meaning}."
                ),
                evidence={
                    "side": side,
                    "low_side_share": float(np.mean(lo[part])),
                    "high_side_share": float(np.mean(hi[part])),
                    "ratio": times,
                }
                | support(len(steps), stretch),
                remedy=remedy,
            )
        return None
