"""Shared remedy wording and small numeric helpers for detectors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapse_doctor.core.numbers import nanmedian, share_pct

__all__ = [
    "FROM_SCAN",
    "GDPO_DYNAMIC",
    "GDPO_SWITCH",
    "aggregation_remedy",
    "gdpo_counterfactual",
    "join_remedies",
    "nanmedian",
    "share_pct",
    "switch_remedy",
]

if TYPE_CHECKING:
    from collapse_doctor.judge.detectors.base import DetectionContext

FROM_SCAN = "--from-scan scan.json"
"""How remedies hand a scan to ``retrain`` (``scan.json`` is written by ``scan RUN --json scan.json``)."""
GDPO_SWITCH = (
    f"switch to GDPO: collapse-doctor retrain --algo gdpo {FROM_SCAN} "
    '(own TRL trainer: multi_objective_aggregation="normalize_then_sum")'
)
"""The aggregation remedy for a GRPO run: the retrain command, and the TRL setting for one's own trainer."""
GDPO_DYNAMIC = f"adapt the channel weights per step: collapse-doctor retrain --algo gdpo-dynamic {FROM_SCAN}"
"""The aggregation remedy for a run that already is GDPO (switching to GDPO would change nothing)."""


def aggregation_remedy(ctx: DetectionContext) -> str:
    """The aggregation part of a remedy, for the algorithm the run used (detected or ``--algo``).

    GRPO runs are told to switch to GDPO; GDPO runs to adapt the weights per step (gdpo-dynamic); runs whose
    weights already adapt (``weight/<channel>`` columns) to grade the check and retrain.
    """
    if ctx.algorithm != "gdpo":
        return GDPO_SWITCH
    if ctx.run.algorithm == "gdpo" and ctx.run.dynamic_weight_channels:
        return "grade the check and retrain: collapse-doctor retrain --algo gdpo-dynamic --reward NAME=module:function"
    return GDPO_DYNAMIC


def gdpo_counterfactual(ctx: DetectionContext, resolves: bool | None) -> bool | None:
    """A finding's ``gdpo_resolves``: whether the condition that fired would not fire on the other aggregation's
    recomputed advantages (GDPO's for a GRPO run, GRPO's for a GDPO run; renderers name which).

    ``None`` when it cannot be computed (no rollouts: nothing was recomputed).
    """
    return resolves if ctx.run.rollouts else None


def switch_remedy(ctx: DetectionContext, resolves: bool | None) -> str | None:
    """The aggregation remedy, only when the counterfactual says the other aggregation helps (else ``None``).

    A GRPO run whose condition would not fire under GDPO is told to switch; a GDPO run is never told to switch
    back, and nothing is proposed that the tool's own numbers say will not help.
    """
    if ctx.algorithm == "gdpo" or not resolves:
        return None
    return aggregation_remedy(ctx)


def join_remedies(*parts: str | None) -> str:
    """Remedy parts joined with "; ", empty ones left out."""
    return "; ".join(p for p in parts if p)
