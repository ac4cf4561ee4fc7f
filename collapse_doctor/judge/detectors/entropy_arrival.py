"""CD511: entropy still falling toward its floor while the reward has stopped rising (scalar logs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import rolling
from collapse_doctor.judge.detectors.base import POSITIVE, DetectionContext, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.entropy import ENTROPY_BONUS, EXPLORE
from collapse_doctor.judge.detectors.remedies import CLIP_HIGHER, HOTTER, Remedy, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    ALPHA,
    ScalarDetector,
    level_points,
    logged_series,
    points_within,
    tag_of,
    trend_evidence,
)
from collapse_doctor.judge.detectors.trends import level_noise, trend_test


@register
class EntropyArrival(ScalarDetector):
    """Entropy still falls toward its floor while the reward has stopped rising: when it will arrive (scalar logs).

    What it detects
        The logged token entropy (as CD503) over the last `fit_share` of its points, while it is still above
        its floor (`floor_ratio` of its early level, where CD503 reports a collapse). When those points fall
        significantly (Mann-Kendall, `alpha`, and a Theil-Sen change above the noise floor), a linear and a
        log-linear (exponential) decay are fitted to them and the better one (smaller squared error on the
        entropy itself) projects the step at which entropy reaches the floor; it fires when that step is
        within `horizon_ratio` times the logged span after the last point, and only while the training
        reward over the same points does not rise. Entropy falling while the reward still rises is
        convergence and is not reported. Needs `min_points` entropy points and `min_fit_points` reward
        points over the fitted stretch.

    Why it matters
        A falling entropy with a reward that no longer improves is an entropy collapse on its way: the
        policy is committing to fewer and fewer completions for no gain, and once it arrives the groups stop
        disagreeing and the advantages go to 0 (CD503). The projection says how many steps are left to act.

    Evidence
        The raw tag, early level, level now, the floor, the model kept (linear or log-linear) with both
        fits' R^2 and slopes, the projected step and the steps left, the Theil-Sen slope and Mann-Kendall z
        and p of the fitted points, the reward's trend over them, and the points they rest on.

    Remedy
        Raise the sampling temperature (TRL `temperature`, verl `actor_rollout_ref.rollout.temperature`),
        add an entropy bonus (TRL `entropy_coef`, verl `actor_rollout_ref.actor.entropy_coeff`), use
        clip-higher (TRL `epsilon_high`, verl `actor_rollout_ref.actor.clip_ratio_high`), or lower the
        learning rate; check whether one reward channel dominates (CD402).
    """

    code = "CD511"
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {"horizon_ratio": POSITIVE}
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.ENTROPY,),)
    name = "entropy arrival"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "floor_ratio": 0.3,
        "horizon_ratio": 1.0,
        "fit_share": 0.5,
        "min_fit_points": 10,
        "alpha": ALPHA,
        "min_points": 20,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = self.series(ctx, S.ENTROPY)
        if found is None:
            return []
        steps, values = level_points(found)
        relative = self.relative_to_early(ctx, values)
        if relative is None:
            return []
        early, _ = relative
        n, logged = len(values), int(np.count_nonzero(np.isfinite(found.values)))
        w = self.smoothing_window(ctx, n)
        floor = ctx.threshold(self.code, "floor_ratio") * early
        now = nanmedian(rolling(values, w)[-w:])
        if now <= floor:
            return []  # already at the floor: CD503 judges the collapse
        share = ctx.threshold(self.code, "fit_share")
        fit_points = max(self.minimum(ctx, "min_fit_points"), math.ceil(share * n))
        fit_steps, fit_values = steps[-fit_points:], values[-fit_points:]
        alpha = self.alpha(ctx)
        noise = level_noise(values, w)
        falling = trend_test(fit_steps, fit_values)
        if not falling.falling(alpha, noise):
            return []
        reward = logged_series(ctx, S.REWARD)
        if reward is None:
            raise NotEnoughData("no training reward series to tell convergence from collapse")
        r_steps, r_values = points_within(reward, float(fit_steps[0]), float(fit_steps[-1]))
        minimum = self.minimum(ctx, "min_fit_points")
        if len(r_values) < minimum:
            raise NotEnoughData(
                f"`{tag_of(ctx, S.REWARD)}` has {len(r_values)} point(s) over the fitted entropy stretch; {minimum} "
                "are needed (min_fit_points)"
            )
        reward_trend = trend_test(r_steps, r_values)
        reward_noise = level_noise(r_values, self.smoothing_window(ctx, len(r_values)))
        if reward_trend.rising(alpha, reward_noise):
            return []  # entropy falls while the reward rises: convergence
        fit = _decay_fits(fit_steps.astype(np.float64), fit_values, floor)
        if fit is None:
            return []
        model, projected, fits = fit
        last, span = int(steps[-1]), int(steps[-1] - steps[0])
        left = projected - last
        if left <= 0 or left > ctx.threshold(self.code, "horizon_ratio") * span:
            return []
        tag = tag_of(ctx, S.ENTROPY)
        arrival = round(projected)
        return [
            self.finding(
                ctx,
                (0, len(fit_steps) - 1),
                steps=fit_steps,
                severity=Severity.WARNING,
                title=f"entropy will reach its floor around step {arrival}",
                message=(
                    f"entropy (`{tag}`, {logged} points) fell from {early:.3g} early in the run to {now:.3g} "
                    f"({pct(now / early)} of its early level) and is still falling (Mann-Kendall p="
                    f"{falling.p_value:.2g} over its last {len(fit_values)} points); a {model} fit (R^2 "
                    f"{fits[model]['r2']:.2f}) projects it to reach its floor {floor:.3g} ({pct(floor / early)} of "
                    f"its early level, where CD503 reports a collapse) around step {arrival}, {round(left)} "
                    f"steps after the last logged one, while the training reward (`{tag_of(ctx, S.REWARD)}`) over "
                    f"the same steps did not rise (change {reward_trend.change:+.3g}, p={reward_trend.p_value:.2g})."
                ),
                evidence={
                    "tag": tag,
                    "early": early,
                    "now": now,
                    "floor": floor,
                    "model": model,
                    "projected_step": projected,
                    "steps_left": left,
                    "linear_r2": fits["linear"]["r2"],
                    "linear_slope": fits["linear"]["slope"],
                    "log_linear_r2": fits["log-linear"]["r2"],
                    "log_linear_rate": fits["log-linear"]["slope"],
                    "points": logged,
                    "fit_points": len(fit_values),
                }
                | trend_evidence("entropy", falling)
                | trend_evidence("reward", reward_trend),
                remedy=Remedy(
                    f"raise the sampling temperature ({HOTTER.frameworks}), add an entropy bonus "
                    f"({ENTROPY_BONUS.frameworks}), use clip-higher ({CLIP_HIGHER.frameworks}) or lower the "
                    "learning rate; check whether one reward channel dominates (CD402)",
                    EXPLORE,
                ),
            )
        ]


def _decay_fits(
    steps: np.ndarray, values: np.ndarray, floor: float
) -> tuple[str, float, dict[str, dict[str, float]]] | None:
    """Linear and log-linear least-squares fits of a decay, the better one (squared error on the values
    themselves) and the step it reaches ``floor``; ``None`` when the better fit does not decay.

    >>> t = np.arange(50.0)
    >>> model, step, _ = _decay_fits(t, 0.8 * np.exp(-t / 40), 0.8 * np.exp(-2.0))
    >>> model, round(step, 3)
    ('log-linear', 80.0)
    """
    total = float(np.sum((values - values.mean()) ** 2)) or 1e-300
    b, a = np.polyfit(steps, values, 1)
    fits: dict[str, dict[str, float]] = {
        "linear": {"slope": float(b), "r2": 1 - float(np.sum((values - (a + b * steps)) ** 2)) / total}
    }
    projected = {"linear": (floor - a) / b if b < 0 else float("inf")}
    positive = values > 0
    if positive.all():
        d, c = np.polyfit(steps, np.log(values), 1)
        fits["log-linear"] = {"slope": float(d), "r2": 1 - float(np.sum((values - np.exp(c + d * steps)) ** 2)) / total}
        projected["log-linear"] = (math.log(floor) - c) / d if d < 0 else float("inf")
    else:
        fits["log-linear"] = {"slope": float("nan"), "r2": float("-inf")}
        projected["log-linear"] = float("inf")
    model = max(fits, key=lambda m: fits[m]["r2"])
    if not math.isfinite(projected[model]):
        return None
    return model, float(projected[model]), fits
