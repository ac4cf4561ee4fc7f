"""CD105: the policy collapsed to identical completions (mode collapse), read from the completions themselves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import Finding, Severity
from collapse_doctor.core.numbers import pct
from collapse_doctor.judge.detectors.base import DetectionContext, Detector, NotEnoughData, register
from collapse_doctor.judge.detectors.remedies import policy_collapse_remedy


def identical_share(ctx: DetectionContext) -> np.ndarray:
    """Per step: the share of the groups with logged completions whose members all wrote the same one."""
    series = ctx.series
    support = series["completion_groups"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, series["identical_completion_groups"] / np.maximum(support, 1), np.nan)


def supported_window(ctx: DetectionContext, minimum: float) -> slice:
    """The current window, widened towards the start until it holds ``minimum`` groups with logged completions
    (a run of few prompts per step judges its last steps on enough groups)."""
    rows = ctx.current_window
    support = np.nan_to_num(ctx.series["completion_groups"])
    start = rows.start
    while start > 0 and float(support[start : rows.stop].sum()) < minimum:
        start -= 1
    return slice(start, rows.stop)


def collapsed_now(ctx: DetectionContext) -> bool:
    """Whether most groups of the current window (widened to CD105's ``min_groups``) hold one completion repeated."""
    if "completion_groups" not in ctx.series or ctx.series.num_steps == 0:
        return False
    share, groups = identical_share_over(ctx, supported_window(ctx, ctx.threshold("CD105", "min_groups")))
    return groups > 0 and share > ctx.threshold("CD105", "share")


def identical_share_over(ctx: DetectionContext, rows: slice) -> tuple[float, int]:
    """Identical groups / groups with completions over some steps, and that support."""
    series = ctx.series
    groups = float(np.nansum(series["completion_groups"][rows]))
    identical = float(np.nansum(series["identical_completion_groups"][rows]))
    return (identical / groups if groups > 0 else float("nan")), int(groups)


def _entropy(ctx: DetectionContext) -> dict[str, Any]:
    """The policy entropy the trainer logged: its early level and its level now (the scalar log, if any)."""
    points = ctx.scalars.get(S.ENTROPY) if ctx.scalars is not None else None
    if points is None or len(points.values) < 4:
        return {}
    values = points.values[np.isfinite(points.values)]
    if len(values) < 4:
        return {}
    tenth = max(1, len(values) // 10)
    return {"entropy_early": float(np.median(values[:tenth])), "entropy_now": float(np.median(values[-tenth:]))}


@register
class ModeCollapse(Detector):
    """The policy emits the same completion for every member of most groups: mode collapse.

    What it detects
        Per step, the share of groups (2+ rollouts with a logged completion) whose members all wrote the
        same completion, from the completion text itself. A sustained stretch where most groups hold one
        completion repeated is a collapse; it is graded on the current window (the last 10% of the steps):
        still collapsed there is critical, a collapse that ended is reported with the step it recovered at.
        Evidence names the distinct completions per step and, where the trainer logged it, the entropy.

    Why it matters
        A group whose members are one completion repeated gives every member the same reward vector, so its
        advantage is 0 under any aggregation and any weights: the policy stopped exploring and nothing in
        the batch can teach it. Reweighting channels or switching to GDPO cannot help; the fix is on the
        policy's side (step size, sampling, a KL anchor) or a restart from before the collapse.

    Evidence
        The identical-completion share of groups over the stretch and over the current window, with the
        number of groups it rests on; the share of distinct completions among the rollouts now; the
        zero-advantage share it causes; the logged entropy early and now (when the scalar log has it).

    Remedy
        Lower the learning rate (TRL `learning_rate`), raise the sampling temperature, or anchor the policy
        with a KL penalty (TRL `beta`), and resume from a checkpoint saved before the onset; no channel
        weighting and no aggregation changes a group of identical completions.
    """

    code = "CD105"
    name = "mode collapse"
    default_severity = Severity.CRITICAL
    thresholds: ClassVar[Mapping[str, float]] = {"share": 0.5, "min_groups": 8}

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        series = ctx.series
        if series.num_steps == 0 or "completion_groups" not in series:
            return []
        support = float(np.nansum(series["completion_groups"]))
        minimum = ctx.threshold(self.code, "min_groups")
        if not np.isfinite(support) or support == 0:
            raise NotEnoughData("the rollouts carry no completion text (log completions to check for mode collapse)")
        if support < minimum:
            raise NotEnoughData(f"fewer than {minimum:g} groups with logged completions")
        share_cut = ctx.threshold(self.code, "share")
        per_step = identical_share(ctx)
        stretch = ctx.sustained(ctx.smooth_rate(np.nan_to_num(per_step)) > share_cut)
        if stretch is None:
            return []
        window = ctx.window(stretch)
        during, during_groups = identical_share_over(ctx, window)
        now_rows = supported_window(ctx, minimum)
        now, now_groups = identical_share_over(ctx, now_rows)
        distinct_now = float(np.nanmedian(series["distinct_completion_share"][now_rows]))
        alg = ctx.algorithm
        rows = float(np.nansum(series["valid_rows"][window]))
        zero = float(np.nansum(series[f"zero_adv_rows_{alg}"][window])) / rows if rows > 0 else float("nan")
        steps = series.steps
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        entropy = _entropy(ctx)
        # Still collapsed: the stretch reaches the current window, or the current window is still mostly identical.
        still = ctx.recovered_at(stretch) is None or now > share_cut
        shown_entropy = (
            f"; logged entropy {entropy['entropy_early']:.3g} early, {entropy['entropy_now']:.3g} now"
            if entropy
            else ""
        )
        if still:
            severity = Severity.CRITICAL if now > share_cut else Severity.WARNING
            title = "the policy collapsed to identical completions"
            message = (
                f"{pct(now)} of groups hold one completion repeated over the last {now_rows.stop - now_rows.start} "
                f"steps ({now_groups:,} groups; {pct(distinct_now)} of rollouts are distinct completions), "
                f"{pct(during)} since step {first} ({during_groups:,} groups): {pct(zero)} of those steps' rollouts "
                f"get zero advantage under {alg.upper()}, under any weights{shown_entropy}."
            )
        else:
            severity = Severity.INFO  # finding() adds "recovered at step N" (the current-window rule)
            title = f"identical completions at steps {first}-{last}"
            message = (
                f"{pct(during)} of groups held one completion repeated at steps {first}-{last} ({during_groups:,} "
                f"groups); over the last {now_rows.stop - now_rows.start} steps {pct(now)} ({now_groups:,} groups)"
                f"{shown_entropy}."
            )
        remedy = policy_collapse_remedy(first)
        evidence = {
            "identical_group_share": during,
            "identical_group_share_now": now,
            "groups": during_groups,
            "groups_now": now_groups,
            "distinct_completion_share_now": distinct_now,
            "zero_advantage_rollout_share": zero,
            **entropy,
        }
        return [
            self.finding(
                ctx,
                stretch,
                severity=severity,
                title=title,
                message=message,
                evidence=evidence,
                remedy=remedy,
                recovered=None if still else ctx.recovered_at(stretch),
                # computed, not assumed: the identical-completion share is the same series under either aggregation
                gdpo_resolves=False if ctx.run.rollouts else None,
            )
        ]
