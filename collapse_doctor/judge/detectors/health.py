"""CD507-CD511: the rest of a run's health from its scalar log (plateau, clipping, gradients, held-out score, entropy).

Like CD501-CD506 these read the canonical scalar series (:mod:`collapse_doctor.core.scalars`), each on its own steps.
A held-out score is logged on its own cadence (every ``eval_steps``): it is never interpolated onto the training
steps. Where two series are compared point by point, each held-out point is paired with the median of the training
points logged since the previous held-out point (real values only; a held-out point with none is left out).

Trends are judged with robust statistics (:mod:`collapse_doctor.judge.detectors.trends`): a Mann-Kendall test in point
order and the Theil-Sen change over the stretch, which must exceed the series' own noise floor (from its
point-to-point changes). A series with fewer points than the stated minimum is "not enough data to judge". A scalar
log holds no completions: these findings leave ``gdpo_resolves`` unset and propose no aggregation change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import persistent_onset, rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Finding, NotEnoughData, Severity, register
from collapse_doctor.judge.detectors.remedies import join_remedies, nanmedian
from collapse_doctor.judge.detectors.scalars import MIN_POINTS, ZERO, ScalarDetector, holds_at_end
from collapse_doctor.judge.detectors.trends import TrendTest, kendall_tau, level_noise, robust_z, thin, trend_test

ALPHA = 0.05
"""Default significance level of the Mann-Kendall tests."""
SPIKE_WINDOW = 21
LEVEL_POINTS = 4000
"""Levels and trends of longer series are judged on this many bin medians (a log of millions of points smooths in
seconds; persistence is a share of the points either way). Spikes and non-finite values are counted on every point."""
"""Points in the rolling median a gradient-norm spike is measured against (a spike is a local event)."""


def _tag(ctx: DetectionContext, name: str) -> str:
    return ctx.scalars.tags.get(name, name) if ctx.scalars is not None else name


def _finite(found: TagPoints) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(found.values)
    return found.steps[keep], found.values[keep]


def _levels(found: TagPoints) -> tuple[np.ndarray, np.ndarray]:
    """The finite points, as bin medians when there are more than :data:`LEVEL_POINTS`."""
    steps, values = thin(found.steps, found.values, LEVEL_POINTS)
    return steps.astype(np.int64) if len(steps) == len(found.steps) else steps, values


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving mean over ``window`` values (made odd; the window shrinks at the edges), by cumulative sums.

    >>> moving_mean(np.array([0.0, 3.0, 0.0, 3.0]), 3).tolist()
    [1.5, 1.0, 2.0, 1.5]
    """
    data = np.asarray(values, dtype=np.float64)
    n, half = len(data), max(0, int(window) // 2)
    sums = np.concatenate([[0.0], np.cumsum(data)])
    index = np.arange(n)
    lo, hi = np.maximum(0, index - half), np.minimum(n, index + half + 1)
    return np.asarray((sums[hi] - sums[lo]) / (hi - lo), dtype=np.float64)


def _within(found: TagPoints, first: float, last: float) -> tuple[np.ndarray, np.ndarray]:
    steps, values = _finite(found)
    keep = (steps >= first) & (steps <= last)
    return steps[keep], values[keep]


def _trend_evidence(prefix: str, test: TrendTest) -> dict[str, float | int]:
    return {
        f"{prefix}_theil_sen_slope": test.slope,
        f"{prefix}_change": test.change,
        f"{prefix}_mann_kendall_z": test.z,
        f"{prefix}_mann_kendall_p": test.p_value,
        f"{prefix}_points": test.points,
    }


class HealthDetector(ScalarDetector):
    """Shared helpers: a series with its own minimum, its smoothing window and noise floor."""

    def points(self, ctx: DetectionContext, name: str, minimum_key: str = "min_points") -> TagPoints | None:
        """The series (``None`` when not logged); fewer finite points than ``minimum_key`` is not enough data."""
        found = ctx.scalars.get(name) if ctx.scalars is not None else None
        if found is None:
            return None
        minimum = int(ctx.threshold(self.code, minimum_key))
        points = int(np.count_nonzero(np.isfinite(found.values)))
        if points < minimum:
            tag = _tag(ctx, name)
            raise NotEnoughData(f"`{tag}` has {points} logged point(s); {minimum} are needed ({minimum_key})")
        return found

    def optional_points(self, ctx: DetectionContext, name: str, minimum_key: str = "min_points") -> TagPoints | None:
        """The series when it has at least ``minimum_key`` finite points, else ``None`` (no error)."""
        found = ctx.scalars.get(name) if ctx.scalars is not None else None
        if found is None or np.count_nonzero(np.isfinite(found.values)) < int(ctx.threshold(self.code, minimum_key)):
            return None
        return found

    def window(self, ctx: DetectionContext, n: int) -> int:
        """An odd smoothing window of about the persistence window (at least 3 points)."""
        return max(3, self.persistence(ctx, n)) | 1

    def alpha(self, ctx: DetectionContext) -> float:
        return float(ctx.threshold(self.code, "alpha"))


@register
class RewardPlateau(HealthDetector):
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
        found = self.optional_points(ctx, S.EVAL_SCORE, "min_eval_points")
        if found is None:
            if ctx.scalars is not None and S.EVAL_SCORE in ctx.scalars:
                few = int(np.count_nonzero(np.isfinite(ctx.scalars.series[S.EVAL_SCORE].values)))
                note = f" The held-out score (`{_tag(ctx, S.EVAL_SCORE)}`) has only {few} point(s), too few to judge."
            name = S.REWARD
            found = self.points(ctx, S.REWARD)
        if found is None:
            return []
        steps, values = _levels(found)
        n, logged = len(values), int(np.count_nonzero(np.isfinite(found.values)))
        w = self.window(ctx, n)
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
        tag = _tag(ctx, name)
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
        remedy = {
            "plateau": (
                "stop at the best checkpoint, or change the data or the reward (harder prompts, a graded reward)"
            ),
            "no learning": (
                "check the reward function on real completions, then easier prompts, a higher learning rate "
                "(TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`) or more samples per prompt "
                "(TRL `num_generations`, verl `actor_rollout_ref.rollout.n`)"
            ),
            "regression": (
                f"keep the checkpoint of step {int(steps[best])}, lower the learning rate (TRL `learning_rate`, verl "
                "`actor_rollout_ref.actor.optim.lr`) or raise the KL coefficient (TRL `beta`, verl "
                "`actor_rollout_ref.actor.kl_loss_coef` with `use_kl_loss`)"
            ),
        }[kind]
        return [
            Finding(
                code=self.code,
                severity=severity,
                title=title,
                message=message,
                onset_step=int(steps[best]),
                step_range=(int(steps[best]), int(steps[-1])),
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
                | _trend_evidence("since_best", since),
                remedy=remedy,
            )
        ]


@register
class ClipSaturation(HealthDetector):
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
        region = self.points(ctx, S.CLIP_RATIO)
        low = self.points(ctx, S.CLIP_RATIO_LOW)
        high = self.points(ctx, S.CLIP_RATIO_HIGH)
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
        return moving_mean(values, 2 * self.persistence(ctx, len(values)) + 1)

    def _sides(self, low: TagPoints | None, high: TagPoints | None, first: int, last: int) -> dict[str, float]:
        out = {}
        for key, found in (("low_side_share", low), ("high_side_share", high)):
            if found is not None:
                _, inside = _within(found, first, last)
                if len(inside):
                    out[key] = float(np.mean(inside))
        return out

    def _saturation(
        self, ctx: DetectionContext, region: TagPoints, low: TagPoints | None, high: TagPoints | None
    ) -> Finding | None:
        steps, values = _finite(region)
        share = self._rate(ctx, values)
        persist = self.persistence(ctx, len(values))
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return None
        part = slice(stretch[0], stretch[1] + 1)
        level, peak = float(np.mean(values[part])), float(np.max(values[part]))
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        critical = level > ctx.threshold(self.code, "critical_share")
        tag = _tag(ctx, S.CLIP_RATIO)
        evidence: dict[str, Any] = {"tag": tag, "share": level, "peak_share": peak}
        evidence |= self._sides(low, high, first, last)
        dual = ctx.scalars.get(S.CLIP_RATIO_DUAL) if ctx.scalars is not None else None
        if dual is not None:
            _, inside = _within(dual, first, last)
            if len(inside):
                evidence["dual_clip_share"] = float(np.mean(inside))
        evidence |= {"points": len(values), "stretch_points": stretch[1] - stretch[0] + 1}
        sides = ""
        if "low_side_share" in evidence and "high_side_share" in evidence:
            sides = f" (low side {pct(evidence['low_side_share'])}, high side {pct(evidence['high_side_share'])})"
        return Finding(
            code=self.code,
            severity=Severity.CRITICAL if critical else Severity.WARNING,
            title="most tokens are clipped by the trust region" if critical else "the trust region clips many tokens",
            message=(
                f"{pct(level)} of tokens were clipped (`{tag}`{sides}) over steps {first}-{last} "
                f"({stretch[1] - stretch[0] + 1} of {len(values)} points, peak {pct(peak)}): clipped tokens give no "
                "gradient, so that share of each update is thrown away and the policy moves as far as the trust "
                "region allows."
            ),
            onset_step=first,
            step_range=(first, last),
            evidence=evidence,
            remedy=(
                "lower the learning rate (TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`) or the "
                "updates per generation batch (TRL `num_iterations`, verl `actor_rollout_ref.actor.ppo_epochs`); "
                "widen the trust region (TRL `epsilon`/`epsilon_high`, verl `actor_rollout_ref.actor.clip_ratio_low`"
                "/`clip_ratio_high`) only on purpose"
            ),
        )

    def _asymmetry(self, ctx: DetectionContext, low: TagPoints, high: TagPoints) -> Finding | None:
        steps, ia, ib = np.intersect1d(low.steps, high.steps, return_indices=True)
        lo, hi = low.values[ia], high.values[ib]
        keep = np.isfinite(lo) & np.isfinite(hi)
        steps, lo, hi = steps[keep], lo[keep], hi[keep]
        if len(steps) < int(ctx.threshold(self.code, "min_points")):
            raise NotEnoughData(
                f"`{_tag(ctx, S.CLIP_RATIO_LOW)}` and `{_tag(ctx, S.CLIP_RATIO_HIGH)}` share {len(steps)} logged "
                f"step(s); {int(ctx.threshold(self.code, 'min_points'))} are needed (min_points)"
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
            part = slice(stretch[0], stretch[1] + 1)
            big_level, small_level = float(np.mean(big_raw[part])), float(np.mean(small_raw[part]))
            first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
            times = big_level / small_level if small_level > 0 else float("inf")
            times_text = f"{times:.1f}x" if math.isfinite(times) else "while the other side clipped none"
            if side == "high":
                meaning = (
                    "tokens with a positive advantage hit the upper bound: unlikely tokens cannot rise faster than "
                    "1 + epsilon_high per update, so exploration is starved"
                )
                remedy = (
                    "clip-higher: raise the upper bound (TRL `epsilon_high`, e.g. 0.28 as in DAPO; verl "
                    "`actor_rollout_ref.actor.clip_ratio_high`), and watch the entropy (CD503/CD511)"
                )
            else:
                meaning = (
                    "tokens with a negative advantage hit the lower bound: the updates push them down faster than "
                    "the trust region allows"
                )
                remedy = (
                    "lower the learning rate (TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`) and check "
                    "the advantages for outlier groups (CD201, CD501)"
                )
            return Finding(
                code=self.code,
                severity=Severity.WARNING,
                title=f"clipping is one-sided ({side} side)",
                message=(
                    f"the {side} side clipped {pct(big_level)} of tokens against {pct(small_level)} on the other "
                    f"({times_text}; `{_tag(ctx, S.CLIP_RATIO_LOW)}`, `{_tag(ctx, S.CLIP_RATIO_HIGH)}`) over steps "
                    f"{first}-{last}: {meaning}."
                ),
                onset_step=first,
                step_range=(first, last),
                evidence={
                    "side": side,
                    "low_side_share": float(np.mean(lo[part])),
                    "high_side_share": float(np.mean(hi[part])),
                    "ratio": times,
                    "points": len(steps),
                    "stretch_points": stretch[1] - stretch[0] + 1,
                },
                remedy=remedy,
            )
        return None


@register
class GradientPathology(HealthDetector):
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
        found = ctx.scalars.get(S.GRAD_NORM) if ctx.scalars is not None else None
        if found is None:
            return []
        findings = []
        nonfinite = self._nonfinite(ctx, found)
        if nonfinite is not None:
            findings.append(nonfinite)
        finite = int(np.count_nonzero(np.isfinite(found.values)))
        if finite < int(ctx.threshold(self.code, "min_points")):
            if findings:
                return findings  # the non-finite points are reported; too few finite ones for the rest
            self.points(ctx, S.GRAD_NORM)  # raises NotEnoughData
        vanishing = self._vanishing(ctx, *_levels(found), points=finite)
        spikes = self._spikes(ctx, *_finite(found))
        return findings + [one for one in (vanishing, spikes) if one is not None]

    def _nonfinite(self, ctx: DetectionContext, found: TagPoints) -> Finding | None:
        bad = ~np.isfinite(found.values)
        count = int(bad.sum())
        if not count:
            return None
        n = len(found.values)
        where = np.flatnonzero(bad)
        persist = self.persistence(ctx, n)
        at_end = bool(bad[-1]) or holds_at_end(bad, persist)
        share = count / n
        nan_count = int(np.isnan(found.values).sum())
        tag = _tag(ctx, S.GRAD_NORM)
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
        return Finding(
            code=self.code,
            severity=severity,
            title=title,
            message=(
                f"`{tag}` was logged as NaN or infinite at {count} of its {n} logged points ({pct(share)}; first at "
                f"step(s) {', '.join(map(str, first_steps))}); {tail}"
            ),
            onset_step=int(found.steps[where[0]]),
            step_range=(int(found.steps[where[0]]), int(found.steps[where[-1]])),
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
            remedy=(
                "resume from the last checkpoint before the first non-finite step with a lower learning rate "
                "(TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`), gradient clipping (TRL "
                "`max_grad_norm`, verl `actor_rollout_ref.actor.grad_clip`) and bf16 rather than fp16"
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
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        tag = _tag(ctx, S.GRAD_NORM)
        return Finding(
            code=self.code,
            severity=Severity.CRITICAL if exact_zero else Severity.WARNING,
            title="gradient norm is 0: no update" if exact_zero else "gradient norm vanished",
            message=(
                f"`{tag}` ({points} points) fell from {early:.3g} early in the run to {now:.3g} "
                f"({pct(now / early)}) from step {first} on, and stayed there: "
                + ("the updates change nothing." if exact_zero else "the updates barely move the policy.")
            ),
            onset_step=first,
            step_range=(first, last),
            evidence={
                "tag": tag,
                "kind": "vanishing",
                "early": early,
                "now": now,
                "ratio": now / early,
                "points": points,
                "stretch_points": stretch[1] - stretch[0] + 1,
            },
            remedy=join_remedies(
                "check the zero-advantage share (CD504) and the reward spread (CD501): no advantage, no gradient",
                "check the loss and the learning-rate schedule (TRL `learning_rate`, verl "
                "`actor_rollout_ref.actor.optim.lr`)",
            ),
        )

    def _spikes(self, ctx: DetectionContext, steps: np.ndarray, values: np.ndarray) -> Finding | None:
        positive = values > 0
        if int(positive.sum()) < int(ctx.threshold(self.code, "min_points")):
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
        if count < int(ctx.threshold(self.code, "min_spikes")):
            return None
        where = np.flatnonzero(spike)
        ratios = np.exp(log_norm[where] - baseline[where])
        tag = _tag(ctx, S.GRAD_NORM)
        spike_steps = [int(s) for s in steps[where[:10]]]
        return Finding(
            code=self.code,
            severity=Severity.WARNING,
            title="gradient norm spikes again and again",
            message=(
                f"`{tag}` jumped to {float(np.max(ratios)):.3g}x its local median at {count} of {len(values)} points "
                f"(step(s) {', '.join(map(str, spike_steps))}{', ...' if count > len(spike_steps) else ''}), each "
                f"beyond {ctx.threshold(self.code, 'spike_mads'):g} robust deviations of its usual variation: a few "
                "batches dominate the updates."
            ),
            onset_step=int(steps[where[0]]),
            step_range=(int(steps[where[0]]), int(steps[where[-1]])),
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
            remedy=(
                "clip gradients harder (TRL `max_grad_norm`, verl `actor_rollout_ref.actor.grad_clip`), lower the "
                "learning rate (TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`), and look at the spike "
                "steps' groups for outlier rewards (CD201, CD501)"
            ),
        )


def paired_training(train: TagPoints, held_out_steps: np.ndarray) -> np.ndarray:
    """For each held-out step, the median of the training points logged since the previous held-out step (NaN
    where there is none): real logged values over the same interval, never an interpolation.

    >>> train = TagPoints(np.arange(1, 9), np.arange(1.0, 9.0))
    >>> paired_training(train, np.array([2, 5, 8, 12])).tolist()
    [1.5, 4.0, 7.0, nan]
    """
    steps, values = _finite(train)
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
class RewardEvalDivergence(HealthDetector):
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
        held = self.points(ctx, S.EVAL_SCORE, "min_eval_points")
        train = self.points(ctx, S.REWARD)
        if held is None or train is None:
            return []
        h_steps, h_values = _finite(held)
        t_steps, _ = _finite(train)
        first, last = max(float(h_steps[0]), float(t_steps[0])), min(float(h_steps[-1]), float(t_steps[-1]))
        keep = (h_steps >= first) & (h_steps <= last)
        h_steps, h_values = h_steps[keep], h_values[keep]
        paired = paired_training(train, h_steps)
        ok = np.isfinite(paired)
        pairs = int(ok.sum())
        minimum = int(ctx.threshold(self.code, "min_eval_points"))
        if pairs < minimum:
            raise NotEnoughData(
                f"{pairs} held-out point(s) of `{_tag(ctx, S.EVAL_SCORE)}` have training points logged over the same "
                f"steps; {minimum} are needed (min_eval_points)"
            )
        alpha = self.alpha(ctx)
        t_in_steps, t_in_values = _within(train, first, last)
        train_trend = trend_test(t_in_steps, t_in_values)
        train_noise = level_noise(t_in_values, self.window(ctx, len(t_in_values)))
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
        train_tag, held_tag = _tag(ctx, S.REWARD), _tag(ctx, S.EVAL_SCORE)
        how = "fell" if falling else "stayed flat"
        tau_text = f"{tau:.2f}" if np.isfinite(tau) else "undefined (a constant series)"
        return [
            Finding(
                code=self.code,
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
                onset_step=int(h_steps[best]),
                step_range=(int(h_steps[best]), int(h_steps[-1])),
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
                | _trend_evidence("train", train_trend)
                | _trend_evidence("held_out", held_trend)
                | _trend_evidence("gap", gap_trend),
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


@register
class EntropyArrival(HealthDetector):
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
        found = self.points(ctx, S.ENTROPY)
        if found is None:
            return []
        steps, values = _levels(found)
        relative = self.relative_to_early(ctx, values)
        if relative is None:
            return []
        early, _ = relative
        n, logged = len(values), int(np.count_nonzero(np.isfinite(found.values)))
        w = self.window(ctx, n)
        floor = ctx.threshold(self.code, "floor_ratio") * early
        now = nanmedian(rolling(values, w)[-w:])
        if now <= floor:
            return []  # already at the floor: CD503 judges the collapse
        share = ctx.threshold(self.code, "fit_share")
        fit_points = max(int(ctx.threshold(self.code, "min_fit_points")), math.ceil(share * n))
        fit_steps, fit_values = steps[-fit_points:], values[-fit_points:]
        alpha = self.alpha(ctx)
        noise = level_noise(values, w)
        falling = trend_test(fit_steps, fit_values)
        if not falling.falling(alpha, noise):
            return []
        reward = ctx.scalars.get(S.REWARD) if ctx.scalars is not None else None
        if reward is None:
            raise NotEnoughData("no training reward series to tell convergence from collapse")
        r_steps, r_values = _within(reward, float(fit_steps[0]), float(fit_steps[-1]))
        minimum = int(ctx.threshold(self.code, "min_fit_points"))
        if len(r_values) < minimum:
            raise NotEnoughData(
                f"`{_tag(ctx, S.REWARD)}` has {len(r_values)} point(s) over the fitted entropy stretch; {minimum} are "
                "needed (min_fit_points)"
            )
        reward_trend = trend_test(r_steps, r_values)
        reward_noise = level_noise(r_values, self.window(ctx, len(r_values)))
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
        tag = _tag(ctx, S.ENTROPY)
        arrival = round(projected)
        return [
            Finding(
                code=self.code,
                severity=Severity.WARNING,
                title=f"entropy will reach its floor around step {arrival}",
                message=(
                    f"entropy (`{tag}`, {logged} points) fell from {early:.3g} early in the run to {now:.3g} "
                    f"({pct(now / early)} of its early level) and is still falling (Mann-Kendall p="
                    f"{falling.p_value:.2g} over its last {len(fit_values)} points); a {model} fit (R^2 "
                    f"{fits[model]['r2']:.2f}) projects it to reach its floor {floor:.3g} ({pct(floor / early)} of "
                    f"its early level, where CD503 reports a collapse) around step {arrival}, {round(left)} "
                    f"steps after the last logged one, while the training reward (`{_tag(ctx, S.REWARD)}`) over "
                    f"the same steps did not rise (change {reward_trend.change:+.3g}, p={reward_trend.p_value:.2g})."
                ),
                onset_step=int(fit_steps[0]),
                step_range=(int(fit_steps[0]), last),
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
                | _trend_evidence("entropy", falling)
                | _trend_evidence("reward", reward_trend),
                remedy=(
                    "raise the sampling temperature (TRL `temperature`, verl `actor_rollout_ref.rollout.temperature`), "
                    "add an entropy bonus (TRL `entropy_coef`, verl `actor_rollout_ref.actor.entropy_coeff`), use "
                    "clip-higher (TRL `epsilon_high`, verl `actor_rollout_ref.actor.clip_ratio_high`) or lower the "
                    "learning rate; check whether one reward channel dominates (CD402)"
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
