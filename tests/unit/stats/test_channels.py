"""rel_gain, reward_std, channel_zero_var_share and reward_mean against a loop over groups and channels."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close, mean_or_nan, std1


def reference(case: Case) -> dict[str, np.ndarray]:
    shape = (case.num_steps, case.num_channels)
    out = {name: np.full(shape, np.nan) for name in ("rel_gain", "reward_std", "channel_zero_var_share", "reward_mean")}
    for s in range(case.num_steps):
        for c in range(case.num_channels):
            spans, stds, constant = [], [], []
            for rows in case.groups(s):
                x = case.rewards[rows, c]
                x = x[~np.isnan(x)]
                if len(x) < 2:
                    continue  # a channel with fewer than two values in the group does not count
                spans.append(x.max() - x.min())
                stds.append(std1(x))
                constant.append(float(np.ptp(x) == 0))
            out["rel_gain"][s, c] = mean_or_nan(spans)
            out["reward_std"][s, c] = mean_or_nan(stds)
            out["channel_zero_var_share"][s, c] = mean_or_nan(constant)
            values = case.rewards[case.step == s, c]
            out["reward_mean"][s, c] = mean_or_nan(list(values[~np.isnan(values)]))
    return out


def test_channel_statistics_match_the_loop(case: Case) -> None:
    assert_close(case, reference(case))
