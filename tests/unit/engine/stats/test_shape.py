"""Advantage moments (std, skewness, kurtosis, bimodality, max |a|) against numpy over the signal rows."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close


def signal_rows(case: Case, s: int) -> np.ndarray:
    """Valid rows of the step's groups with at least two valid rows whose totals differ."""
    picked = [rows[case.valid[rows]] for rows in case.groups(s)]
    kept = [rows for rows in picked if len(rows) >= 2 and np.ptp(case.total[rows]) > 0]
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


def moments(x: np.ndarray) -> dict[str, float]:
    n = len(x)
    out = dict.fromkeys(("std", "skew", "kurtosis", "bimodality", "abs_max"), np.nan)
    if n == 0:
        return out
    out["abs_max"] = float(np.abs(x).max())
    if n >= 2:
        out["std"] = float(x.std(ddof=1))
    d = x - x.mean()
    m2, m3, m4 = (float(np.mean(d**k)) for k in (2, 3, 4))
    if m2 > 0:
        out["skew"] = m3 / m2**1.5
        out["kurtosis"] = m4 / m2**2 - 3.0
        if n > 3:
            out["bimodality"] = (out["skew"] ** 2 + 1) / (out["kurtosis"] + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
    return out


def reference(case: Case) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {}
    for s in range(case.num_steps):
        rows = signal_rows(case, s)
        for name, adv in (("grpo", case.grpo), ("gdpo", case.gdpo)):
            for key, value in moments(adv[rows]).items():
                out.setdefault(f"adv_{key}_{name}", []).append(value)
    return {name: np.array(values) for name, values in out.items()}


def test_advantage_moments_match_numpy(case: Case) -> None:
    assert_close(case, reference(case), rtol=1e-6, atol=1e-6)
