"""Which aggregation a run used: ``--algo``, else its logged advantages, else its dynamic-weight columns.

Reads only the run's series and what the reader learnt; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collapse_doctor.schema import DYNAMIC_WEIGHTS_SOURCE
from collapse_doctor.series import RECOMPUTATIONS, RunSeries

ALGO_MATCH_MAE = 0.01
"""Logged advantages within this mean absolute difference of a recomputation identify the algorithm."""
_SCALES = {"grpo": "group", "grpo_batch": "batch", "grpo_none": "none"}


def detect_algorithm(series: RunSeries, algo: str, dynamic_weight_channels: Sequence[str] = ()) -> tuple[str, str]:
    """(algorithm, how it was decided): ``--algo``, else the logged advantages, else dynamic-weight columns.

    >>> from collapse_doctor.series import RECOMPUTATIONS, RunSeries
    >>> detect_algorithm(RunSeries(np.arange(3), ("a",), []), "auto", ("a",))
    ('gdpo', 'dynamic channel weights: weight/ columns for a')
    """
    algorithm, source = _from_logged(series, algo)
    if algorithm == "unknown" and dynamic_weight_channels:
        # gdpo-dynamic (collapse-doctor retrain) logs per-step weights; the recomputation uses fixed ones.
        algorithm = "gdpo"
        source = f"{DYNAMIC_WEIGHTS_SOURCE}: weight/ columns for {', '.join(dynamic_weight_channels)}"
    return algorithm, source


def _from_logged(series: RunSeries, algo: str) -> tuple[str, str]:
    if algo != "auto":
        return algo, "--algo"
    if "logged_mae_grpo" not in series:
        return "unknown", "no logged advantage column"
    candidates = {name: float(np.nanmean(series[f"logged_mae_{name}"])) for name in RECOMPUTATIONS}
    best = min(candidates, key=lambda k: candidates[k] if np.isfinite(candidates[k]) else np.inf)
    if candidates[best] <= ALGO_MATCH_MAE:
        scale = _SCALES.get(best)
        label = "gdpo" if best == "gdpo" else "grpo"
        detail = f"logged advantages match {label.upper()}" + (f" (scale {scale})" if scale else "")
        return label, detail
    return "unknown", f"logged advantages match no recomputation (closest: {best}, {candidates[best]:.3g})"
