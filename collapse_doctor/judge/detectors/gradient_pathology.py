"""CD509: gradient norms that are non-finite, vanish, or spike again and again (scalar logs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import persistent_onset, rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import LOWER_LR, Remedy, join_remedies
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ZERO,
    ScalarDetector,
    extremes,
    finite_points,
    holds_at_end,
    level_points,
    logged_series,
    nonfinite_points,
    support,
    tag_of,
)
from collapse_doctor.judge.detectors.trends import robust_z

SPIKE_WINDOW = 21
"""Points in the rolling median a gradient-norm spike is measured against (a spike is a local event)."""

CLIP_HARDER = ChangeSetting("max_grad_norm", "lower")
"""Clip gradients harder: a lower norm bound keeps one spiking batch from moving the policy far."""


@register
class GradientPathology(ScalarDetector):
    """Gradient norms that are non-finite, vanish, or spike again and again (scalar logs).

    What it detects
        The logged gradient norm (TRL `grad_norm`, verl `actor/grad_norm`, NeMo-RL `grad_norm`), three ways.
        Non-finite: points the log carried as NaN or infinity (a step with no logged value is "not logged",
        never NaN). Vanishing: the smoothed norm below `vanish_ratio` of its early level, from a sustained
        stretch to the end of the log. Spikes: points more than `spike_mads` robust deviations (MAD of the
        log norm around its rolling median) and `spike_ratio` times above the local median, at least
        `min_spikes` times (the local median over 21 points). Needs `min_points` finite points for the last two.

    Why it matters
        A non-finite norm means a step whose update is NaN or was skipped: critical when the log ends in
        them (the run has diverged), information when a few isolated ones are fp16 loss-scale skips. A
        norm that vanishes means the updates stop moving the policy (no advantage left, or a dead loss):
        critical when it is exactly 0. Recurring spikes mean a few batches dominate the updates (outlier
        advantages, a learning rate too high for the batch) and often precede a divergence.

    Evidence
        The raw tag, the non-finite count, share and steps, the early level and the level now with the
        ratio, the spike count, steps and largest ratio to the local median, the band, and the points they
        rest on.

    Remedy
        Non-finite: resume from the last finite checkpoint with a lower learning rate (TRL `learning_rate`,
        verl `actor_rollout_ref.actor.optim.lr`), gradient clipping (TRL `max_grad_norm`, verl
        `actor_rollout_ref.actor.grad_clip`) and bf16 instead of fp16. Vanishing: check the zero-advantage
        share (CD504) and the loss. Spikes: clip gradients harder, lower the learning rate, and look at the
        spike steps' groups for outlier rewards.
    """

    code = "CD509"
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.GRAD_NORM,),)
    name = "gradient pathology"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "vanish_ratio": 0.05,
        "spike_mads": 6.0,
        "spike_ratio": 3.0,
        "min_spikes": 3,
        "info_nonfinite_share": 0.01,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = logged_series(ctx, S.GRAD_NORM)
        if found is None:
            return []
        findings = []
        nonfinite = self._nonfinite(ctx, found)
        if nonfinite is not None:
            findings.append(nonfinite)
        finite = int(np.count_nonzero(np.isfinite(found.values)))
        if finite < self.minimum(ctx):
            if findings:
                return findings  # the non-finite points are reported; too few finite ones for the rest
            self.series(ctx, S.GRAD_NORM)  # raises NotEnoughData
        vanishing = self._vanishing(ctx, *level_points(found), points=finite)
        spikes = self._spikes(ctx, *finite_points(extremes(found)))
        return findings + [one for one in (vanishing, spikes) if one is not None]

    def _nonfinite(self, ctx: DetectionContext, found: TagPoints) -> Finding | None:
        counts, nans = nonfinite_points(found)
        bad = counts > 0
        count = int(counts.sum())
        if not count:
            return None
        n = found.logged
        where = np.flatnonzero(bad)
        persist = self.persistence(ctx, len(bad))
        at_end = bool(bad[-1]) or holds_at_end(bad, persist)
        share = count / n
        nan_count = int(nans.sum())
        tag = tag_of(ctx, S.GRAD_NORM)
        first_steps = [int(s) for s in found.steps[where[:10]]]
        if at_end:
            severity, title = Severity.CRITICAL, "gradient norm is non-finite at the end of the log"
            tail = "the log ends in them: the run has diverged."
        elif share <= ctx.threshold(self.code, "info_nonfinite_share"):
            severity, title = Severity.INFO, "a few gradient norms are non-finite"
            tail = "isolated, and finite again after: fp16 loss scaling skips such steps."
        else:
            severity, title = Severity.WARNING, "gradient norms are non-finite at many steps"
            tail = "those updates are NaN or were skipped."
        return self.finding(
            ctx,
            (int(where[0]), int(where[-1])),
            steps=found.steps,
            recovered=None,  # graded by where the events are (at the end or not), not by the current window
            severity=severity,
            title=title,
            message=(
                f"`{tag}` was logged as NaN or infinite at {count} of its {n} logged points ({pct(share)}; first at "
                f"step(s) {', '.join(map(str, first_steps))}); {tail}"
            ),
            evidence={
                "tag": tag,
                "kind": "non-finite",
                "nonfinite_points": count,
                "nan_points": nan_count,
                "inf_points": count - nan_count,
                "nonfinite_share": share,
                "nonfinite_steps": first_steps,
                "points": n,
            },
            remedy=Remedy(
                "resume from the last checkpoint before the first non-finite step with a lower learning rate "
                f"({LOWER_LR.frameworks}), gradient clipping ({CLIP_HARDER.frameworks}) and bf16 rather than fp16",
                (LOWER_LR, CLIP_HARDER),
            ),
        )

    def _vanishing(
        self, ctx: DetectionContext, steps: np.ndarray, values: np.ndarray, *, points: int
    ) -> Finding | None:
        relative = self.relative_to_early(ctx, values)
        if relative is None:
            return None
        early, ratio = relative
        persist = self.persistence(ctx, len(values))
        low = ratio < ctx.threshold(self.code, "vanish_ratio")
        stretch = persistent_onset(low, persist)
        if stretch is None or not holds_at_end(low, persist):
            return None
        now = self.settled_level(values, stretch, persist)
        exact_zero = now <= ZERO * early
        first = int(steps[stretch[0]])
        tag = tag_of(ctx, S.GRAD_NORM)
        return self.finding(
            ctx,
            stretch,
            steps=steps,
            severity=Severity.CRITICAL if exact_zero else Severity.WARNING,
            title="gradient norm is 0: no update" if exact_zero else "gradient norm vanished",
            message=(
                f"`{tag}` ({points} points) fell from {early:.3g} early in the run to {now:.3g} "
                f"({pct(now / early)}) from step {first} on, and stayed there: "
                + ("the updates change nothing." if exact_zero else "the updates barely move the policy.")
            ),
            evidence={
                "tag": tag,
                "kind": "vanishing",
                "early": early,
                "now": now,
                "ratio": now / early,
            }
            | support(points, stretch),
            remedy=join_remedies(
                "check the zero-advantage share (CD504) and the reward spread (CD501): no advantage, no gradient",
                "check the loss and the learning-rate schedule (TRL `learning_rate`, verl "
                "`actor_rollout_ref.actor.optim.lr`)",
            ),
        )

    def _spikes(self, ctx: DetectionContext, steps: np.ndarray, values: np.ndarray) -> Finding | None:
        positive = values > 0
        if int(positive.sum()) < self.minimum(ctx):
            return None
        log_norm = np.where(positive, np.log(np.where(positive, values, 1.0)), np.nan)
        baseline = rolling(log_norm, SPIKE_WINDOW)
        z, scale = robust_z(log_norm, baseline)
        with np.errstate(invalid="ignore"):
            spike = (
                (z > ctx.threshold(self.code, "spike_mads"))
                & (log_norm - baseline >= math.log(ctx.threshold(self.code, "spike_ratio")))
                & positive
            )
        count = int(np.count_nonzero(spike))
        if count < self.minimum(ctx, "min_spikes"):
            return None
        where = np.flatnonzero(spike)
        ratios = np.exp(log_norm[where] - baseline[where])
        tag = tag_of(ctx, S.GRAD_NORM)
        spike_steps = [int(s) for s in steps[where[:10]]]
        return self.finding(
            ctx,
            (int(where[0]), int(where[-1])),
            steps=steps,
            recovered=None,  # repeated one-off events: their count grades them, not the current window
            severity=Severity.WARNING,
            title="gradient norm spikes again and again",
            message=(
                f"`{tag}` jumped to {float(np.max(ratios)):.3g}x its local median at {count} of {len(values)} points "
                f"(step(s) {', '.join(map(str, spike_steps))}{', ...' if count > len(spike_steps) else ''}), each "
                f"beyond {ctx.threshold(self.code, 'spike_mads'):g} robust deviations of its usual variation: a few "
                "batches dominate the updates."
            ),
            evidence={
                "tag": tag,
                "kind": "spikes",
                "spikes": count,
                "spike_steps": spike_steps,
                "largest_ratio": float(np.max(ratios)),
                "median_ratio": float(np.median(ratios)),
                "log_norm_mad_sigma": scale,
                "points": len(values),
            },
            remedy=Remedy(
                f"clip gradients harder ({CLIP_HARDER.frameworks}), lower the learning rate ({LOWER_LR.frameworks}), "
                "and look at the spike steps' groups for outlier rewards (CD201, CD501)",
                (CLIP_HARDER, LOWER_LR),
            ),
        )
