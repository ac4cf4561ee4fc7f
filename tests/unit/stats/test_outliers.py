"""outlier_group_share and outlier_rest_std_* against a loop over groups."""

from __future__ import annotations

import numpy as np

from collapse_doctor.stats import OUTLIER_GAP
from tests.helpers.stats_cases import Case, assert_close, mean_or_nan, std1


def reference(case: Case) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {"outlier_group_share": [], "outlier_rest_std_grpo": [], "outlier_rest_std_gdpo": []}
    for s in range(case.num_steps):
        big, rest_std = [], {"grpo": [], "gdpo": []}
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            t = case.total[valid]
            if len(valid) < 4 or np.ptp(t) == 0:
                continue
            extreme = int(np.argmax(np.abs(t - t.mean())))  # the first on ties
            rest = np.delete(np.arange(len(valid)), extreme)
            spread = std1(t[rest])
            gap = abs(t[extreme] - t[rest].mean()) / max(spread, 1e-12)
            outlier = spread > 1e-6 * std1(t) and gap > OUTLIER_GAP
            big.append(float(outlier))
            if outlier:
                for name, adv in (("grpo", case.grpo), ("gdpo", case.gdpo)):
                    rest_std[name].append(std1(adv[valid[rest]]))
        out["outlier_group_share"].append(mean_or_nan(big))
        for name, values in rest_std.items():
            out[f"outlier_rest_std_{name}"].append(mean_or_nan(values))
    return {name: np.array(values) for name, values in out.items()}


def test_outliers_match_the_loop(case: Case) -> None:
    expected = reference(case)
    assert np.nansum(expected["outlier_group_share"]) > 0, "the case has outlier-dominated groups"
    assert_close(case, expected, rtol=1e-5, atol=1e-6)
