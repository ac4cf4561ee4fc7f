"""Silent groups, rows without advantage, all-pass / all-fail groups: a loop over groups, and hand cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import SILENT_SPAN, ChunkInput, step_statistics
from tests.helpers.stats_cases import Case, assert_close

ALGORITHMS = ("grpo", "gdpo")


def reference(case: Case) -> dict[str, np.ndarray]:
    keys = ("silent_groups", "zero_adv_rows", "all_pass_groups", "all_fail_groups")
    out = {f"{key}_{a}": np.zeros(case.num_steps) for a in ALGORITHMS for key in keys}
    for s in range(case.num_steps):
        in_step = case.rewards[case.step == s]
        with np.errstate(all="ignore"):
            high, low = np.nanmax(in_step, axis=0), np.nanmin(in_step, axis=0)
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            r = case.rewards[valid]
            present = [c for c in range(case.num_channels) if (~np.isnan(r[:, c])).any()]
            at_max = all(np.all(r[~np.isnan(r[:, c]), c] == high[c]) for c in present)
            at_min = all(np.all(r[~np.isnan(r[:, c]), c] == low[c]) for c in present)
            for a in ALGORITHMS:
                adv = getattr(case, a)[valid]
                if len(valid) == 1:
                    out[f"zero_adv_rows_{a}"][s] += 1
                if len(valid) < 2 or np.ptp(adv) >= SILENT_SPAN:
                    # a row of a group that ranks can still sit at its group's mean: no gradient for it
                    out[f"zero_adv_rows_{a}"][s] += np.sum(np.abs(adv) < SILENT_SPAN) if len(valid) >= 2 else 0
                    continue
                out[f"silent_groups_{a}"][s] += 1
                out[f"zero_adv_rows_{a}"][s] += len(valid)
                out[f"all_pass_groups_{a}"][s] += at_max
                out[f"all_fail_groups_{a}"][s] += at_min
    return out


def test_silence_matches_the_loop(case: Case) -> None:
    expected = reference(case)
    for a in ALGORITHMS:
        assert expected[f"all_pass_groups_{a}"].sum() > 0 and expected[f"all_fail_groups_{a}"].sum() > 0
        assert expected[f"silent_groups_{a}"].sum() > expected[f"all_pass_groups_{a}"].sum()
    assert_close(case, expected, rtol=0, atol=0)


def _one_step(rewards: list[list[float]], group: list[int], weights: tuple[float, ...]) -> dict[str, float]:
    r = torch.tensor(rewards, dtype=torch.float32)
    gi, si = torch.tensor(group), torch.zeros(len(group), dtype=torch.int64)
    w = torch.tensor(weights)
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    chunk = ChunkInput(r, gi, si, w, adv, int(gi.max()) + 1, 1)
    stats = step_statistics(chunk)
    return {k: float(v[0]) for k, v in stats.items() if v.ndim == 1}


# Group 0: complementary binaries (B = 1 - A); group 1: both channels vary freely (the step's contrast).
COMPLEMENTARY: list[list[float]] = [[1, 0], [0, 1], [0, 1], [1, 0], [1, 1], [0, 0], [1, 1], [1, 0]]


@pytest.mark.parametrize(
    ("weights", "silent_grpo", "silent_gdpo"),
    [((1.0, 1.0), 1.0, 1.0), ((1.0, 2.0), 0.0, 0.0)],
)
def test_complementary_binaries(weights: tuple[float, float], silent_grpo: float, silent_gdpo: float) -> None:
    # Equal weights: constant totals (GRPO 0) and z_B = -z_A (GDPO's fused sum 0); unequal: neither.
    st = _one_step(COMPLEMENTARY, [0, 0, 0, 0, 1, 1, 1, 1], weights)
    assert (st["silent_groups_grpo"], st["silent_groups_gdpo"]) == (silent_grpo, silent_gdpo)
    assert st["zero_adv_rows_grpo"] == 4 * silent_grpo
    assert st["all_pass_groups_grpo"] == st["all_fail_groups_gdpo"] == 0  # silent, yet neither all-pass nor fail
    assert st["eligible_groups"] == 2


def test_nan_rewards_silence_gdpo_only_and_groups_of_one() -> None:
    # Group 0: channel b is 1 where present, channel a constant: GDPO's z-scores are all 0, but TRL's nansum
    # leaves the row without b one reward short, so GRPO ranks the rows. Group 1 is a single row.
    nan = float("nan")
    rewards: list[list[float]] = [[1, 1], [1, nan], [1, 1], [0, 0], [1, 0.5], [0, 1], [1, 0]]
    st = _one_step(rewards, [0, 0, 0, 1, 2, 2, 2], (1.0, 1.0))
    assert (st["silent_groups_grpo"], st["silent_groups_gdpo"]) == (0.0, 1.0)
    assert (st["zero_adv_rows_grpo"], st["zero_adv_rows_gdpo"]) == (1.0, 4.0)
    assert (st["all_pass_groups_grpo"], st["all_pass_groups_gdpo"]) == (0.0, 1.0)  # both channels at their max
    assert st["all_fail_groups_gdpo"] == 0.0
    assert (st["valid_rows"], st["eligible_groups"]) == (7.0, 2.0)


def test_all_fail_and_all_pass_need_every_channel_at_its_extreme() -> None:
    rewards: list[list[float]] = [[0, 0.1]] * 4 + [[1, 0.9]] * 4 + [[0, 0.9]] * 4
    rewards += [[1, 0.5], [0, 0.2], [1, 0.3], [0, 0.4]]
    st = _one_step(rewards, [k // 4 for k in range(16)], (1.0, 0.5))
    assert st["silent_groups_grpo"] == st["silent_groups_gdpo"] == 3.0
    assert st["all_fail_groups_grpo"] == st["all_pass_groups_grpo"] == 1.0  # (0, 0.1) and (1, 0.9); not (0, 0.9)
    assert st["zero_adv_rows_gdpo"] == 12.0
