"""differing_pairs, tied_pair_share(_gdpo) and distinct_ratio_* against loops over the pairs of each group."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import ADV_TIE_QUANTUM, DISTINCT_QUANTUM, TIE_QUANTUM, ChunkInput, step_statistics
from tests.helpers.stats_cases import Case, assert_close, mean_or_nan


def bins(values: np.ndarray, quantum: float) -> tuple[float, ...]:
    """Values as bins of width ``quantum``; NaN is a bin of its own."""
    return tuple(np.where(np.isnan(values), np.inf, np.round(values / quantum)).tolist())


def reference(case: Case) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {
        "differing_pairs": [],
        "tied_pair_share": [],
        "tied_pair_share_gdpo": [],
        "distinct_ratio_grpo": [],
        "distinct_ratio_gdpo": [],
    }
    for s in range(case.num_steps):
        differing = tied = tied_gdpo = 0
        distinct: dict[str, list[float]] = {"grpo": [], "gdpo": []}
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            for i, j in combinations(valid, 2):
                if bins(case.rewards[i], TIE_QUANTUM) != bins(case.rewards[j], TIE_QUANTUM):
                    differing += 1
                    tied += bins(case.total[[i]], TIE_QUANTUM) == bins(case.total[[j]], TIE_QUANTUM)
                    tied_gdpo += bins(case.gdpo[[i]], ADV_TIE_QUANTUM) == bins(case.gdpo[[j]], ADV_TIE_QUANTUM)
            if len(valid) >= 2 and np.ptp(case.total[valid]) > 0:
                for name, adv in (("grpo", case.grpo), ("gdpo", case.gdpo)):
                    values = {bins(adv[[i]], DISTINCT_QUANTUM) for i in valid}
                    distinct[name].append(len(values) / len(valid))
        out["differing_pairs"].append(float(differing))
        out["tied_pair_share"].append(tied / differing if differing else np.nan)
        out["tied_pair_share_gdpo"].append(tied_gdpo / differing if differing else np.nan)
        for name, ratios in distinct.items():
            out[f"distinct_ratio_{name}"].append(mean_or_nan(ratios))
    return {name: np.array(values) for name, values in out.items()}


def test_ties_match_the_pair_loop(case: Case) -> None:
    expected = reference(case)
    assert np.nansum(expected["tied_pair_share"]) > 0, "the case has tied totals"
    if np.isnan(case.rewards).any():
        assert np.nansum(expected["tied_pair_share_gdpo"]) > 0, "the case has tied GDPO advantages"
    assert_close(case, expected, rtol=1e-6, atol=1e-9)


def _one_group(rewards: list[list[float]], weights: tuple[float, ...]) -> dict[str, float]:
    r = torch.tensor(rewards, dtype=torch.float32)
    n = r.shape[0]
    gi, si = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    w = torch.tensor(weights)
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    out = [step_statistics(ChunkInput(r, gi, si, w, adv, 1, 1), allow_dense=d) for d in (True, False)]
    names = ("differing_pairs", "tied_pair_share", "tied_pair_share_gdpo")
    assert [out[0][k].tolist() for k in names] == [out[1][k].tolist() for k in names]  # dense and general
    return {k: float(out[0][k][0]) for k in names}


@pytest.mark.parametrize(
    ("rewards", "weights", "differing", "grpo", "gdpo"),
    [
        # complementary binaries, equal weights: every differing pair ties under both
        ([[1, 0], [0, 1], [0, 1], [1, 0]], (1.0, 1.0), 4, 1.0, 1.0),
        # complementary binaries, unequal weights: under neither
        ([[1, 0], [0, 1], [0, 1], [1, 0]], (1.0, 2.0), 4, 0.0, 0.0),
        # (1,0)-(0,1) with A and B distributed alike in the group: ties under both
        ([[1, 0], [0, 1], [1, 1], [0, 0]], (1.0, 1.0), 6, 1 / 6, 1 / 6),
        # A on 3 of 4 rows, B on 2: the pairs (1,0)-(0,1) tie under GRPO only
        ([[1, 0], [0, 1], [1, 1], [1, 0]], (1.0, 1.0), 5, 2 / 5, 0.0),
        # three channels, totals 1 on 4 rows: 5 differing pairs tie under GRPO; under GDPO only (1,0,0)-(0,1,0)
        # (twice), as A (on 3 of 5 rows) and B (2 of 5) mirror each other while C (1 of 5) does not
        ([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 0]], (1.0, 1.0, 1.0), 9, 5 / 9, 2 / 9),
    ],
)
def test_ties_under_each_algorithm(
    rewards: list[list[float]], weights: tuple[float, ...], differing: int, grpo: float, gdpo: float
) -> None:
    st = _one_group(rewards, weights)
    assert st["differing_pairs"] == differing
    assert st["tied_pair_share"] == pytest.approx(grpo)
    assert st["tied_pair_share_gdpo"] == pytest.approx(gdpo)


def test_rows_without_reward_are_not_advantage_values() -> None:
    # Totals 0, 1, 2: the middle row's advantage is 0, like the all-NaN row's; three distinct values on 3 rows.
    nan = float("nan")
    r = torch.tensor([[0.0], [1.0], [2.0], [nan]])
    gi, si = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    w = torch.ones(1)
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    st = step_statistics(ChunkInput(r, gi, si, w, adv, 1, 1))
    assert st["distinct_ratio_grpo"].tolist() == [1.0]
    assert st["distinct_ratio_gdpo"].tolist() == [1.0]
