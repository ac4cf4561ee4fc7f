"""The run's rewards under every estimator of the catalogue: zero-advantage rollouts, tied pairs, who decides a sign.

Reads the ``cf_*`` series of :mod:`collapse_doctor.engine.stats.counterfactuals` (computed on the same sampled
groups of each step for every estimator of :data:`~collapse_doctor.core.estimators.COUNTERFACTUAL_KEYS`) and sums
them over a stretch of steps: ``run.counterfactuals`` in the JSON, a table in the text and HTML reports, and the
numbers a remedy quotes before it proposes another estimator (:func:`better_estimators`: only one whose computed
share improves the measured harm). Pure NumPy on a RunSeries, no I/O.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from collapse_doctor.core.estimators import COMPLETION_LENGTH, COUNTERFACTUAL_KEYS, ESTIMATOR_OF, is_sparse
from collapse_doctor.core.series import RunSeries
from collapse_doctor.engine.stats.counterfactuals import SAMPLE_GROUPS

MIN_GROUPS = 20
"""Fewer sampled groups than this: "not enough data" (the shares are not given)."""
MIN_PAIRS = 20
"""Fewer differing pairs than this: the tied share is not given."""

SILENCE_MARGIN = 0.05
"""An estimator proposed for ties or a drowned channel leaves at most this much more of the rollouts without
advantage than the run's own."""

_ALL = slice(None)


@dataclass(frozen=True)
class EstimatorOutcome:
    """One estimator's shares on the sampled groups of a stretch, with their support."""

    key: str
    zero_advantage_share: float
    """Sampled rollouts whose advantage is within 1e-4 of 0 (they give no gradient)."""
    tied_pair_share: float | None
    """Of the pairs of one group whose reward vectors differ, those with equal advantages (None: too few pairs)."""
    decides: dict[str, float]
    """Per channel: the share of rollouts with a signed advantage whose sign that channel decides."""

    @property
    def label(self) -> str:
        return ESTIMATOR_OF[self.key].label

    @property
    def algorithm(self) -> str:
        return ESTIMATOR_OF[self.key].algorithm


def _sum(series: RunSeries, name: str, window: slice) -> Any:
    if name not in series:
        return None
    values = np.asarray(series[name][window], dtype=np.float64)
    if values.size == 0 or np.isnan(values).all():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nansum(values, axis=0)


def support(series: RunSeries, window: slice = _ALL) -> dict[str, int] | None:
    """The sample behind the shares of ``window``: groups, rollouts and differing pairs (None: no ``cf_*`` series)."""
    groups = _sum(series, "cf_groups", window)
    if groups is None:
        return None
    return {
        "groups": int(groups),
        "rollouts": int(_sum(series, "cf_rows", window)),
        "differing_pairs": int(_sum(series, "cf_differing_pairs", window) or 0),
    }


def outcome(series: RunSeries, key: str, window: slice = _ALL) -> EstimatorOutcome | None:
    """``key``'s shares over ``window``; None where it was not computed (OPO without lengths) or the sample holds
    fewer than :data:`MIN_GROUPS` groups."""
    sample = support(series, window)
    zero = _sum(series, f"cf_zero_rows_{key}", window)
    if sample is None or zero is None or sample["groups"] < MIN_GROUPS or sample["rollouts"] == 0:
        return None
    signal = float(_sum(series, f"cf_signal_rows_{key}", window))
    decided = _sum(series, f"cf_decided_{key}", window)
    tied = float(_sum(series, f"cf_tied_pairs_{key}", window))
    pairs = sample["differing_pairs"]
    return EstimatorOutcome(
        key=key,
        zero_advantage_share=float(zero) / sample["rollouts"],
        tied_pair_share=tied / pairs if pairs >= MIN_PAIRS else None,
        decides={
            channel: (float(decided[k]) / signal if signal > 0 else 0.0) for k, channel in enumerate(series.channels)
        },
    )


def own_key(algorithm: str) -> str | None:
    """The table's row for the run's estimator (``run.algorithm``; an unknown one is judged as GRPO, TRL's default),
    or None when it has none.

    >>> own_key("rloo"), own_key("gdpo"), own_key("unknown"), own_key("rloo_vectorized")
    ('rloo', 'gdpo', 'grpo', None)
    """
    algorithm = "grpo" if algorithm == "unknown" else algorithm
    return next((key for key in COUNTERFACTUAL_KEYS if ESTIMATOR_OF[key].algorithm == algorithm), None)


def counterfactual_table(series: RunSeries, algorithm: str, window: slice = _ALL) -> dict[str, Any] | None:
    """``run.counterfactuals``: every estimator's shares on the run's sampled groups (None without the series)."""
    sample = support(series, window)
    if sample is None:
        return None
    uniform = _sum(series, "cf_uniform", window)
    weighted = uniform is None or float(uniform) == 0
    own = own_key(algorithm)
    rows: list[dict[str, Any]] = []
    for key in COUNTERFACTUAL_KEYS:
        spec = ESTIMATOR_OF[key]
        found = outcome(series, key, window)
        row: dict[str, Any] = {"estimator": key, "algorithm": spec.algorithm, "label": spec.label, "own": key == own}
        if found is None:
            row["not_computed"] = (
                f"needs {COMPLETION_LENGTH} (without it OPO is GRPO without scaling)"
                if key == "opo" and not weighted
                else f"not enough data (fewer than {MIN_GROUPS} sampled groups)"
            )
        else:
            row |= {
                "zero_advantage_share": found.zero_advantage_share,
                "tied_pair_share": found.tied_pair_share,
                "decides": found.decides,
            }
            if COMPLETION_LENGTH in spec.needs and not weighted:
                row["note"] = f"rows weighted once (no {COMPLETION_LENGTH})"
        rows.append(row)
    return {
        "sample": {"groups_per_step": SAMPLE_GROUPS} | sample,
        "own": own,
        "estimators": rows,
    }


Measure = Literal["zero_advantage_share", "tied_pair_share", "decides"]


def better_estimators(
    series: RunSeries,
    algorithm: str,
    measure: Measure,
    window: slice = _ALL,
    *,
    channel: str | None = None,
    exclude: tuple[str, ...] = ("grpo", "gdpo"),
) -> list[tuple[EstimatorOutcome, float, float]]:
    """The estimators whose computed ``measure`` over ``window`` improves on the run's own by half at least (and by
    0.05), and that leaves at most :data:`SILENCE_MARGIN` more rollouts without advantage: ``(outcome, theirs, the
    run's)``, best first. Lower is better for the zero and tied shares; for
    ``decides`` (a drowned ``channel``) higher is. GRPO and GDPO are left out by default: the aggregation remedy
    (:func:`~collapse_doctor.judge.detectors.remedies.switch_remedy`) already answers for them. Nothing for a run
    whose own estimator is sparse by design (pass@k): its zeros and ties are what it intends."""
    own = own_key(algorithm)
    mine = outcome(series, own, window) if own is not None else None
    if mine is None or is_sparse(algorithm):  # pass@k's zeros and ties are its design, not a harm to cure
        return []

    def value(found: EstimatorOutcome) -> float | None:
        if measure == "decides":
            return found.decides.get(channel or "", None)
        return getattr(found, measure)

    base = value(mine)
    if base is None:
        return []
    better = []
    for key in COUNTERFACTUAL_KEYS:
        if key == own or key in exclude:
            continue
        found = outcome(series, key, window)
        theirs = None if found is None else value(found)
        if found is None or theirs is None:
            continue
        if measure == "decides":
            improves = theirs >= max(2 * base, base + 0.05)
        else:
            improves = theirs <= min(base / 2, base - 0.05)
        if measure != "zero_advantage_share":  # never trade the harm for silence (pass@k ties and zeros the rest)
            improves &= found.zero_advantage_share <= mine.zero_advantage_share + SILENCE_MARGIN
        if improves:
            better.append((found, theirs, base))
    better.sort(key=lambda item: item[1], reverse=measure == "decides")
    return better
