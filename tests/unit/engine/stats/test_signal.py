"""zero_var_share, gdpo_zero_var_share and the signal shares against a loop over groups."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close, deviation, mean_or_nan


def reference(case: Case) -> dict[str, np.ndarray]:
    S, C = case.num_steps, case.num_channels
    w = case.weights
    z = np.nan_to_num(case.zscores)
    fused = (z * w).sum(axis=1)
    out = {
        "zero_var_share": np.full(S, np.nan),
        "gdpo_zero_var_share": np.full(S, np.nan),
        "signal_share_grpo": np.full((S, C), np.nan),
        "signal_share_gdpo": np.full((S, C), np.nan),
    }
    for s in range(S):
        flat_total, flat_channels = [], []
        num_grpo, den_grpo = np.zeros(C), 0.0
        num_gdpo, den_gdpo = np.zeros(C), 0.0
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            if len(valid) >= 2:
                flat_total.append(float(np.ptp(case.total[valid]) == 0))
                # GDPO sees no signal when no channel varies among the values it has in the group.
                varies = [np.ptp(x[~np.isnan(x)]) > 0 for x in case.rewards[valid].T if (~np.isnan(x)).sum() >= 2]
                flat_channels.append(float(not any(varies)))
            if len(valid) == 0:
                continue
            dev_t = deviation(case.total[valid])
            for c in range(C):
                dev_c = np.nan_to_num(deviation(case.rewards[valid, c]))
                num_grpo[c] += np.sum(w[c] * dev_c * dev_t)
                num_gdpo[c] += np.sum(w[c] * z[valid, c] * fused[valid])
            den_grpo += np.sum(dev_t**2)
            den_gdpo += np.sum(fused[valid] ** 2)
        out["zero_var_share"][s] = mean_or_nan(flat_total)
        out["gdpo_zero_var_share"][s] = mean_or_nan(flat_channels)
        if den_grpo > 0:
            out["signal_share_grpo"][s] = num_grpo / den_grpo
        if den_gdpo > 0:
            out["signal_share_gdpo"][s] = num_gdpo / den_gdpo
    return out


def test_signal_statistics_match_the_loop(case: Case) -> None:
    assert_close(case, reference(case), rtol=1e-4, atol=1e-5)


def test_signal_shares_sum_to_one(case: Case) -> None:
    # GDPO's fused sum is the weighted sum of the z-scores; GRPO's total that of the deviations without NaN.
    names = ["signal_share_gdpo"] + ([] if np.isnan(case.rewards).any() else ["signal_share_grpo"])
    for name in names:
        np.testing.assert_allclose(case.stats[name].sum(axis=1), 1.0, rtol=1e-4, err_msg=name)
