"""CD104: completions cut at the length cap, and the reward channels that move with the cut (scalar logs).

Every framework logs the share of completions that ended without EOS because they reached the generation budget
(canonical :data:`collapse_doctor.core.scalars.TRUNCATED_SHARE`). Many truncated completions are not harmful on their
own (a small model rambling to the cap while its rewards judge the content); they are when a reward channel
moves with the cut: a length-type reward then saturates for the wrong reason (a cut completion earns its
maximum), or a correctness-type reward loses what the cut removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.findings import ChangeSetting, Remedy
from collapse_doctor.core.numbers import pct
from collapse_doctor.core.schema import TRUNCATED
from collapse_doctor.core.series import CUT_AT_CAP, CUT_AT_STEP_MAX, CUT_BY_FLAG, RunSeries
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
    """Most completions are cut at the length cap and a reward channel moves with the cut.

    What it detects
        The share of completions that ended without EOS because they reached the generation budget, averaged over
        twice the persistence window, staying above `warn_share`. The share comes from the scalar log (TRL
        `completions/clipped_ratio`, verl `response_length/clip_ratio`, OpenRLHF `rollout/truncated_rate`, NeMo-RL
        `truncation_rate`) or, without one, from the rollouts' `truncated` column (the TRL callback writes it) or,
        without that, from their `completion_length` in tokens against the cap the user gives
        (`--max-completion-length`). Whether the cut changes a reward is read inside the groups: over the groups
        that hold both cut and finished completions (finished ones at least half as long as the step's longest, so a
        reward that needs a few characters does not pass for one that pays for the cap), the mean difference of each
        channel between its cut and its finished completions. A channel whose difference is at least three standard
        errors and `cut_effect` of its range, on at least `min_length_groups` such groups, pays for the cut
        (warning: a length-type reward) or loses by it (warning: the cut removes what it checks); when every channel
        was judged and none differs, the cut changes no reward (info). The cut completions are the rows the
        `truncated` flag names (or whose token length reaches `--max-completion-length`); without either, the rows
        at their step's largest length, used only where their share matches the logged truncated share within
        `share_match` at most steps (then the largest length is the cap). Without rollout evidence, a channel whose
        logged per-step mean follows the truncated share (|correlation| of at least `channel_corr` over at least
        `min_points` steps) and, where the rollouts carry lengths, correlates with the completion length inside
        groups (`within_corr`, on `min_length_groups` groups whose lengths vary) is the evidence; a truncated share
        at or above `all_share` (practically every completion cut) fires without a channel. A trend the channel
        shares with the truncated share over the run is not evidence, and a group of identical completions gives
        none.

    Why it matters
        A channel that rises with the truncated share pays for hitting the cap: a length-type reward
        saturates for the wrong reason (a cut completion scores its maximum), and the policy is pushed
        to run into the cap rather than to finish. A channel that falls with it loses what the cut
        removed (an answer that never gets written). Either way the reward measures the cap, not the
        completion. Truncation happens in generation, before any aggregation: GRPO and GDPO see the
        same cut completions, so the finding's `gdpo_resolves` is false for every run and switching
        aggregation is never proposed.

    Evidence
        The truncated share over the stretch and its peak, its source, the channels that move with the cut:
        their within-group cut-minus-finished difference and the groups it rests on (or their correlation,
        step to step and with the length, without it), the steps, and the points they rest on.

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
    requires: ClassVar[tuple[str, ...]] = ()
    targets = "run"
    channel_state = "clipped"
    thresholds: ClassVar[Mapping[str, float]] = {
        "warn_share": 0.5,
        "all_share": 0.98,
        "channel_corr": 0.8,
        "min_points": 8,
        "within_corr": 0.3,
        "min_length_groups": 8,
        "cut_effect": 0.1,
        "share_match": 0.05,
    }

    def detect(self, ctx: DetectionContext) -> list[Finding]:
        found = _truncated_share(ctx)
        if found is None:
            raise NotEnoughData(
                "needs the truncated share: the trainer's clipped ratio in a scalar log, a `truncated` column, or "
                "--max-completion-length with a `completion_length` column"
            )
        steps, values, tag, label = found
        minimum = int(ctx.threshold(self.code, "min_points"))
        finite = np.isfinite(values)
        if int(finite.sum()) < minimum:
            raise NotEnoughData(f"{label} has {int(finite.sum())} logged point(s); {minimum} are needed (min_points)")
        persist = ctx.config.persistence_steps(len(values))
        share = rolling(values, 2 * persist + 1, how="mean")
        stretch = persistent_onset(share > ctx.threshold(self.code, "warn_share"), persist)
        if stretch is None:
            return []
        part = ctx.window(stretch)
        level = float(np.nanmean(values[part]))
        peak = float(np.nanmax(values[part]))
        first, last = int(steps[stretch[0]]), int(steps[stretch[1]])
        cut = _CutEvidence.of(ctx, self.code, first, last)
        if cut is not None:  # the rollouts say, inside each group, whether the cut itself changes a reward
            tracked = cut.changed
            within = None
        else:
            tracked = self._tracking_channels(ctx, minimum) if ctx.scalars is not None else {}
            within = self._within_group_evidence(ctx, first, last)
            if within is not None:  # the rollouts say which channels move with the length inside a group
                tracked = {c: r for c, r in tracked.items() if c in within and within[c] * r > 0}
        everything_cut = level >= ctx.threshold(self.code, "all_share")
        unchanged = cut is not None and not tracked and cut.judged
        if not tracked and not everything_cut and not unchanged:
            return []
        span = f"steps {first}-{last}, {stretch[1] - stretch[0] + 1} points"
        message = f"{pct(level)} of completions were cut at the length cap ({span}, from {label}, peak {pct(peak)})"
        rising = [c for c, r in tracked.items() if r > 0]
        falling = [c for c, r in tracked.items() if r < 0]
        if cut is not None:
            message += cut.words(rising, falling)
        else:
            if rising:
                message += (
                    f"; {_names(rising, tracked)} follow{'s' if len(rising) == 1 else ''} the truncated share from "
                    "step to step: a length-type reward saturating because completions hit the cap, not because "
                    "they are good"
                )
            if falling:
                message += (
                    f"; {_names(falling, tracked)} fall{'s' if len(falling) == 1 else ''} when more completions are "
                    "cut: the cut removes what the reward checks"
                )
            if not tracked:
                message += "; practically every completion ends at the cap, so every reward judges cut text"
        framework = ctx.scalars.framework if ctx.scalars is not None else None
        cap, mask = SETTINGS.get(framework or "", GENERIC)
        evidence: dict[str, Any] = {
            "tag": tag,
            "share": level,
            "peak_share": peak,
            "channel_correlation": tracked if cut is None else {},
            "within_group_length_correlation": within,
            "points": len(steps),
            "stretch_points": stretch[1] - stretch[0] + 1,
        }
        if cut is not None:
            evidence |= cut.evidence()
        severity = Severity.INFO if unchanged else Severity.WARNING
        title = "most completions are cut at the length cap"  # "the cut changes no reward" is said in the message
        return [
            self.finding(
                ctx,
                stretch,
                steps=steps,
                severity=severity,
                title=title,
                message=message + ".",
                channels=tuple(tracked),
                evidence=evidence,
                remedy=Remedy.join(
                    cap,
                    "compute a length reward on the untruncated text or give truncated completions a penalty "
                    "instead of the reward's maximum"
                    if not unchanged
                    else None,
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

    def _tracking_channels(self, ctx: DetectionContext, minimum: int) -> dict[str, float]:
        """``{channel: correlation}`` of each channel whose per-step mean follows the truncated share (scalar log)."""
        assert ctx.scalars is not None
        share = ctx.scalars.get(S.TRUNCATED_SHARE)
        if share is None:
            return {}
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


FLAG_SOURCE = "the rollouts' `truncated` flag"
TOLD = {
    CUT_BY_FLAG: FLAG_SOURCE,
    CUT_AT_CAP: "the rollouts' `completion_length` reaching --max-completion-length",
}
"""The rules by which the rows themselves say which completions were cut, and those words for a message."""


def _cut_share(series: RunSeries, *rules: float) -> np.ndarray:
    """``[S]`` cut rows over rows whose cut is known, at the steps whose cut rows were told by one of ``rules``
    (NaN elsewhere)."""
    known = np.where(np.isin(series["cut_rule"], rules), series["cut_known_rows"], 0.0)
    return np.where(known > 0, series["cut_rows"] / np.maximum(known, 1.0), np.nan)


def _told_by(series: RunSeries, steps: np.ndarray) -> str:
    """The words for how the rows of ``steps`` (a mask) said which were cut: the rule of most of them."""
    rules = series["cut_rule"][steps]
    return TOLD[max(TOLD, key=lambda rule: int(np.sum(rules == rule)))]


def _truncated_share(ctx: DetectionContext) -> tuple[np.ndarray, np.ndarray, str, str] | None:
    """The per-step truncated share, its steps, where it comes from (the scalar log's tag where there is one, else
    the rollouts' ``truncated`` column) and those words for a message."""
    if ctx.scalars is not None:
        found = ctx.scalars.get(S.TRUNCATED_SHARE)
        if found is not None:
            tag = ctx.scalars.tags.get(S.TRUNCATED_SHARE, S.TRUNCATED_SHARE)
            return found.steps, found.values, tag, f"`{tag}`"
    series = ctx.series
    if series.num_steps == 0 or "cut_rule" not in series:
        return None
    share = _cut_share(series, *TOLD)
    told = np.isfinite(share)
    if not told.any():
        return None
    return series.steps, share, TRUNCATED, _told_by(series, told)


@dataclass(frozen=True)
class _CutEvidence:
    """Inside groups that hold both cut and finished completions: how much more (or less) each channel pays a cut
    one, over a stretch of steps."""

    difference: Mapping[str, float]
    """Per channel with enough such groups: mean over them of (mean reward of the cut rows - of the finished)."""
    support: Mapping[str, int]
    changed: dict[str, float]
    """The channels whose difference is real: at least three standard errors and ``cut_effect`` of the
    channel's range."""
    source: str
    judged: bool
    """Whether every channel had enough groups to be judged (then an empty ``changed`` means the cut changes no
    reward)."""

    @classmethod
    def of(cls, ctx: DetectionContext, code: str, first: int, last: int) -> _CutEvidence | None:
        series = ctx.series
        if series.num_steps == 0 or "cut_rule" not in series:
            return None
        rows = (series.steps >= first) & (series.steps <= last)
        usable = rows & np.isin(series["cut_rule"], tuple(TOLD))
        source = _told_by(series, usable)
        if not usable.any():
            usable = rows & _longest_rows_match_the_log(ctx, code)
            source = "the rollouts' longest completions of each step, which match the logged truncated share"
        if not usable.any():
            return None
        minimum = ctx.threshold(code, "min_length_groups")
        effect = ctx.threshold(code, "cut_effect")
        mixed = np.nansum(series["cut_mixed_groups"][usable], axis=0)
        total = np.nansum(series["cut_reward_diff_sum"][usable], axis=0)
        squares = np.nansum(series["cut_reward_diff_sq"][usable], axis=0)
        low, high = np.nanmin(series["reward_min"], axis=0), np.nanmax(series["reward_max"], axis=0)
        difference, support, changed = {}, {}, {}
        for k, channel in enumerate(series.channels):
            m = float(mixed[k])
            if m < minimum:
                continue
            mean = float(total[k] / m)
            spread = max(float(squares[k] / m) - mean * mean, 0.0)
            error = float(np.sqrt(spread / m))
            difference[channel], support[channel] = mean, int(m)
            span = float(high[k] - low[k])
            if abs(mean) >= 3 * error and np.isfinite(span) and abs(mean) >= effect * span > 0:
                changed[channel] = mean
        if not difference:
            return None
        return cls(difference, support, changed, source, judged=len(difference) == len(series.channels))

    def words(self, rising: list[str], falling: list[str]) -> str:
        out = ""
        if rising:
            out += "; " + ", ".join(
                f"`{c}` pays {self.difference[c]:+.3g} more for a cut completion than for a finished one of the same "
                f"group ({self.support[c]:,} groups hold both)"
                for c in rising
            )
            out += ": a length-type reward that pays for hitting the cap, not for a good completion"
        if falling:
            out += "; " + ", ".join(
                f"`{c}` pays {self.difference[c]:+.3g} less for a cut completion ({self.support[c]:,} groups hold both)"
                for c in falling
            )
            out += ": the cut removes what the reward checks"
        if not rising and not falling:
            out += (
                "; inside the groups that hold both cut and finished completions no reward pays a cut one differently "
                f"({min(self.support.values()):,}+ groups per channel): the cut changes no reward"
            )
        return out + f" (cut completions told by {self.source})"

    def evidence(self) -> dict[str, Any]:
        return {
            "cut_reward_difference": dict(self.difference),
            "cut_mixed_groups": dict(self.support),
            "cut_source": self.source,
        }


def _longest_rows_match_the_log(ctx: DetectionContext, code: str) -> np.ndarray:
    """``[S]`` the steps where the rollouts' longest completions can stand for the cut ones: the logged truncated
    share is above 0 there (so the step's largest length is the cap) and, over the run, the share of rows at their
    step's largest length matches the logged share within ``share_match`` at most steps."""
    series = ctx.series
    out = np.zeros(series.num_steps, dtype=bool)
    logged = ctx.scalars.get(S.TRUNCATED_SHARE) if ctx.scalars is not None else None
    if logged is None:
        return out
    share = _cut_share(series, CUT_AT_STEP_MAX)
    _, ia, ib = np.intersect1d(series.steps, logged.steps, return_indices=True)
    both = np.isfinite(share[ia]) & np.isfinite(logged.values[ib])
    if int(both.sum()) < ctx.threshold(code, "min_points"):
        return out
    gap = np.abs(share[ia][both] - logged.values[ib][both])
    if float(np.median(gap)) > ctx.threshold(code, "share_match"):
        return out
    cut_steps = ia[both][logged.values[ib][both] > 0]
    out[cut_steps] = True
    return out
