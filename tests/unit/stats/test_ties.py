"""differing_pairs, tied_pair_share and distinct_ratio_* against loops over the pairs of each group."""

from __future__ import annotations

from itertools import combinations

import numpy as np

from collapse_doctor.stats import DISTINCT_QUANTUM, TIE_QUANTUM
from tests.helpers.stats_cases import Case, assert_close, mean_or_nan


def bins(values: np.ndarray, quantum: float) -> tuple[float, ...]:
    """Values as bins of width ``quantum``; NaN is a bin of its own."""
    return tuple(np.where(np.isnan(values), np.inf, np.round(values / quantum)).tolist())


def reference(case: Case) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {
        "differing_pairs": [],
        "tied_pair_share": [],
        "distinct_ratio_grpo": [],
        "distinct_ratio_gdpo": [],
    }
    for s in range(case.num_steps):
        differing = tied = 0
        distinct: dict[str, list[float]] = {"grpo": [], "gdpo": []}
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            for i, j in combinations(valid, 2):
                if bins(case.rewards[i], TIE_QUANTUM) != bins(case.rewards[j], TIE_QUANTUM):
                    differing += 1
                    tied += bins(case.total[[i]], TIE_QUANTUM) == bins(case.total[[j]], TIE_QUANTUM)
            if len(valid) >= 2 and np.ptp(case.total[valid]) > 0:
                for name, adv in (("grpo", case.grpo), ("gdpo", case.gdpo)):
                    values = {bins(adv[[i]], DISTINCT_QUANTUM) for i in valid}
                    distinct[name].append(len(values) / len(valid))
        out["differing_pairs"].append(float(differing))
        out["tied_pair_share"].append(tied / differing if differing else np.nan)
        for name, ratios in distinct.items():
            out[f"distinct_ratio_{name}"].append(mean_or_nan(ratios))
    return {name: np.array(values) for name, values in out.items()}


def test_ties_match_the_pair_loop(case: Case) -> None:
    expected = reference(case)
    assert np.nansum(expected["tied_pair_share"]) > 0, "the case has tied totals"
    assert_close(case, expected, rtol=1e-6, atol=1e-9)
