"""CD507: the score stopped improving long before the end of the log (scalar logs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.smoothing import rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, Severity, register
from collapse_doctor.judge.detectors.remedies import LOWER_LR, MORE_GENERATIONS, MORE_KL, Remedy, nanmedian
from collapse_doctor.judge.detectors.scalar_base import (
    ALPHA,
    ScalarDetector,
    level_points,
    tag_of,
    trend_evidence,
)
from collapse_doctor.judge.detectors.trends import level_noise, trend_test


@register
class RewardPlateau(ScalarDetector):
    """The score stopped improving: its best level was reached long before the end of the log (scalar logs).

    What it detects
        The held-out score when the log has one (TRL `eval_reward`, verl `val-core/.../mean@N`), else the
        training reward, smoothed (rolling median over the persistence window). The best step is the first
        point where the smoothed score came within its own noise floor of its best level; the finding says
        how much of the run came after it. It fires when at least `tail_share` of the logged steps came
        after the best step and the points since show no significant rise (Mann-Kendall, `alpha`, with a
        Theil-Sen change above the noise floor). It says whether the score rose to that level first (a
        plateau: information), never rose beyond its noise (no learning), or fell since (a regression).
        A series with the same value at every point has no noise floor and is left to CD501/CD504.

    Why it matters
        Steps after the best point cost compute and improve nothing; on a held-out score they may already
        overfit the training prompts. A score that fell since its best means the later checkpoints are worse
        than an earlier one: a warning. A score that rose and then levelled off is convergence or a plateau,
        and one that never rose beyond its noise is a run not learning from its reward (too hard, a broken
        reward, an update too small) or one resumed from a converged checkpoint, which the log cannot tell
        apart: both are information (stop the run, or change the data or the reward). Needs `min_points` (30)
        training points, or `min_eval_points` (8) held-out points to judge on the held-out score.

    Evidence
        The series judged and its raw tag, the best level and step, the early level and the level now, the
        noise floor, the share of the run after the best step, the Theil-Sen slope and Mann-Kendall z and
        p of the points since, and the points they rest on.

    Remedy
        Plateau: stop at the best checkpoint, or give the run harder prompts or a graded reward. No
        learning: check the reward function on real completions, then easier prompts, a higher learning
        rate (TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`) or more samples per prompt
        (TRL `num_generations`, verl `actor_rollout_ref.rollout.n`). Regression: keep the best checkpoint,
        lower the learning rate, or raise the KL coefficient (TRL `beta`, verl
        `actor_rollout_ref.actor.kl_loss_coef`).
    """

    code = "CD507"
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ((S.REWARD, S.EVAL_SCORE),)
    name = "reward plateau"
    default_severity = Severity.WARNING
    thresholds: ClassVar[Mapping[str, float]] = {
        "tail_share": 0.25,
        "min_tail_points": 6,
        "alpha": ALPHA,
        "min_points": 30,
        "min_eval_points": 8,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        name, note = S.EVAL_SCORE, ""
        found = self.optional(ctx, S.EVAL_SCORE, "min_eval_points")
        if found is None:
            if ctx.scalars is not None and S.EVAL_SCORE in ctx.scalars:
                few = int(np.count_nonzero(np.isfinite(ctx.scalars.series[S.EVAL_SCORE].values)))
                note = f" The held-out score (`{tag_of(ctx, S.EVAL_SCORE)}`) has only {few} point(s), too few to judge."
            name = S.REWARD
            found = self.series(ctx, S.REWARD)
        if found is None:
            return []
        steps, values = level_points(found)
        n, logged = len(values), int(np.count_nonzero(np.isfinite(found.values)))
        w = self.smoothing_window(ctx, n)
        smooth = rolling(values, w)
        noise = level_noise(values, w)
        if noise <= 0:
            return []  # the same value at every point: no noise floor to judge against (CD501/CD504 say why)
        peak = float(np.nanmax(smooth))
        best = int(np.flatnonzero(smooth >= peak - noise)[0])
        span = int(steps[-1] - steps[0])
        after = int(steps[-1] - steps[best])
        share = after / span if span > 0 else 0.0
        tail_points = n - best
        if share < ctx.threshold(self.code, "tail_share") or tail_points < ctx.threshold(self.code, "min_tail_points"):
            return []  # still improving near the end of the log
        alpha = self.alpha(ctx)
        since = trend_test(steps[best:], values[best:])
        if since.rising(alpha, noise):
            return []  # a slow climb: the smoothed best is within noise of a level still rising
        early = nanmedian(values[: max(w, math.ceil(0.1 * n))])
        now = nanmedian(values[-w:])
        gain = float(smooth[best]) - early
        held_out = name == S.EVAL_SCORE
        label = "held-out score" if held_out else "training reward"
        tag = tag_of(ctx, name)
        if now < peak - noise and since.falling(alpha, noise):
            kind, severity = "regression", Severity.WARNING
            title = f"{label} fell after its best step"
            what = f"and has fallen since to {now:.3g} (Mann-Kendall p={since.p_value:.2g})"
        elif gain <= noise:
            kind, severity = "no learning", Severity.INFO
            title = f"{label} did not improve over the run"
            what = (
                f"within its noise floor ({noise:.2g}) of its early level {early:.3g}: it did not learn (or began "
                "converged)"
            )
        else:
            kind, severity = "plateau", Severity.INFO
            title = f"{label} plateaued"
            what = f"after rising from {early:.3g}, and has not risen since (now {now:.3g})"
        message = (
            f"the {label} (`{tag}`, {logged} points) reached {float(smooth[best]):.3g} at step {int(steps[best])}, "
            f"{what}; {after} of the run's {span} logged steps ({pct(share)}) came after that step."
        )
        if not held_out:
            message += note or " The log has no held-out score, so this is judged on the training reward."
        faster = ChangeSetting("learning_rate", "raise")
        remedy = {
            "plateau": Remedy(
                "stop at the best checkpoint, or change the data or the reward (harder prompts, a graded reward)"
            ),
            "no learning": Remedy(
                f"check the reward function on real completions, then easier prompts, a higher learning rate "
                f"({faster.frameworks}) or more samples per prompt ({MORE_GENERATIONS.frameworks})",
                (faster, MORE_GENERATIONS),
            ),
            "regression": Remedy(
                f"keep the checkpoint of step {int(steps[best])}, lower the learning rate ({LOWER_LR.frameworks}) or "
                f"raise the KL coefficient ({MORE_KL.frameworks} with `use_kl_loss`)",
                (LOWER_LR, MORE_KL),
            ),
        }[kind]
        return [
            self.finding(
                ctx,
                (best, n - 1),
                steps=steps,
                severity=severity,
                title=title,
                message=message,
                evidence={
                    "series": name,
                    "tag": tag,
                    "kind": kind,
                    "best": float(smooth[best]),
                    "best_step": int(steps[best]),
                    "early": early,
                    "now": now,
                    "noise_floor": noise,
                    "share_after_best": share,
                    "steps_after_best": after,
                    "points": logged,
                    "judged_points": n,
                    "points_after_best": tail_points,
                }
                | trend_evidence("since_best", since),
                remedy=remedy,
            )
        ]
