"""Shared remedy wording and small numeric helpers for detectors."""

from __future__ import annotations

import warnings

import numpy as np

GDPO_SWITCH = 'switch to GDPO: GRPOConfig(multi_objective_aggregation="normalize_then_sum") in TRL'


def nanmedian(values: np.ndarray) -> float:
    """Median ignoring NaN; NaN when nothing is left (no warning)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(np.isnan(values)):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(values))
