"""CD510: the training reward rising while the held-out score stays flat or falls (scalar logs).

A held-out score is logged on its own cadence (every ``eval_steps``): it is never interpolated onto the training
steps. Each held-out point is paired with the median of the training points logged since the previous held-out
point (real values only; a held-out point with none is left out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import join_remedies, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    ALPHA,
    MIN_POINTS,
    ScalarDetector,
    finite_points,
    points_within,
    tag_of,
    trend_evidence,
)
from collapse_doctor.judge.detectors.trends import kendall_tau, level_noise, trend_test


def paired_training(train: TagPoints, held_out_steps: np.ndarray) -> np.ndarray:
    """For each held-out step, the median of the training points logged since the previous held-out step (NaN
    where there is none): real logged values over the same interval, never an interpolation.

    >>> train = TagPoints(np.arange(1, 9), np.arange(1.0, 9.0))
    >>> paired_training(train, np.array([2, 5, 8, 12])).tolist()
    [1.5, 4.0, 7.0, nan]
    """
    steps, values = finite_points(train)
    held = np.asarray(held_out_steps, dtype=np.float64)
    first_gap = float(held[1] - held[0]) if len(held) > 1 else np.inf
    previous = np.concatenate([[held[0] - first_gap], held[:-1]]) if len(held) else held
    lo = np.searchsorted(steps, previous, side="right")  # steps are sorted: each interval is one slice
    hi = np.searchsorted(steps, held, side="right")
    out = np.full(len(held), np.nan)
    for k in np.flatnonzero(hi > lo).tolist():
        out[k] = float(np.median(values[lo[k] : hi[k]]))
    return out


@register
class RewardEvalDivergence(ScalarDetector):
    """The training reward rises while the held-out score stays flat or falls: the shape of reward hacking.

    What it detects
        The training reward against a held-out score (TRL `eval_reward`, verl `val-core/.../mean@N` or
        `val/test_score/...`) over the steps both cover. Each series' trend is tested on its own points
        (Mann-Kendall, `alpha`, and a Theil-Sen change above its own noise floor); each held-out point is
        paired with the median training reward logged since the previous held-out point, for Kendall's tau
        and for the gap between the two (training minus held-out: both are the run's reward functions, on
        training and on held-out prompts). It fires when the training reward rises, the held-out score
        does not, the gap widens significantly (Mann-Kendall), and tau stays below `max_tau`. Needs
        `min_eval_points` paired held-out points.

    Why it matters
        A reward that rises while the held-out score does not is the policy learning what the reward
        function pays for rather than the task: a format trick, a length exploit, a grader loophole. A
        held-out score that falls meanwhile means every further step makes the model worse (critical). The
        training curve alone looks like success.

    Evidence
        Both raw tags, the Theil-Sen slope, change and Mann-Kendall z and p of each series, Kendall's tau of
        the pairs, the gap's slope and p-value, the held-out level at its best and now, and the points they
        rest on (held-out points, pairs, training points).

    Remedy
        Read the highest-reward completions first: `collapse-doctor report` shows example groups with their
        completions when the run has rollouts (TRL `log_completions=True`, verl `trainer.rollout_data_dir`).
        Then close the loophole in the reward function, add the held-out check as a reward channel, keep
        the checkpoint at the held-out best, and hold the policy closer to the reference (TRL `beta`, verl
        `actor_rollout_ref.actor.kl_loss_coef`).
    """

    code = "CD510"
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {"max_tau": ThresholdRange(-1.0, 1.0)}
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.EVAL_SCORE,), (S.REWARD,))
    name = "reward/eval divergence"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "max_tau": 0.5,
        "alpha": ALPHA,
        "min_eval_points": 8,
        "min_points": MIN_POINTS,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        if ctx.scalars is None or S.EVAL_SCORE not in ctx.scalars:
            return []  # nothing held out to compare with
        held = self.series(ctx, S.EVAL_SCORE, "min_eval_points")
        train = self.series(ctx, S.REWARD)
        if held is None or train is None:
            return []
        h_steps, h_values = finite_points(held)
        t_steps, _ = finite_points(train)
        first, last = max(float(h_steps[0]), float(t_steps[0])), min(float(h_steps[-1]), float(t_steps[-1]))
        keep = (h_steps >= first) & (h_steps <= last)
        h_steps, h_values = h_steps[keep], h_values[keep]
        paired = paired_training(train, h_steps)
        ok = np.isfinite(paired)
        pairs = int(ok.sum())
        minimum = self.minimum(ctx, "min_eval_points")
        if pairs < minimum:
            raise NotEnoughData(
                f"{pairs} held-out point(s) of `{tag_of(ctx, S.EVAL_SCORE)}` have training points logged over the same "
                f"steps; {minimum} are needed (min_eval_points)"
            )
        alpha = self.alpha(ctx)
        t_in_steps, t_in_values = points_within(train, first, last)
        train_trend = trend_test(t_in_steps, t_in_values)
        train_noise = level_noise(t_in_values, self.smoothing_window(ctx, len(t_in_values)))
        held_trend = trend_test(h_steps, h_values)
        held_noise = level_noise(h_values, max(2, len(h_values) // 4))
        if not train_trend.rising(alpha, train_noise):
            return []  # the training reward does not rise: nothing to diverge from
        if held_trend.rising(alpha, held_noise):
            return []  # the held-out score rises with it
        a, b = paired[ok], h_values[ok]
        tau = kendall_tau(a, b)
        gap_trend = trend_test(h_steps[ok], a - b)
        if not (gap_trend.z > 0 and gap_trend.p_value < alpha):
            return []
        if np.isfinite(tau) and tau >= ctx.threshold(self.code, "max_tau"):
            return []  # the two still move together point by point
        falling = held_trend.falling(alpha, held_noise)
        smooth = rolling(h_values, 3)
        best = int(np.argmax(smooth))
        held_now = nanmedian(h_values[-max(2, len(h_values) // 4) :])
        train_tag, held_tag = tag_of(ctx, S.REWARD), tag_of(ctx, S.EVAL_SCORE)
        how = "fell" if falling else "stayed flat"
        tau_text = f"{tau:.2f}" if np.isfinite(tau) else "undefined (a constant series)"
        return [
            self.finding(
                ctx,
                (best, len(h_steps) - 1),
                steps=h_steps,
                severity=Severity.CRITICAL if falling else Severity.WARNING,
                title=f"training reward rises while the held-out score {'falls' if falling else 'stays flat'}",
                message=(
                    f"between steps {int(first)} and {int(last)} the training reward (`{train_tag}`, "
                    f"{train_trend.points} points) rose by {train_trend.change:.3g} (Mann-Kendall p="
                    f"{train_trend.p_value:.2g}) while the held-out score (`{held_tag}`, {len(h_values)} points) "
                    f"{how} (change {held_trend.change:+.3g}, p={held_trend.p_value:.2g}; best "
                    f"{float(smooth[best]):.3g} at step {int(h_steps[best])}, now {held_now:.3g}). Over {pairs} "
                    f"paired points Kendall's tau is {tau_text} and the gap widens (p={gap_trend.p_value:.2g}): "
                    "the shape of reward hacking."
                ),
                evidence={
                    "train_tag": train_tag,
                    "held_out_tag": held_tag,
                    "kendall_tau": tau,
                    "held_out_best": float(smooth[best]),
                    "held_out_best_step": int(h_steps[best]),
                    "held_out_now": held_now,
                    "held_out_noise_floor": held_noise,
                    "train_noise_floor": train_noise,
                    "pairs": pairs,
                    "held_out_points": len(h_values),
                }
                | trend_evidence("train", train_trend)
                | trend_evidence("held_out", held_trend)
                | trend_evidence("gap", gap_trend),
                remedy=join_remedies(
                    "read the highest-reward completions first: `collapse-doctor report RUN --html report.html` shows "
                    "example groups with their completions"
                    + (
                        ""
                        if ctx.run.rollouts
                        else " once the run logs them (TRL `log_completions=True`, verl `trainer.rollout_data_dir`)"
                    ),
                    "close the loophole in the reward function, or add the held-out check as a reward channel",
                    f"keep the checkpoint of step {int(h_steps[best])} (the held-out best)",
                    "hold the policy closer to the reference (TRL `beta`, verl `actor_rollout_ref.actor.kl_loss_coef` "
                    "with `use_kl_loss`)",
                ),
            )
        ]
