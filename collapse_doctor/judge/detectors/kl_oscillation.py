"""CD502: the KL to the reference policy swinging more and more while it climbs (scalar logs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.smoothing import persistent_onset, rolling
from collapse_doctor.judge.detectors.base import POSITIVE, DetectionContext, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import LOWER_LR, MORE_KL, Remedy, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    MIN_POINTS,
    ScalarDetector,
    support,
    tag_of,
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
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {"min_swing": POSITIVE}
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.KL,),)
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
                    f"KL (`{tag_of(ctx, S.KL)}`, {n} points) rose from {early_level:.3g} to {late_level:.3g} and "
                    f"its step-to-step swings grew from {early_swing:.2g} to {late_swing:.2g} of its level from "
                    f"step {int(found.steps[stretch[0]])} on."
                ),
                evidence={
                    "tag": tag_of(ctx, S.KL),
                    "kl_early": early_level,
                    "kl_late": late_level,
                    "relative_swing_early": early_swing,
                    "relative_swing_late": late_swing,
                }
                | support(len(found.steps), stretch),
                remedy=Remedy(
                    "lower the learning rate or raise the KL coefficient, clip advantages, and check the "
                    "advantage std (CD501) and the reward channels for outliers",
                    (LOWER_LR, MORE_KL),
                ),
            )
        ]
