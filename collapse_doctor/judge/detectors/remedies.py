"""Shared remedy wording and small numeric helpers for detectors.

A remedy that proposes something concrete is a :class:`~collapse_doctor.core.findings.Remedy`: its words and its
typed actions built together, the command or value in the words taken from the action (one source of truth).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapse_doctor.core.estimators import display_name
from collapse_doctor.core.findings import ChangeSetting, Remedy, SetAggregation
from collapse_doctor.core.numbers import nanmedian, pct, share_pct
from collapse_doctor.core.series import RunSeries
from collapse_doctor.judge.counterfactuals import Measure, better_estimators, support

__all__ = [
    "CLIP_HIGHER",
    "FROM_SCAN",
    "GDPO",
    "GDPO_DYNAMIC",
    "GDPO_SWITCH",
    "HOTTER",
    "LOWER_LR",
    "MORE_GENERATIONS",
    "MORE_KL",
    "Remedy",
    "aggregation_remedy",
    "estimator_remedy",
    "gdpo_counterfactual",
    "join_remedies",
    "nanmedian",
    "policy_collapse_remedy",
    "share_pct",
    "switch_remedy",
]

if TYPE_CHECKING:
    from collapse_doctor.judge.detectors.base import DetectionContext

FROM_SCAN = "--from-scan scan.json"
"""How remedies hand a scan to ``retrain`` (``scan.json`` is written by ``scan RUN --json scan.json``)."""
LOWER_LR = ChangeSetting("learning_rate", "lower")
MORE_GENERATIONS = ChangeSetting("num_generations", "raise")
"""More completions per prompt: a group more likely to hold the rare success (or failure) that ranks it."""
HOTTER = ChangeSetting("temperature", "raise")
CLIP_HIGHER = ChangeSetting("clip_epsilon_high", "raise")
MORE_KL = ChangeSetting("kl_coef", "raise")
"""The trainer settings several remedies propose (their wording takes the names from these)."""


def policy_collapse_remedy(before_step: int | None = None) -> Remedy:
    """What helps a policy that collapsed to identical completions (CD105, and CD102's silent groups of that
    cause): its step size, its sampling, a KL anchor; never a channel weight or an aggregation."""
    restart = f", and resume from a checkpoint before step {before_step}" if before_step is not None else ""
    return Remedy(
        f"the policy collapsed, not the rewards: lower the learning rate ({LOWER_LR.frameworks}), raise the "
        f"sampling temperature ({HOTTER.frameworks}) or anchor the policy with a KL penalty ({MORE_KL.frameworks})"
        f"{restart}; do not reweight the channels or switch the aggregation for it: neither changes a group of "
        "identical completions",
        (LOWER_LR, HOTTER, MORE_KL),
    )


GDPO = SetAggregation("gdpo")
_DYNAMIC = SetAggregation("gdpo-dynamic")
GDPO_SWITCH = Remedy(
    f"switch to GDPO: collapse-doctor retrain {GDPO.flag} {FROM_SCAN} (own TRL trainer: {GDPO.trl_setting})", (GDPO,)
)
"""The aggregation remedy for a GRPO run: the retrain command, and the TRL setting for one's own trainer."""
GDPO_DYNAMIC = Remedy(
    f"adapt the channel weights per step: collapse-doctor retrain {_DYNAMIC.flag} {FROM_SCAN}", (_DYNAMIC,)
)
"""The aggregation remedy for a run that already is GDPO (switching to GDPO would change nothing)."""


def aggregation_remedy(ctx: DetectionContext) -> Remedy:
    """The aggregation part of a remedy, for the algorithm the run used (detected or ``--algo``).

    GRPO runs are told to switch to GDPO; GDPO runs to adapt the weights per step (gdpo-dynamic); runs whose
    weights already adapt (``weight/<channel>`` columns) to grade the check and retrain.
    """
    if ctx.algorithm != "gdpo":
        return GDPO_SWITCH
    if ctx.run.algorithm == "gdpo" and ctx.run.dynamic_weight_channels:
        return Remedy(
            f"grade the check and retrain: collapse-doctor retrain {_DYNAMIC.flag} --reward NAME=module:function",
            (_DYNAMIC,),
        )
    return GDPO_DYNAMIC


def gdpo_counterfactual(ctx: DetectionContext, resolves: bool | None) -> bool | None:
    """A finding's ``gdpo_resolves``: whether the condition that fired would not fire on the other aggregation's
    recomputed advantages (GDPO's for a GRPO run, GRPO's for a GDPO run; renderers name which).

    ``None`` when it cannot be computed (no rollouts: nothing was recomputed).
    """
    return resolves if ctx.run.rollouts else None


def switch_remedy(ctx: DetectionContext, resolves: bool | None) -> Remedy | None:
    """The aggregation remedy, only when the counterfactual says the other aggregation helps (else ``None``).

    A GRPO run whose condition would not fire under GDPO is told to switch; a GDPO run is never told to switch
    back, and nothing is proposed that the tool's own numbers say will not help.
    """
    if ctx.algorithm == "gdpo" or not resolves:
        return None
    return aggregation_remedy(ctx)


def join_remedies(*parts: str | Remedy | None) -> str:
    """Remedy parts joined with "; ", empty ones left out (their words only: :meth:`Remedy.join` keeps the actions)."""
    return Remedy.join(*parts).text


def estimator_remedy(
    ctx: DetectionContext, window: slice, measure: Measure, harm: str, *, channel: str | None = None
) -> Remedy | None:
    """Another estimator of the catalogue, only where its computed ``measure`` over ``window`` (the same sampled
    groups, :mod:`collapse_doctor.judge.counterfactuals`) improves on the run's own by half: ``harm`` words the
    measure (``"leave {theirs} of rollouts without advantage"``). None without rollouts or where none improves."""
    if not ctx.run.rollouts:
        return None
    better = better_estimators(ctx.series, ctx.run.algorithm, measure, window, channel=channel)
    if not better:
        return None
    found, theirs, mine = better[0]
    action = ChangeSetting("adv_estimator", "set", found.algorithm)
    own = display_name(ctx.run.algorithm if ctx.run.algorithm != "unknown" else ctx.algorithm)
    return Remedy(
        f"on the same rewards {display_name(found.algorithm)} would {harm.format(theirs=pct(theirs))}, against "
        f"{pct(mine)} under {own} (computed on {support_words(ctx.series, window)}; run.counterfactuals): "
        f"verl {action.verl}={found.algorithm}",
        (action,),
    )


def support_words(series: RunSeries, window: slice) -> str:
    """``"1,200 sampled groups"``: the support of the counterfactual shares of ``window``."""
    sample = support(series, window)
    return f"{sample['groups']:,} sampled groups" if sample else "no sampled groups"
