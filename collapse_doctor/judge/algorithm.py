"""Which aggregation a run used: ``--algo``, else its logged advantages, else its dynamic-weight columns.

Reads only the run's series and what the reader learnt; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from collapse_doctor.core.result import Phase
from collapse_doctor.core.schema import DYNAMIC_WEIGHTS_SOURCE
from collapse_doctor.core.series import RECOMPUTATIONS, RunSeries

ALGO_MATCH_MAE = 0.01
"""Logged advantages within this mean absolute difference of a recomputation identify the algorithm."""
SCALE_OF = {"grpo": "group", "grpo_batch": "batch", "grpo_none": "none"}
"""The GRPO ``--scale`` of each GRPO recomputation."""


def detect_algorithm(series: RunSeries, algo: str, dynamic_weight_channels: Sequence[str] = ()) -> tuple[str, str]:
    """(algorithm, how it was decided): ``--algo``, else the logged advantages, else dynamic-weight columns.

    >>> from collapse_doctor.core.series import RECOMPUTATIONS, RunSeries
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
    match, detail = match_logged({name: float(np.nanmean(series[f"logged_mae_{name}"])) for name in RECOMPUTATIONS})
    if match is None:
        return "unknown", detail
    return ("gdpo" if match == "gdpo" else "grpo"), detail


def match_logged(mae: Mapping[str, float]) -> tuple[str | None, str]:
    """The recomputation (a :data:`~collapse_doctor.core.series.RECOMPUTATIONS` name) the logged advantages match,
    given the mean absolute difference to each, or ``None``; and the sentence that says so.

    Within :data:`ALGO_MATCH_MAE`; the closest wins, ties in ``RECOMPUTATIONS`` order.

    >>> match_logged({"grpo": 0.2, "grpo_batch": 0.001, "grpo_none": 0.5, "gdpo": 0.3})
    ('grpo_batch', 'logged advantages match GRPO (scale batch)')
    >>> match_logged({"grpo": 0.2, "gdpo": 0.3})[0] is None
    True
    """
    ordered = [name for name in RECOMPUTATIONS if name in mae]
    best = min(ordered, key=lambda k: mae[k] if np.isfinite(mae[k]) else np.inf)
    if mae[best] <= ALGO_MATCH_MAE:
        scale = SCALE_OF.get(best)
        label = "GDPO" if best == "gdpo" else "GRPO"
        return best, f"logged advantages match {label}" + (f" (scale {scale})" if scale else "")
    return None, f"logged advantages match no recomputation (closest: {best}, {mae[best]:.3g})"


AGGREGATION_NAMES = {
    "grpo": "grpo",
    "sum_then_normalize": "grpo",
    "gdpo": "gdpo",
    "gdpo-dynamic": "gdpo",
    "normalize_then_sum": "gdpo",
}
"""Values of the ``aggregation`` column (collapse-doctor retrain's, TRL's ``multi_objective_aggregation``) and the
algorithm each is judged under (gdpo-dynamic's per-step weights are read from its ``weight/`` columns)."""


def phases_from_labels(labels: Mapping[int, str]) -> tuple[tuple[Phase, ...], str | None]:
    """The runs of consecutive steps under one aggregation, from ``{step: aggregation column value}``; and a
    warning when a value is not an aggregation (then no phases: the column is not used).

    >>> phases, _ = phases_from_labels({0: "grpo", 1: "grpo", 2: "gdpo-dynamic", 3: "gdpo"})
    >>> [p.label() for p in phases]
    ['GRPO steps 0-1', 'GDPO steps 2-3']
    """
    unknown = sorted({v for v in labels.values() if v not in AGGREGATION_NAMES})
    if unknown:
        shown = ", ".join(repr(v) for v in unknown[:3])
        return (), f"the 'aggregation' column holds {shown}, not one of {', '.join(AGGREGATION_NAMES)}: not used"
    phases: list[Phase] = []
    for step in sorted(labels):
        algorithm = AGGREGATION_NAMES[labels[step]]
        if phases and phases[-1].algorithm == algorithm:
            phases[-1] = Phase(phases[-1].first_step, step, algorithm)
        else:
            phases.append(Phase(step, step, algorithm))
    return tuple(phases), None
