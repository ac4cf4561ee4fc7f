"""The logged-advantage statistics against a loop over groups (with GRPO's scalings written out)."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close, deviation, mean_or_nan, std1

TRL_EPS = 1e-4


def grpo_scaled(case: Case, scale: str) -> np.ndarray:
    """GRPO advantages with the step's std (``batch``) or no scaling (``none``); 0 on rows without reward."""
    out = np.zeros(len(case.rewards))
    for s in range(case.num_steps):
        in_step = (case.step == s) & case.valid
        step_std = std1(case.total[in_step])
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            if len(valid):
                dev = deviation(case.total[valid])
                out[valid] = dev if scale == "none" else dev / (step_std + TRL_EPS)
    return out


def reference(case: Case) -> dict[str, np.ndarray]:
    logged = case.logged
    assert logged is not None
    candidates = {
        "grpo": case.grpo,
        "gdpo": case.gdpo,
        "grpo_batch": grpo_scaled(case, "batch"),
        "grpo_none": grpo_scaled(case, "none"),
    }
    out: dict[str, list[float]] = {}
    for s in range(case.num_steps):
        rows, bounds = [], []
        for group in case.groups(s):
            valid = group[case.valid[group]]
            n = len(valid)
            if n == 0:
                continue
            has = valid[~np.isnan(logged[valid])]
            rows.extend(has)
            bounds.extend([(n - 1) / np.sqrt(n)] * len(has))
        a, bound = np.abs(logged[rows]), np.array(bounds)
        out.setdefault("logged_rows", []).append(float(len(rows)))
        out.setdefault("logged_abs_max", []).append(float(a.max()) if len(rows) else np.nan)
        out.setdefault("logged_beyond_bound_share", []).append(mean_or_nan(list(a > bound + 1e-3)))
        out.setdefault("logged_bound", []).append(float(bound.max()) if len(rows) else np.nan)
        for name, adv in candidates.items():
            out.setdefault(f"logged_mae_{name}", []).append(mean_or_nan(list(np.abs(logged[rows] - adv[rows]))))
    return {name: np.array(values) for name, values in out.items()}


def test_logged_statistics_match_the_loop(case: Case) -> None:
    expected = reference(case)
    assert np.nansum(expected["logged_beyond_bound_share"]) > 0, "the case has logged values beyond the bound"
    assert_close(case, expected, rtol=1e-5, atol=1e-5)
