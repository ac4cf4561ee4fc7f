"""Shared remedy wording and small numeric helpers for detectors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapse_doctor.numbers import nanmedian, share_pct

__all__ = [
    "FROM_SCAN",
    "GDPO_DYNAMIC",
    "GDPO_SWITCH",
    "aggregation_remedy",
    "gdpo_counterfactual",
    "nanmedian",
    "share_pct",
]

if TYPE_CHECKING:
    from collapse_doctor.detectors.base import DetectionContext

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
    """A finding's ``gdpo_resolves``: whether switching to GDPO helps; ``None`` for a run that already is GDPO."""
    return None if ctx.algorithm == "gdpo" else resolves
