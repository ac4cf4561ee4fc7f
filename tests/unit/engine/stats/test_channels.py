"""The per-channel statistics (spread, mean, extremes, supports, floor and ceiling) against a loop over groups."""

from __future__ import annotations

import numpy as np

from collapse_doctor.engine.stats.channels import NAMES
from tests.helpers.stats_cases import Case, assert_close, mean_or_nan, std1


def reference(case: Case) -> dict[str, np.ndarray]:
    shape = (case.num_steps, case.num_channels)
    out = {name: np.full(shape, np.nan) for name in NAMES}
    for s in range(case.num_steps):
        for c in range(case.num_channels):
            values = case.rewards[case.step == s, c]
            values = values[~np.isnan(values)]
            high = values.max() if len(values) else np.nan
            low = values.min() if len(values) else np.nan
            spans, stds, constant, at_max, at_min = [], [], [], 0, 0
            for rows in case.groups(s):
                x = case.rewards[rows, c]
                x = x[~np.isnan(x)]
                if len(x) < 2:
                    continue  # a channel with fewer than two values in the group does not count
                spans.append(x.max() - x.min())
                stds.append(std1(x))
                constant.append(float(np.ptp(x) == 0))
                at_max += bool(np.all(x == high))
                at_min += bool(np.all(x == low))
            out["rel_gain"][s, c] = mean_or_nan(spans)
            out["reward_std"][s, c] = mean_or_nan(stds)
            out["channel_zero_var_share"][s, c] = mean_or_nan(constant)
            out["reward_mean"][s, c] = mean_or_nan(list(values))
            out["reward_max"][s, c], out["reward_min"][s, c] = high, low
            out["channel_rows"][s, c] = len(values)
            out["channel_groups"][s, c] = len(spans)
            out["channel_at_max_groups"][s, c] = at_max
            out["channel_at_min_groups"][s, c] = at_min
    return out


def test_channel_statistics_match_the_loop(case: Case) -> None:
    expected = reference(case)
    assert expected["channel_at_max_groups"].sum() > 0 and expected["channel_at_min_groups"].sum() > 0
    assert_close(case, expected)
    for name in ("channel_rows", "channel_groups", "channel_at_max_groups", "channel_at_min_groups"):
        np.testing.assert_array_equal(case.stats[name], expected[name], err_msg=name)
