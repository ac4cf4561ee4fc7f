"""Which aggregation a run used: ``--algo``, else its logged advantages, else its dynamic-weight columns.

Reads only the run's series and what the reader learnt; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from collapse_doctor.core.estimators import ESTIMATOR_OF, ESTIMATORS, MATCH_MAE
from collapse_doctor.core.result import Phase
from collapse_doctor.core.schema import DYNAMIC_WEIGHTS_SOURCE
from collapse_doctor.core.series import RECOMPUTATIONS, RunSeries

ALGO_MATCH_MAE = MATCH_MAE
"""Logged advantages within this mean absolute difference of a recomputation identify the algorithm."""
SCALE_OF = {"grpo": "group", "grpo_batch": "batch", "grpo_none": "none"}
"""The GRPO ``--scale`` of each GRPO recomputation."""


def detect_algorithm(
    series: RunSeries,
    algo: str,
    dynamic_weight_channels: Sequence[str] = (),
    declared: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """(algorithm, how it was decided): ``--algo``, else the logged advantages, else dynamic-weight columns, else
    what the trainer's own files declare (``declared``: a run without logged advantages to compare, such as TRL's
    RLOOTrainer with a KL penalty in them). A declaration never overrules the logged advantages: where they match
    no recomputation, that is CD202's to say.

    >>> from collapse_doctor.core.series import RunSeries
    >>> detect_algorithm(RunSeries(np.arange(3), ("a",), []), "auto", ("a",))
    ('gdpo', 'dynamic channel weights: weight/ columns for a')
    >>> detect_algorithm(RunSeries(np.arange(3), ("a",), []), "auto", declared=("rloo", "the run's config"))
    ('rloo', "the run's config")
    """
    algorithm, source = _from_logged(series, algo)
    if algorithm == "unknown" and dynamic_weight_channels:
        # gdpo-dynamic (collapse-doctor retrain) logs per-step weights; the recomputation uses fixed ones.
        algorithm = "gdpo"
        source = f"{DYNAMIC_WEIGHTS_SOURCE}: weight/ columns for {', '.join(dynamic_weight_channels)}"
    elif algorithm == "unknown" and declared is not None and "logged_mae_grpo" not in series:
        return declared
    return algorithm, source


def _from_logged(series: RunSeries, algo: str) -> tuple[str, str]:
    if algo != "auto":
        return algo, "--algo"
    if "logged_mae_grpo" not in series:
        return "unknown", "no logged advantage column"
    match, detail = match_logged(logged_mae(series), logged_mae(series, "logged_shape_mae_"))
    if match is None:
        return "unknown", detail
    return ESTIMATOR_OF[match].algorithm, detail


def without_uncompared(series: RunSeries) -> RunSeries:
    """``series`` without the other estimators' comparisons that were never made: where GRPO or GDPO matched the
    log in every chunk, the engine compared no other estimator (their series are all NaN) and nothing is lost by
    leaving them out of the output; where some estimator was not comparable (a missing column), its NaN series
    stays and says so.

    >>> from collapse_doctor.core.series import RunSeries
    >>> s = RunSeries(np.arange(2), ("a",), [], {"logged_mae_grpo": np.zeros(2), "logged_mae_rloo": np.full(2, np.nan)})
    >>> list(without_uncompared(s).values)
    ['logged_mae_grpo']
    """
    main = []
    for key in RECOMPUTATIONS:
        if f"logged_mae_{key}" in series:
            values = np.asarray(series[f"logged_mae_{key}"], dtype=np.float64)
            finite = values[np.isfinite(values)]  # a step with nothing compared is left out (no stderr warning)
            if len(finite):
                main.append(float(finite.mean()))
    if not main or min(main) > MATCH_MAE:
        return series
    keep = {
        name: values
        for name, values in series.values.items()
        if not (
            name.startswith(("logged_mae_", "logged_shape_mae_"))
            and name.removeprefix("logged_shape_mae_").removeprefix("logged_mae_") not in RECOMPUTATIONS
            and not np.isfinite(values).any()
        )
    }
    return replace(series, values=keep)


def matches_both(series: RunSeries) -> bool:
    """Whether the logged advantages match a GRPO and a GDPO estimator alike (within :data:`ALGO_MATCH_MAE`): they
    cannot tell the two apart (e.g. one channel constant within every group, where GDPO's fused sum is GRPO's
    z-score up to the batch scale).

    >>> from collapse_doctor.core.series import RunSeries
    >>> s = RunSeries(np.arange(2), ("a",), [], {"logged_mae_grpo": np.zeros(2), "logged_mae_gdpo": np.full(2, .004)})
    >>> matches_both(s)
    True
    """
    mae = logged_mae(series)
    matched = {ESTIMATOR_OF[key].family for key, value in mae.items() if np.isfinite(value) and value <= ALGO_MATCH_MAE}
    return {"grpo", "gdpo"} <= matched


def logged_mae(series: RunSeries, prefix: str = "logged_mae_") -> dict[str, float]:
    """The run's mean |logged - recomputed| under each estimator of the catalogue the scan compared (NaN: the
    estimator could not be recomputed, a column it needs is missing); with ``prefix="logged_shape_mae_"``, the same
    for the token-weighted estimators up to what their missing lengths decide."""
    out = {}
    for spec in ESTIMATORS:
        name = f"{prefix}{spec.key}"
        if name in series:
            values = np.asarray(series[name], dtype=np.float64)
            out[spec.key] = float(np.nanmean(values)) if bool(np.isfinite(values).any()) else float("nan")
    return out


def unchecked(mae: Mapping[str, float]) -> dict[str, tuple[str, ...]]:
    """The estimators that could not be compared, by the column they need (``{"completion_length": ("opo", ...)}``).

    >>> unchecked({"grpo": 0.2, "opo": float("nan"), "gpg": 0.1})
    {'completion_length': ('opo',)}
    """
    missing: dict[str, list[str]] = {}
    for key, value in mae.items():
        spec = ESTIMATOR_OF[key]
        if not np.isfinite(value) and spec.needs:
            for column in spec.needs:
                missing.setdefault(column, []).append(key)
    return {column: tuple(keys) for column, keys in missing.items()}


def match_shape(shapes: Mapping[str, float]) -> str | None:
    """The token-weighted estimator whose fit up to the missing token counts is closest and within
    :data:`ALGO_MATCH_MAE`, among those such a fit can name (``shape_names``), or None.

    >>> match_shape({"opo": 0.004, "reinforce_plus_plus": float("nan")})
    'opo'
    >>> match_shape({"reinforce_plus_plus_baseline": 0.0}) is None  # also GRPO under other weights
    True
    """
    fits = [s.key for s in ESTIMATORS if s.shape_names and np.isfinite(shapes.get(s.key, np.nan))]
    best = min(fits, key=lambda k: shapes[k], default=None)
    return best if best is not None and shapes[best] <= ALGO_MATCH_MAE else None


def possible_shapes(shapes: Mapping[str, float]) -> tuple[str, ...]:
    """The token-weighted estimators a fit up to their missing token counts keeps possible without naming them
    (``shape_names`` false, fit within :data:`ALGO_MATCH_MAE`), or that could not be fitted at all (NaN).

    >>> possible_shapes({"reinforce_plus_plus_baseline": 0.0, "gdpo_verl": 0.4, "opo": 0.0})
    ('reinforce_plus_plus_baseline',)
    """
    return tuple(
        s.key for s in ESTIMATORS if s.key in shapes and not s.shape_names and not shapes[s.key] > ALGO_MATCH_MAE
    )


def match_logged(mae: Mapping[str, float], shapes: Mapping[str, float] | None = None) -> tuple[str | None, str]:
    """The estimator (an :data:`~collapse_doctor.core.estimators.ESTIMATORS` key) the logged advantages match,
    given the mean absolute difference to each, or ``None``; and the sentence that says so.

    Within :data:`ALGO_MATCH_MAE`; the closest wins, ties in catalogue order. Estimators that could not be computed
    (NaN) are left out; when nothing matches exactly, one whose ``shapes`` entry (the fit up to the token counts it
    lacks) is within the tolerance matches "up to its token weighting"; else they are named as not checked.

    >>> match_logged({"grpo": 0.2, "grpo_batch": 0.001, "grpo_none": 0.5, "gdpo": 0.3})
    ('grpo_batch', 'logged advantages match GRPO (scale batch)')
    >>> match_logged({"grpo": 0.2, "gdpo": 0.3, "rloo": 0.0})
    ('rloo', 'logged advantages match RLOO (verl loop)')
    >>> match_logged({"grpo": 0.2, "gdpo": 0.3, "opo": float("nan")})
    (None, 'logged advantages match no recomputation (closest: grpo, 0.2); not checked without completion_length: opo')
    """
    ordered = [spec.key for spec in ESTIMATORS if spec.key in mae and np.isfinite(mae[spec.key])]
    if not ordered:
        return None, "logged advantages: no recomputation could be compared"
    best = min(ordered, key=lambda k: mae[k])
    if mae[best] <= ALGO_MATCH_MAE:
        return best, f"logged advantages match {ESTIMATOR_OF[best].label}"
    shaped = match_shape(shapes or {})
    if shaped is not None:
        spec = ESTIMATOR_OF[shaped]
        return shaped, (
            f"logged advantages match {spec.label} up to its token weighting (not checked exactly without "
            f"{', '.join(spec.needs)})"
        )
    detail = f"logged advantages match no recomputation (closest: {best}, {mae[best]:.3g})"
    for column, keys in unchecked(mae).items():
        detail += f"; not checked without {column}: {', '.join(keys)}"
    return None, detail


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
