"""outlier_group_share, outlier_lone_share and outlier_rest_std_* against a loop over groups."""

from __future__ import annotations

import numpy as np
import torch

from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import OUTLIER_GAP, OUTLIER_SCALE, ChunkInput, step_statistics
from tests.helpers.stats_cases import Case, assert_close, deviation, mean_or_nan, std1


def pooled_std(case: Case, s: int) -> float:
    """sqrt(sum of squared deviations of the totals from their group means / sum (n_g - 1)), groups of 2+."""
    squares = dof = 0.0
    for rows in case.groups(s):
        valid = rows[case.valid[rows]]
        if len(valid) >= 2:
            squares += float(np.sum(deviation(case.total[valid]) ** 2))
            dof += len(valid) - 1
    return np.sqrt(squares / dof) if dof else np.nan


def reference(case: Case) -> dict[str, np.ndarray]:
    names = ("outlier_group_share", "outlier_lone_share", "outlier_rest_std_grpo", "outlier_rest_std_gdpo")
    out: dict[str, list[float]] = {name: [] for name in names}
    for s in range(case.num_steps):
        pooled = pooled_std(case, s)
        heavy: list[float] = []
        lone: list[float] = []
        rest_std: dict[str, list[float]] = {"grpo": [], "gdpo": []}
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            t = case.total[valid]
            if len(valid) < 4 or np.ptp(t) == 0:
                continue
            extreme = int(np.argmax(np.abs(t - t.mean())))  # the first on ties
            rest = np.delete(np.arange(len(valid)), extreme)
            spread = std1(t[rest])
            distance = abs(t[extreme] - t[rest].mean())
            gap = distance / max(spread, 1e-12)
            outlier = spread > 1e-6 * std1(t) and gap > OUTLIER_GAP and distance > OUTLIER_SCALE * pooled
            is_lone = False
            if outlier:
                # the deciding channel: largest |w_c dev_c| in the extreme row (NaN counts 0), first on ties
                r = case.rewards[valid]
                parts = [abs(case.weights[c] * np.nan_to_num(deviation(r[:, c]))[extreme]) for c in range(r.shape[1])]
                others = r[rest, int(np.argmax(parts))]
                others = others[~np.isnan(others)]
                is_lone = len(others) > 0 and np.ptp(others) == 0
            lone.append(float(is_lone))
            heavy.append(float(outlier and not is_lone))
            if outlier and not is_lone:
                for name, adv in (("grpo", case.grpo), ("gdpo", case.gdpo)):
                    rest_std[name].append(std1(adv[valid[rest]]))
        out["outlier_group_share"].append(mean_or_nan(heavy))
        out["outlier_lone_share"].append(mean_or_nan(lone))
        for name, values in rest_std.items():
            out[f"outlier_rest_std_{name}"].append(mean_or_nan(values))
    return {name: np.array(values) for name, values in out.items()}


def test_outliers_match_the_loop(case: Case) -> None:
    expected = reference(case)
    assert np.nansum(expected["outlier_group_share"]) > 0, "the case has heavy-tailed outlier groups"
    assert np.nansum(expected["outlier_lone_share"]) > 0, "the case has lone outliers"
    assert_close(case, expected, rtol=1e-5, atol=1e-6)


def _statistics(rewards: np.ndarray, group_size: int, weights: list[float]) -> list[dict[str, float]]:
    """Run-level statistics of one step of consecutive groups, on the dense and the general path."""
    r = torch.from_numpy(rewards.astype(np.float32))
    n = r.shape[0]
    gi, si = torch.arange(n) // group_size, torch.zeros(n, dtype=torch.int64)
    w = torch.tensor(weights)
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    chunk = ChunkInput(r, gi, si, w, adv, n // group_size, 1)
    return [
        {k: float(v[0]) for k, v in step_statistics(chunk, allow_dense=dense).items() if v.ndim == 1}
        for dense in (True, False)
    ]


def test_healthy_groups_of_four_are_not_outliers() -> None:
    # Continuous rewards in groups of 4: the gap test alone fires whenever three members happen to be close.
    rng = np.random.default_rng(3)
    rewards = rng.normal(0.0, 1.0, (4 * 4000, 2))
    t = rewards @ np.array([1.0, 0.5])
    groups = t.reshape(-1, 4)
    dev = groups - groups.mean(axis=1, keepdims=True)
    extreme = np.abs(dev).argmax(axis=1)
    rest = np.stack([np.delete(g, e) for g, e in zip(groups, extreme, strict=True)])
    gap = np.abs(groups[np.arange(len(groups)), extreme] - rest.mean(axis=1)) / rest.std(axis=1, ddof=1)
    assert (gap > OUTLIER_GAP).mean() > 0.02, "the gap test alone fires on healthy groups of 4"
    for st in _statistics(rewards, 4, [1.0, 0.5]):
        assert st["outlier_group_share"] + st["outlier_lone_share"] < 0.01  # about 0.6% left, from 8%


def test_a_rare_success_is_a_lone_outlier() -> None:
    # A binary channel with one success in 1 group of 10, the other channel continuous and narrow.
    rng = np.random.default_rng(4)
    rewards = np.stack([np.zeros(80), rng.normal(0.5, 0.01, 80)], axis=1)
    rewards[3, 0] = 1.0
    rewards[13, 0] = 1.0
    for st in _statistics(rewards, 8, [1.0, 1.0]):
        assert st["outlier_lone_share"] == 0.2  # 2 of the 10 groups
        assert st["outlier_group_share"] == 0.0
        assert np.isnan(st["outlier_rest_std_grpo"])
