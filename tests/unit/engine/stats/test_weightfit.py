"""The weight-fit matrices against a loop over groups, and the weights a solver recovers from them."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages, grpo_advantages
from collapse_doctor.engine.stats import ChunkInput, step_statistics
from tests.helpers.stats_cases import Case, deviation

ALGORITHMS = ("grpo", "gdpo")


def projected(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    """X^T (I - a a^T / |a|^2) X."""
    p = np.eye(len(a)) - np.outer(a, a) / (a @ a)
    return x.T @ p @ x


def reference(case: Case) -> dict[str, np.ndarray]:
    logged = case.logged
    assert logged is not None
    S, C = case.num_steps, case.num_channels
    m = {a: np.zeros((S, C, C)) for a in ALGORITHMS}
    norm = {a: np.zeros(S) for a in ALGORITHMS}
    z = np.nan_to_num(case.zscores)
    for s in range(S):
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            if len(valid) < 2:
                continue
            # TRL's nansum reads a missing reward as 0: centre those values over the group's valid rows
            d = np.stack([deviation(np.nan_to_num(case.rewards[valid, c])) for c in range(C)], axis=1)
            has = ~np.isnan(logged[valid])
            a = logged[valid][has]
            if a @ a > 0:
                m["grpo"][s] += projected(d[has], a)
                norm["grpo"][s] += np.trace(d[has].T @ d[has])
        rows = np.flatnonzero((case.step == s) & case.valid & ~np.isnan(logged))
        a = logged[rows]
        if a @ a > 0:
            m["gdpo"][s] = projected(z[rows], a)
            norm["gdpo"][s] = np.trace(z[rows].T @ z[rows])
    pairs = list(combinations(range(C), 2))
    out: dict[str, np.ndarray] = {}
    for name in ALGORITHMS:
        out[f"wfit_{name}_diag"] = np.stack([m[name][:, k, k] for k in range(C)], axis=1)
        out[f"wfit_{name}_off"] = np.stack([m[name][:, i, j] for i, j in pairs], axis=1)
        out[f"wfit_{name}_norm"] = norm[name]
    return out


def test_weight_fit_matches_the_loop(case: Case) -> None:
    expected = reference(case)
    for name, want in expected.items():
        scale = expected[f"wfit_{name.split('_')[1]}_norm"].max()
        np.testing.assert_allclose(case.stats[name], want, rtol=1e-4, atol=1e-6 * scale, err_msg=name)


def test_weight_fit_needs_a_logged_advantage() -> None:
    from tests.helpers.stats_cases import make_case

    assert not any(name.startswith("wfit_") for name in make_case("messy").stats)


def _run(weights: list[float], *, algorithm: str, layout: str, scale: str = "group", seed: int = 0) -> ChunkInput:
    """Three steps of groups of 8 whose logged advantage was computed with ``weights``; the chunk's own
    weights (what the scan assumes) are all 1."""
    rng = np.random.default_rng(seed)
    C, groups, g = len(weights), 3 * 40, 8
    n = groups * g
    rewards = np.stack([rng.integers(0, 2, n).astype(float), rng.random(n), rng.normal(0, 1, n)][:C], axis=1)
    rewards[: 3 * g] = 1.0  # constant groups
    group = np.arange(n) // g
    step = group * 3 // groups
    if layout == "messy":
        rewards[rng.random(n) < 0.1, 0] = np.nan
        rewards[rng.random(n) < 0.03] = np.nan
        order = rng.permutation(n)
        rewards, group, step = rewards[order], group[order], step[order]
    r = torch.from_numpy(rewards.astype(np.float32))
    gi, si = torch.from_numpy(group), torch.from_numpy(step)
    used = torch.tensor(weights)
    if algorithm == "grpo":
        logged = grpo_advantages(r, gi, weights=used, step_index=si, scale=scale)  # type: ignore[arg-type]
    else:
        logged = compute_advantages(r, gi, weights=used, step_index=si).gdpo
    assumed = torch.ones(C)
    adv = compute_advantages(r, gi, weights=assumed, step_index=si)
    return ChunkInput(r, gi, si, assumed, adv, groups, 3, logged)


def _accumulated(chunk: ChunkInput, algorithm: str, allow_dense: bool) -> tuple[np.ndarray, float]:
    """The fit matrix summed over steps and its norm."""
    st = step_statistics(chunk, allow_dense=allow_dense)
    C = chunk.rewards.shape[1]
    m = np.diag(st[f"wfit_{algorithm}_diag"].sum(axis=0))
    for k, (i, j) in enumerate(combinations(range(C), 2)):
        m[i, j] = m[j, i] = st[f"wfit_{algorithm}_off"][:, k].sum()
    return m, float(st[f"wfit_{algorithm}_norm"].sum())


def solve(m: np.ndarray) -> np.ndarray:
    """The weights minimising w^T M w with w_1 = 1."""
    rest = np.linalg.solve(m[1:, 1:], -m[1:, 0])
    return np.concatenate([[1.0], rest])


def residual(m: np.ndarray, norm: float, w: np.ndarray) -> float:
    return float(w @ m @ w / (w @ w * norm))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("layout", "allow_dense"), [("dense", True), ("dense", False), ("messy", False)])
@pytest.mark.parametrize("weights", [[1.0, 0.2], [1.0, 0.2, 0.5]])
def test_the_weights_used_are_recovered(algorithm: str, layout: str, allow_dense: bool, weights: list[float]) -> None:
    chunk = _run(weights, algorithm=algorithm, layout=layout)
    m, norm = _accumulated(chunk, algorithm, allow_dense)
    fitted = solve(m)
    np.testing.assert_allclose(fitted, weights, atol=1e-4)
    assert residual(m, norm, fitted) < 1e-7  # float32 rounding; wrong weights give 1e-2 and more
    assert residual(m, norm, np.ones(len(weights))) > 1e-3  # equal weights do not fit


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_grpo_fit_holds_for_every_scaling(scale: str) -> None:
    m, _ = _accumulated(_run([1.0, 0.2], algorithm="grpo", layout="dense", scale=scale), "grpo", True)
    np.testing.assert_allclose(solve(m), [1.0, 0.2], atol=1e-4)


def test_the_other_algorithm_does_not_fit() -> None:
    # A GDPO-logged advantage leaves a large GRPO residual at any weights, and the reverse.
    for logged_by, fitted_as in (("gdpo", "grpo"), ("grpo", "gdpo")):
        m, norm = _accumulated(_run([1.0, 0.2], algorithm=logged_by, layout="dense"), fitted_as, True)
        assert residual(m, norm, solve(m)) > 1e-5  # against < 1e-9 for the algorithm that logged it
