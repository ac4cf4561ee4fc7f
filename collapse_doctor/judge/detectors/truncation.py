"""CD104: completions cut at the length cap, and the reward channels that move with the cut (scalar logs).

Every framework logs the share of completions that ended without EOS because they reached the generation budget
(canonical :data:`collapse_doctor.core.scalars.TRUNCATED_SHARE`). Many truncated completions are not harmful on their
own (a small model rambling to the cap while its rewards judge the content); they are when a reward channel
moves with the cut: a length-type reward then saturates for the wrong reason (a cut completion earns its
maximum), or a correctness-type reward loses what the cut removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting, Remedy
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import rolling
from collapse_doctor.judge.detectors.base import (
    DetectionContext,
    Detector,
    Finding,
    NotEnoughData,
    Severity,
    persistent_onset,
    register,
)

LONGER = ChangeSetting("max_completion_length", "raise")
_TRL_MASK = ChangeSetting("mask_truncated_completions", "set", True)
_VERL_PENALTY = ChangeSetting("overlong_penalty", "set", True)
SETTINGS: Mapping[str, tuple[Remedy, Remedy]] = {
    "trl": (
        Remedy(f"raise `{LONGER.trl}` (GRPOConfig)", (LONGER,)),
        Remedy(f"set `{_TRL_MASK.trl}={_TRL_MASK.value_text}` so cut completions leave the loss", (_TRL_MASK,)),
    ),
    "verl": (
        Remedy(f"raise `{LONGER.verl}`", (LONGER,)),
        Remedy(
            f"enable the overlong penalty (`{_VERL_PENALTY.verl}={_VERL_PENALTY.value_text}`, DAPO)", (_VERL_PENALTY,)
        ),
    ),
    "openrlhf": (
        Remedy("raise `--rollout.max_new_tokens` (`--generate_max_len` in older versions)", (LONGER,)),
        Remedy("penalise cut samples (`--reward.stop_properly_penalty_coef`, or `--reward.overlong_buffer_len`)"),
    ),
    "nemo_rl": (
        Remedy("raise `policy.generation.max_new_tokens` / `policy.max_total_sequence_length`", (LONGER,)),
        Remedy(
            "set `grpo.overlong_filtering: true` (cut samples leave the loss) or "
            "`grpo.reward_shaping.stop_properly_penalty_coef`"
        ),
    ),
}
"""Per framework: the length-cap setting, and how to keep cut completions from earning or losing a reward (with the
trainer-setting actions, named for TRL and verl, that other frameworks' wording maps to where it does)."""
GENERIC = (
    Remedy("raise the generation length cap", (LONGER,)),
    Remedy("mask truncated completions out of the loss or penalise them"),
)


@register
class LengthCapTruncation(Detector):
    """Most completions are cut at the length cap and a reward channel moves with the cut (scalar logs).

    What it detects
        The logged share of completions that ended without EOS because they reached the generation
        budget (TRL `completions/clipped_ratio`, verl `response_length/clip_ratio`, OpenRLHF
        `rollout/truncated_rate`, NeMo-RL `truncation_rate`), averaged over twice the persistence window,
        staying above `warn_share`, together with a reward channel whose logged per-step mean follows the
        truncated share from step to step (|correlation| of at least `channel_corr` over at least
        `min_points` steps). A truncated share at or above `all_share` (practically every completion cut)
        fires without a channel. Many truncated completions with no channel moving with them are not
        reported: the rewards then judge content the cut does not change. Where the rollouts carry completion
        lengths, a channel is called length-type only on evidence from inside the groups: its pooled
        within-group correlation with the completion length over the stretch is at least `within_corr` (same
        sign as the step-to-step one) on at least `min_length_groups` groups whose lengths vary. A trend the
        channel shares with the truncated share over the run (a policy drifting towards long or short text)
        is not that evidence, and a group of identical completions gives none.

    Why it matters
        A channel that rises with the truncated share pays for hitting the cap: a length-type reward
        saturates for the wrong reason (a cut completion scores its maximum), and the policy is pushed
        to run into the cap rather than to finish. A channel that falls with it loses what the cut
        removed (an answer that never gets written). Either way the reward measures the cap, not the
        completion. Truncation happens in generation, before any aggregation: GRPO and GDPO see the
        same cut completions, so the finding's `gdpo_resolves` is false for every run and switching
        aggregation is never proposed.

    Evidence
        The truncated share over the stretch and its peak, the raw tag, the channels that move with it
        and their correlation (step to step, and within groups where the rollouts give lengths), the steps,
        and the points they rest on.

    Remedy
        Raise the length cap (TRL `max_completion_length`, verl `data.max_response_length`, OpenRLHF
        `--rollout.max_new_tokens`, NeMo-RL `policy.generation.max_new_tokens`), compute a length reward on
        untruncated text or give truncated completions a penalty instead of the maximum, or keep cut
        completions out of the loss (TRL `mask_truncated_completions=True`, NeMo-RL
        `grpo.overlong_filtering`, verl/DAPO's overlong buffer, OpenRLHF's stop-properly penalty).
    """

    code = "CD104"
    name = "length-cap truncation"
    default_severity = Severity.WARNING
    requires: ClassVar[tuple[str, ...]] = ("scalars",)
    targets = "run"
    channel_state = "clipped"
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_share": 0.5,
        "all_share": 0.98,
        "channel_corr": 0.8,
        "min_points": 8,
        "within_corr": 0.3,
        "min_length_groups": 8,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        if ctx.scalars is None:
            return []
        found = ctx.scalars.get(S.TRUNCATED_SHARE)
        if found is None:
            return []
        minimum = int(ctx.threshold(self.code, "min_points"))
        tag = ctx.scalars.tags.get(S.TRUNCATED_SHARE, S.TRUNCATED_SHARE)
        finite = np.isfinite(found.values)
        if int(finite.sum()) < minimum:
            raise NotEnoughData(f"`{tag}` has {int(finite.sum())} logged point(s); {minimum} are needed (min_points)")
        values, steps = found.values, found.steps
        persist = ctx.config.persistence_steps(len(values))
        share = rolling(values, 2 * persist + 1, how="mean")
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return []
        part = ctx.window(stretch)
        level = float(np.nanmean(values[part]))
        peak = float(np.nanmax(values[part]))
        tracked = self._tracking_channels(ctx, found, minimum)
        within = self._within_group_evidence(ctx, int(steps[stretch[0]]), int(steps[stretch[1]]))
        if within is not None:  # the rollouts say which channels move with the length inside a group
            tracked = {c: r for c, r in tracked.items() if c in within and within[c] * r > 0}
        everything_cut = level >= ctx.threshold(self.code, "all_share")
        if not tracked and not everything_cut:
            return []
        span = f"steps {int(steps[stretch[0]])}-{int(steps[stretch[1]])}, {stretch[1] - stretch[0] + 1} points"
        message = f"{pct(level)} of completions were cut at the length cap ({span}, from `{tag}`, peak {pct(peak)})"
        rising = [c for c, r in tracked.items() if r > 0]
        falling = [c for c, r in tracked.items() if r < 0]
        if rising:
            message += (
                f"; {_names(rising, tracked)} follow{'s' if len(rising) == 1 else ''} the truncated share from step "
                "to step: a length-type reward saturating because completions hit the cap, not because they are good"
            )
        if falling:
            message += (
                f"; {_names(falling, tracked)} fall{'s' if len(falling) == 1 else ''} when more completions are cut: "
                "the cut removes what the reward checks"
            )
        if not tracked:
            message += "; practically every completion ends at the cap, so every reward judges cut text"
        cap, mask = SETTINGS.get(ctx.scalars.framework or "", GENERIC)
        evidence: dict[str, Any] = {
            "tag": tag,
            "share": level,
            "peak_share": peak,
            "channel_correlation": tracked,
            "within_group_length_correlation": within,
            "points": len(steps),
            "stretch_points": stretch[1] - stretch[0] + 1,
        }
        return [
            self.finding(
                ctx,
                stretch,
                steps=steps,
                severity=Severity.WARNING,
                title="most completions are cut at the length cap",
                message=message + ".",
                channels=tuple(tracked),
                evidence=evidence,
                remedy=Remedy.join(
                    cap,
                    "compute a length reward on the untruncated text or give truncated completions a penalty "
                    "instead of the reward's maximum",
                    mask,
                ),
                # Truncation happens in generation, before any aggregation: the other aggregation cuts the same
                # completions. This follows from the pipeline for every run, not from a counterfactual scan.
                gdpo_resolves=False,
            )
        ]

    def _within_group_evidence(self, ctx: DetectionContext, first: int, last: int) -> dict[str, float] | None:
        """``{channel: within-group correlation with the completion length}`` over the steps ``first..last`` for
        the channels whose correlation reaches ``within_corr`` on at least ``min_length_groups`` groups whose
        lengths vary; ``None`` where the rollouts carry no lengths (then the scalar log is all there is).

        A channel of identical completions has no within-group length variation: no evidence that it pays for
        length, so it is not in the result.
        """
        series = ctx.series
        if series.num_steps == 0 or "length_sxx" not in series:
            return None
        rows = (series.steps >= first) & (series.steps <= last)
        if not rows.any():
            rows = np.ones(series.num_steps, dtype=bool)  # the rollouts' steps are not the scalar log's
        sxx = series["length_sxx"][rows]
        if not np.isfinite(sxx).any():
            return None
        sxy = np.nansum(series["length_reward_sxy"][rows], axis=0)
        syy = np.nansum(series["length_reward_syy"][rows], axis=0)
        groups = np.nansum(series["length_groups"][rows], axis=0)
        xx = np.nansum(sxx, axis=0)
        out = {}
        for k, channel in enumerate(series.channels):
            if groups[k] < ctx.threshold(self.code, "min_length_groups") or not (xx[k] > 0 and syy[k] > 0):
                continue
            rho = float(sxy[k] / np.sqrt(xx[k] * syy[k]))
            if abs(rho) >= ctx.threshold(self.code, "within_corr"):
                out[channel] = rho
        return out

    def _tracking_channels(self, ctx: DetectionContext, share: TagPoints, minimum: int) -> dict[str, float]:
        """``{channel: correlation}`` of each channel whose per-step mean follows the truncated share."""
        assert ctx.scalars is not None
        limit = ctx.threshold(self.code, "channel_corr")
        out: dict[str, float] = {}
        for channel in ctx.scalars.channels:
            mean = ctx.scalars.get(S.CHANNEL_MEAN + channel)
            if mean is None:
                continue
            _, ia, ib = np.intersect1d(mean.steps, share.steps, return_indices=True)
            a, b = mean.values[ia], share.values[ib]
            ok = np.isfinite(a) & np.isfinite(b)
            a, b = a[ok], b[ok]
            if len(a) < minimum or not (np.std(a) > 0 and np.std(b) > 0):
                continue
            rho = float(np.corrcoef(a, b)[0, 1])
            if abs(rho) >= limit:
                out[channel] = rho
        return dict(sorted(out.items()))


def _names(channels: list[str], rho: Mapping[str, float]) -> str:
    return ", ".join(f"`{c}` (r = {rho[c]:+.2f})" for c in channels)
