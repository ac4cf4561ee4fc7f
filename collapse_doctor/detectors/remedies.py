"""Shared remedy wording and small numeric helpers for detectors."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

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
    from collapse_doctor.io.sources import DYNAMIC_WEIGHTS_SOURCE

    if ctx.algorithm != "gdpo":
        return GDPO_SWITCH
    if ctx.run.algorithm_source.startswith(DYNAMIC_WEIGHTS_SOURCE):
        return "grade the check and retrain: collapse-doctor retrain --algo gdpo-dynamic --reward NAME=module:function"
    return GDPO_DYNAMIC


def share_pct(value: float) -> str:
    """A variance share as a percentage for messages and tables, clipped to [0%, 100%].

    Shares are covariance shares (``w_c * Cov(r_c, total) / Var(total)``): they sum to 1 over the channels, but
    a channel that moves against the total has a slightly negative share and the others then a little over 1.
    The exact values stay in the evidence and the JSON series.

    >>> share_pct(1.013), share_pct(-0.03), share_pct(0.456)
    ('100%', '0%', '46%')
    """
    if not np.isfinite(value):
        return "-"
    return f"{min(max(float(value), 0.0), 1.0):.0%}"


def gdpo_counterfactual(ctx: DetectionContext, resolves: bool | None) -> bool | None:
    """A finding's ``gdpo_resolves``: whether switching to GDPO helps; ``None`` for a run that already is GDPO."""
    return None if ctx.algorithm == "gdpo" else resolves


def nanmedian(values: np.ndarray) -> float:
    """Median ignoring NaN; NaN when nothing is left (no warning)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(np.isnan(values)):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(values))
