"""A numpy loop reference for the weight-fit series (``wfit_<algorithm>_diag|off|norm``), and TRL's advantages.

Per step, from the rows' channel rewards ``R`` ``[N, C]`` (NaN = not applicable), dense group ids and the logged
advantage ``A``:

- GRPO: per group, ``D`` = the rewards with NaN as 0 (TRL's ``nansum``), minus the group mean;
  ``M += D^T D - (D^T A)(A^T D) / (A^T A)`` (no projection when ``A`` is 0 in the group); ``norm += sum(D^2)``;
- GDPO: ``Z`` = per-channel group z-scores (TRL: ddof=1 std + 1e-4, NaN as 0), projected over the step:
  ``M += Z^T Z - (Z^T A)(A^T Z) / (A^T A)``; ``norm += sum(Z^2)``.

``diag`` is ``M``'s diagonal ``[C]``, ``off`` its entries ``M[a, b]`` for the pairs ``combinations(C, 2)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from itertools import combinations

import numpy as np

from collapse_doctor.core.series import RunSeries, channel_pairs

EPS = 1e-4


def _nanstd1(x: np.ndarray) -> np.ndarray:
    """Per column std (ddof=1) over the non-NaN values; NaN with fewer than two."""
    count = (~np.isnan(x)).sum(axis=0)
    mean = np.nansum(x, axis=0) / np.maximum(count, 1)
    var = np.nansum((x - mean) ** 2, axis=0) / np.maximum(count - 1, 1)
    return np.where(count >= 2, np.sqrt(var), np.nan)


def trl_advantages(
    rewards: np.ndarray, group: np.ndarray, weights: Sequence[float], algo: str = "grpo", scale: str = "group"
) -> np.ndarray:
    """TRL 1.16's advantages of one step (float64): GRPO ``sum_then_normalize`` or GDPO ``normalize_then_sum``."""
    w = np.asarray(weights, dtype=np.float64)
    adv = np.zeros(len(rewards))
    if algo == "grpo":
        total = np.nansum(rewards * w, axis=1)
        step_std = float(np.std(total, ddof=1))
        for g in np.unique(group):
            rows = group == g
            t = total[rows]
            std = float(np.std(t, ddof=1)) if len(t) > 1 else np.nan
            dev = t - t.mean()
            adv[rows] = dev if scale == "none" else dev / ((step_std if scale == "batch" else std) + EPS)
        return np.nan_to_num(adv)
    z = np.zeros_like(rewards, dtype=np.float64)
    for g in np.unique(group):
        rows = group == g
        r = rewards[rows]
        z[rows] = (r - np.nanmean(r, axis=0)) / (_nanstd1(r) + EPS)
    fused = np.nansum(np.nan_to_num(z) * w, axis=1)
    return np.nan_to_num((fused - fused.mean()) / (np.std(fused, ddof=1) + EPS))


def _form(parts: np.ndarray, logged: np.ndarray) -> np.ndarray:
    m = parts.T @ parts
    aa = float(logged @ logged)
    if aa > 0:
        proj = parts.T @ logged
        m -= np.outer(proj, proj) / aa
    return m


def step_forms(rewards: np.ndarray, group: np.ndarray, logged: np.ndarray) -> dict[str, tuple[np.ndarray, float]]:
    """``{algo: (M, norm)}`` of one step."""
    logged = np.asarray(logged, dtype=np.float64)
    c = rewards.shape[1]
    m_grpo, n_grpo = np.zeros((c, c)), 0.0
    z = np.zeros_like(rewards, dtype=np.float64)
    for g in np.unique(group):
        rows = group == g
        r = np.asarray(rewards[rows], dtype=np.float64)
        filled = np.nan_to_num(r)
        dev = filled - filled.mean(axis=0)
        m_grpo += _form(dev, logged[rows])
        n_grpo += float((dev**2).sum())
        z[rows] = np.nan_to_num((r - np.nanmean(r, axis=0)) / (_nanstd1(r) + EPS)) if len(r) > 1 else 0.0
    return {"grpo": (m_grpo, n_grpo), "gdpo": (_form(z, logged), float((z**2).sum()))}


def wfit_values(forms: Sequence[dict[str, tuple[np.ndarray, float]]]) -> dict[str, np.ndarray]:
    """The ``wfit_*`` series of the steps' forms."""
    out: dict[str, np.ndarray] = {}
    for algo in ("grpo", "gdpo"):
        mats = [f[algo][0] for f in forms]
        c = mats[0].shape[0]
        pairs = list(combinations(range(c), 2))
        out[f"wfit_{algo}_diag"] = np.array([np.diag(m) for m in mats])
        out[f"wfit_{algo}_off"] = np.array([[m[a, b] for a, b in pairs] for m in mats]).reshape(len(mats), len(pairs))
        out[f"wfit_{algo}_norm"] = np.array([f[algo][1] for f in forms])
    return out


def _correlation_sums(steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], c: int) -> dict[str, np.ndarray]:
    """``corr_sxx``, ``corr_syy``, ``corr_sxy`` per step: sums over rows with both rewards of the deviations
    from each channel's own group mean (as :mod:`collapse_doctor.engine.stats.correlation`)."""
    pairs = list(combinations(range(c), 2))
    out: dict[str, list[list[float]]] = {"corr_sxx": [], "corr_syy": [], "corr_sxy": []}
    for rewards, group, _ in steps:
        dev = np.zeros_like(rewards, dtype=np.float64)
        for g in np.unique(group):
            rows = group == g
            dev[rows] = rewards[rows] - np.nanmean(rewards[rows], axis=0)
        both = [~np.isnan(rewards[:, i]) & ~np.isnan(rewards[:, j]) for i, j in pairs]
        out["corr_sxx"].append([float((dev[b, i] ** 2).sum()) for (i, _), b in zip(pairs, both, strict=True)])
        out["corr_syy"].append([float((dev[b, j] ** 2).sum()) for (_, j), b in zip(pairs, both, strict=True)])
        out["corr_sxy"].append([float((dev[b, i] * dev[b, j]).sum()) for (i, j), b in zip(pairs, both, strict=True)])
    return {k: np.array(v).reshape(len(steps), len(pairs)) for k, v in out.items()}


def wfit_series(
    steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], channels: Sequence[str], *, rel_gain: bool = True
) -> RunSeries:
    """A RunSeries holding the ``wfit_*``, ``corr_*`` (and ``rel_gain``) series of ``(rewards, group, logged)``
    per step."""
    channels = tuple(channels)
    with warnings.catch_warnings():  # groups where a channel is all NaN (a sparse channel)
        warnings.simplefilter("ignore", RuntimeWarning)
        return _series(steps, channels, rel_gain=rel_gain)


def _series(
    steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], channels: tuple[str, ...], *, rel_gain: bool
) -> RunSeries:
    values = wfit_values([step_forms(r, g, a) for r, g, a in steps])
    values |= _correlation_sums(steps, len(channels))
    if rel_gain:
        gains = []
        for r, g, _ in steps:
            per_group = [np.nanmax(r[g == k], axis=0) - np.nanmin(r[g == k], axis=0) for k in np.unique(g)]
            gains.append(np.nanmean(np.array(per_group), axis=0))
        values["rel_gain"] = np.array(gains)
    return RunSeries(np.arange(len(steps)), channels, channel_pairs(channels), values)
