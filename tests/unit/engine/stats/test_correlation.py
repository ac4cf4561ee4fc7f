"""corr_sxy / corr_sxx / corr_syy / within_corr and their support against a loop over groups and pairs."""

from __future__ import annotations

from itertools import combinations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close, deviation


def reference(case: Case) -> dict[str, np.ndarray]:
    pairs = list(combinations(range(case.num_channels), 2))
    shape = (case.num_steps, len(pairs))
    sxy, sxx, syy = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    rows_with_both, groups_with_both = np.zeros(shape), np.zeros(shape)
    for s in range(case.num_steps):
        for rows in case.groups(s):
            r = case.rewards[rows]
            dev = [deviation(r[:, c]) for c in range(case.num_channels)]  # each channel's own group mean
            for k, (i, j) in enumerate(pairs):
                both = ~np.isnan(r[:, i]) & ~np.isnan(r[:, j])
                sxy[s, k] += np.sum(dev[i][both] * dev[j][both])
                sxx[s, k] += np.sum(dev[i][both] ** 2)
                syy[s, k] += np.sum(dev[j][both] ** 2)
                if both.sum() >= 2:
                    rows_with_both[s, k] += both.sum()
                    groups_with_both[s, k] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(sxx * syy > 0, sxy / np.sqrt(sxx * syy), np.nan)
    return {
        "corr_sxy": sxy,
        "corr_sxx": sxx,
        "corr_syy": syy,
        "within_corr": corr,
        "corr_rows": rows_with_both,
        "corr_groups": groups_with_both,
    }


def test_within_group_correlation_matches_the_loop(case: Case) -> None:
    assert_close(case, reference(case), rtol=1e-4, atol=1e-4)
