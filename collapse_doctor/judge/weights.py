"""Channel weights inferred from the logged advantages (TRL keeps ``reward_weights`` only in training_args.bin).

The logged advantages pin the weights down. Under GRPO a group's advantages are its weighted, group-centred
channel rewards ``D w`` divided by one number (the group's std, the step's, or 1), so within every group ``D w``
lies on the line of the logged advantages ``A``; under GDPO the fused z-score sum ``Z w`` lies on the line of
``A`` over the whole step. The squared distance to that line, ``||(I - P_A) D w||^2`` summed over the groups
(steps), is a quadratic form ``w^T M w``; the statistics (series ``wfit_<algorithm>_diag`` ``[S, C]``,
``wfit_<algorithm>_off`` ``[S, P]`` and ``wfit_<algorithm>_norm`` ``[S]``) hand ``M`` over per step, summed
here. The weights are the ``w`` that minimise ``w^T M w`` with one channel's weight fixed at 1 (then scaled so
that the largest is 1): up to scale, which no scaled advantage records.

A fit counts when its relative residual ``w^T M w / (|w|^2 norm)`` (``norm``: the summed
``wfit_<algorithm>_norm``, the trace of ``D^T D`` or ``Z^T Z``) is at most :data:`FIT_TOLERANCE` and the
configured weights do not fit. On the real TRL runs of tests/data/trl_corpus the weights TRL used give at most
1.5e-14 (float32 rounding), the best weights under the other aggregation 1.8e-4 or more (where the weights are
identifiable), and equal weights on the runs weighted 1 : 0.2 give 0.08-0.15.

Values and numpy only: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from collapse_doctor.core.series import RunSeries

FIT_TOLERANCE = 1e-6
"""Largest relative residual ``w^T M w / (|w|^2 norm)`` that counts as a fit."""
IDENTIFIABLE = 1e-8
"""A weight direction is identified when the residual's curvature along it, relative to the channels' own
curvatures (``M`` scaled to a unit diagonal), is above this; below it the logged advantages do not fix it."""
FLAT = 1e-12
"""A channel whose own curvature ``M_cc`` is at most this share of the normaliser moves the residual by nothing
measurable: float32 rounding of exact advantages leaves about 1e-15."""
COMBINED_MIN = 1e-4
"""Fitted weights whose combination keeps at most this share of the channels' variation cancel channels that
vary together (``D w`` near 0 fits every line): measured 1e-15-2e-7 for those, 0.04 and more for real fits."""
ALGORITHMS = ("grpo", "gdpo")
"""The aggregations fitted: GRPO (sum, then normalise) and GDPO (normalise per channel, then sum)."""


@dataclass(frozen=True)
class WeightFit:
    """Weights that reproduce the logged advantages, the aggregation they fit under, and how well."""

    algorithm: str
    """"grpo" or "gdpo"."""
    weights: dict[str, float]
    """Per channel, scaled so that the largest ``|weight|`` is 1."""
    residual: float
    """Relative residual ``w^T M w / (|w|^2 norm)`` of the fitted weights (0: the logged advantages exactly)."""
    configured_residual: float
    """The same for the configured weights."""


@dataclass(frozen=True)
class WeightInference:
    """What :func:`weight_inference` found: a fit, or why there is none (``reason``)."""

    fit: WeightFit | None
    reason: str
    """One line: the fit, or why there is none (no series, degenerate, nothing fits)."""
    residuals: dict[str, float] = field(default_factory=dict)
    """Per aggregation fitted: the relative residual of its best weights (NaN where it had none)."""
    unidentified: tuple[str, ...] = ()
    """Channels whose weight the logged advantages do not determine (a channel that never varies in a group,
    or channels that vary together)."""


def infer_weights(
    series: RunSeries, channels: Sequence[str], configured: Mapping[str, float] | None = None
) -> WeightFit | None:
    """The weights the logged advantages were computed with, or ``None`` (see :func:`weight_inference`).

    >>> infer_weights(RunSeries(np.arange(3), ("a", "b"), [("a", "b")]), ("a", "b")) is None
    True
    """
    return weight_inference(series, channels, configured).fit


def weight_inference(
    series: RunSeries, channels: Sequence[str], configured: Mapping[str, float] | None = None
) -> WeightInference:
    """Fit the channel weights to the logged advantages under GRPO and GDPO and keep the one that fits.

    ``channels`` are the series' channels, in the order the weights are reported. ``configured`` are the
    weights the run was read with (default 1.0); a fit is kept only when they do not
    fit. There is no fit when the run logged no advantage (no ``wfit_*`` series), has one channel, a channel
    never varies within a group or channels vary together (their weights are not identifiable), or no weights
    reproduce the logged advantages under either aggregation.
    """
    channels = tuple(channels)
    if set(channels) != set(series.channels):
        raise ValueError(f"channels {channels} are not the series' channels {series.channels}")
    if not any(f"wfit_{algo}_diag" in series for algo in ALGORITHMS):
        return WeightInference(None, "no logged advantage to fit weights to")
    if len(channels) < 2:
        return WeightInference(None, "one reward channel: there is no weight ratio to infer")
    flat = _never_varying(series, channels)
    if flat:
        names = ", ".join(flat)
        return WeightInference(
            None, f"{names} never varies within a group, so its weight is not identifiable", unidentified=flat
        )
    base = np.array([float((configured or {}).get(c, 1.0)) for c in channels])
    residuals: dict[str, float] = {}
    fits: list[WeightFit] = []
    configured_fits = False
    unidentified: tuple[str, ...] = ()
    cancelling: dict[str, np.ndarray] = {}
    for algo in ALGORITHMS:
        form = _quadratic_form(series, algo, channels)
        if form is None:
            continue
        matrix, norm = form
        configured_residual = _relative(matrix, base, norm)
        configured_fits = configured_fits or configured_residual <= FIT_TOLERANCE
        solved = _solve(matrix, norm)
        if isinstance(solved, tuple):  # channels whose weights the form leaves free
            unidentified = unidentified or tuple(channels[k] for k in solved)
            residuals[algo] = float("nan")
            continue
        residual = residuals[algo] = _relative(matrix, solved, norm)
        if not residual <= FIT_TOLERANCE:
            continue
        if _combined_share(series, algo, channels, solved) <= COMBINED_MIN:
            cancelling[algo] = solved
            continue
        weights = {c: float(w) for c, w in zip(channels, solved, strict=True)}
        fits.append(WeightFit(algo, weights, residual, configured_residual))
    if configured_fits:
        return WeightInference(None, "the configured weights reproduce the logged advantages", residuals)
    if fits:
        best = min(fits, key=lambda f: f.residual)
        shown = ", ".join(f"{c}={w:.4g}" for c, w in best.weights.items())
        reason = f"{shown} reproduce the logged advantages under {best.algorithm.upper()} ({best.residual:.1e})"
        return WeightInference(best, reason, residuals)
    if unidentified:
        names = ", ".join(unidentified)
        reason = f"the logged advantages fit more than one weight ratio of {names} (channels that vary together)"
        return WeightInference(None, reason, residuals, unidentified)
    if cancelling:
        algo, w = next(iter(cancelling.items()))
        shown = ", ".join(f"{c}={x:.4g}" for c, x in zip(channels, w, strict=True))
        reason = f"only weights that cancel channels varying together fit ({algo.upper()}: {shown}): not a fit"
        return WeightInference(None, reason, residuals)
    shown = ", ".join(f"{a.upper()} {r:.2g}" for a, r in residuals.items())
    return WeightInference(None, f"no weights reproduce the logged advantages (relative residual {shown})", residuals)


def _never_varying(series: RunSeries, channels: tuple[str, ...]) -> tuple[str, ...]:
    """Channels whose within-group range is 0 (or undefined) at every step (series ``rel_gain``)."""
    if "rel_gain" not in series:
        return ()
    spread = dict(zip(series.channels, np.nan_to_num(np.abs(series["rel_gain"]), nan=0.0).sum(axis=0), strict=True))
    return tuple(c for c in channels if spread[c] == 0.0)


def _quadratic_form(series: RunSeries, algo: str, channels: tuple[str, ...]) -> tuple[np.ndarray, float] | None:
    """``M`` (summed over the steps) and its normaliser, or ``None`` without the algorithm's series."""
    names = [f"wfit_{algo}_{part}" for part in ("diag", "off", "norm")]
    if not all(name in series for name in names):
        return None
    diag, off, norm = (np.asarray(series[name], dtype=np.float64) for name in names)
    index = {c: k for k, c in enumerate(series.channels)}  # the series' columns, reordered as ``channels`` below
    matrix = np.diag(np.nansum(diag, axis=0))
    for p, (a, b) in enumerate(series.pairs):
        matrix[index[a], index[b]] = matrix[index[b], index[a]] = np.nansum(off[:, p])
    order = [index[c] for c in channels]
    return matrix[np.ix_(order, order)], float(np.nansum(norm))


def _solve(matrix: np.ndarray, norm: float) -> np.ndarray | tuple[int, ...]:
    """The minimiser of ``w^T M w`` with one weight fixed at 1, scaled to a largest ``|weight|`` of 1; or, when
    no fixed channel identifies the others, the channels whose weights the form leaves free (indices).

    The first channel is the fixed one unless the others' weights are not identified with it (its true weight
    may be 0); then the next channel is tried.
    """
    size = len(matrix)
    for pivot in range(size):
        rest = [k for k in range(size) if k != pivot]
        reduced = matrix[np.ix_(rest, rest)]
        if _singular(reduced, norm * FLAT):
            continue
        w = np.ones(size)
        w[rest] = np.linalg.solve(reduced, -matrix[rest, pivot])
        return w / np.abs(w).max()
    return _loose_channels(matrix, norm * FLAT)


def _singular(block: np.ndarray, floor: float) -> bool:
    """Whether ``w^T M w`` is flat along some direction of ``block``: a curvature at most ``floor``, or one
    relatively below :data:`IDENTIFIABLE` once the block is scaled to a unit diagonal."""
    diag = np.diag(block)
    if not len(diag):
        return False
    if (diag <= floor).any():
        return True
    scale = 1.0 / np.sqrt(diag)
    return bool(np.linalg.eigvalsh(block * scale[:, None] * scale[None, :])[0] <= IDENTIFIABLE)


def _loose_channels(matrix: np.ndarray, floor: float) -> tuple[int, ...]:
    """The channels of the smallest channel subsets along which ``w^T M w`` is flat (M is positive
    semi-definite, so a flat principal block holds a null vector of M: those channels vary together)."""
    size = len(matrix)
    for k in range(1, size):
        flat = [s for s in combinations(range(size), k) if _singular(matrix[np.ix_(s, s)], floor)]
        if flat:
            return tuple(sorted({c for s in flat for c in s}))
    return tuple(range(size))


def _relative(matrix: np.ndarray, weights: np.ndarray, norm: float) -> float:
    """``w^T M w / (|w|^2 norm)``: scale-free, 0 for weights that reproduce the logged advantages (NaN without a
    normaliser)."""
    size = float(weights @ weights)
    if not size or norm <= 0 or not np.isfinite(norm):
        return float("nan")
    return max(float(weights @ matrix @ weights) / (size * norm), 0.0)


def _combined_share(series: RunSeries, algo: str, channels: tuple[str, ...], weights: np.ndarray) -> float:
    """How much of the channels' within-group variation the weighted combination keeps (NaN without the
    ``corr_*`` series): ``w^T N w / sum_c w_c^2 N_cc``, 0 when the weights cancel the channels.

    ``N`` is the Gram matrix of the group-centred rewards (series ``corr_sxx``, ``corr_syy``, ``corr_sxy``)
    under GRPO; under GDPO, whose z-scores have comparable sizes, the within-group correlation matrix. Weights
    that cancel channels which vary together (an affine copy, two complementary binaries) fit any logged
    advantage trivially (``D w = 0`` lies on every line): this tells them apart.
    """
    names = ("corr_sxx", "corr_syy", "corr_sxy")
    if not all(name in series for name in names) or not series.pairs:
        return float("nan")
    sxx, syy, sxy = (np.nansum(np.asarray(series[name], dtype=np.float64), axis=0) for name in names)
    index = {c: k for k, c in enumerate(channels)}
    gram = np.zeros((len(channels), len(channels)))
    for p, (a, b) in enumerate(series.pairs):
        i, j = index[a], index[b]
        gram[i, i], gram[j, j] = max(gram[i, i], sxx[p]), max(gram[j, j], syy[p])
        gram[i, j] = gram[j, i] = sxy[p]
    if algo == "gdpo":
        scale = 1.0 / np.sqrt(np.where(np.diag(gram) > 0, np.diag(gram), np.inf))
        gram = gram * scale[:, None] * scale[None, :]
    parts = float(weights**2 @ np.diag(gram))
    return float(weights @ gram @ weights) / parts if parts > 0 else 0.0  # weight only on channels that never vary
