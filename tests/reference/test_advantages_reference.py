"""The advantage engine against an independent, deliberately naive float64 reference.

Two references live in this file and share nothing with ``collapse_doctor.engine.advantages``:

* ``trl_*_literal``: a line-by-line numpy transcription of TRL's ``GRPOTrainer`` code, which needs the
  contiguous ``view(-1, G)`` layout (equal group sizes, rows sorted by group, one step per call);
* ``reference``: plain Python loops over steps, groups and channels with masks, for any layout,
  including ragged and shuffled rows, NaN rewards and the ``verl`` / ``paper`` conventions.

The engine runs in float32 and must agree with the float64 references to ``atol=1e-5``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages, gdpo_advantages, group_zscores, grpo_advantages

ATOL = 1e-5
NAN = math.nan
EPS = {"trl": 1e-4, "verl": 1e-6, "paper": 0.0}
CONVENTIONS = ("trl", "verl", "paper")
SCALES = ("group", "batch", "none")


# ---------------------------------------------------------------------------------------------------------
# Reference 1: TRL's code, transcribed literally (contiguous layout only)
# ---------------------------------------------------------------------------------------------------------


def trl_sum_then_normalize_literal(
    rewards_per_func: np.ndarray, weights: np.ndarray, group_size: int, scale_rewards: str, eps: float
) -> np.ndarray:
    """TRL ``sum_then_normalize``: weighted nansum, group mean from ``view(-1, G)``, then the scaling."""
    rewards = np.nansum(rewards_per_func * weights, axis=1)
    grouped = rewards.reshape(-1, group_size)
    mean_grouped_rewards = np.repeat(grouped.mean(axis=1), group_size)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards == "group":
        std_rewards = np.repeat(grouped.std(axis=1, ddof=1), group_size)
    elif scale_rewards == "batch":
        std_rewards = np.full_like(rewards, rewards.std(ddof=1))
    else:
        return advantages
    return advantages / (std_rewards + eps)


def trl_normalize_then_sum_literal(
    rewards_per_func: np.ndarray, weights: np.ndarray, group_size: int, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """TRL ``normalize_then_sum``: per-channel nanmean/nanstd z-scores, weighted nansum, batch z-score."""
    z_columns = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k in range(rewards_per_func.shape[1]):
            grouped = rewards_per_func[:, k].reshape(-1, group_size)
            mean_k = np.nanmean(grouped, axis=1, keepdims=True)
            count = np.sum(~np.isnan(grouped), axis=1, keepdims=True)
            variance = np.nanmean((grouped - mean_k) ** 2, axis=1, keepdims=True) * count / (count - 1)
            std_k = np.sqrt(variance)
            z_columns.append(((grouped - mean_k) / (std_k + eps)).reshape(-1))
    z = np.stack(z_columns, axis=1)
    s = np.nansum(z * weights, axis=1)
    return (s - s.mean()) / (s.std(ddof=1) + eps), z


# ---------------------------------------------------------------------------------------------------------
# Reference 2: naive loops (any layout)
# ---------------------------------------------------------------------------------------------------------


def ref_mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and std (ddof=1) of plain floats; std is NaN for one value and exactly 0 for equal values."""
    n = len(values)
    if n == 0:
        return NAN, NAN
    if all(v == values[0] for v in values):
        return values[0], (0.0 if n > 1 else NAN)
    mean = math.fsum(values) / n
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance)


def ref_divide(deviation: float, std: float, convention: str) -> float:
    """deviation / (std + eps); an undefined (one value) or zero denominator carries no signal: 0."""
    if math.isnan(std):
        return 0.0
    denominator = std + EPS[convention]
    if denominator == 0:
        return 0.0
    return deviation / denominator


def ref_group_normalize(
    values: list[float], convention: str, scale: str = "group", batch_std: float = NAN
) -> list[float]:
    """Advantages of the values of one group (NaN-free) under a convention and a scale."""
    if convention == "verl" and len(values) == 1:
        mean, std = 0.0, 1.0  # verl: a single-sample group has mean 0 and std 1
    else:
        mean, std = ref_mean_std(values)
    if scale == "batch":
        std = batch_std
    out = []
    for v in values:
        deviation = v - mean
        out.append(deviation if scale == "none" else ref_divide(deviation, std, convention))
    return out


def ordered_unique(labels: list) -> list:
    seen: list = []
    for label in labels:
        if label not in seen:
            seen.append(label)
    return seen


def reference(
    rewards: np.ndarray,
    groups: list,
    steps: list | None,
    weights: list[float],
    scale: str,
    convention: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grpo, gdpo, zscores) by plain loops; group and step labels may be any hashable values."""
    n, c = rewards.shape
    rows_r = [[float(rewards[i, k]) for k in range(c)] for i in range(n)]
    groups = list(groups)
    steps = [0] * n if steps is None else list(steps)

    valid = [any(not math.isnan(v) for v in row) for row in rows_r]
    total = [NAN] * n
    for i in range(n):
        if valid[i]:
            total[i] = math.fsum(weights[k] * rows_r[i][k] for k in range(c) if not math.isnan(rows_r[i][k]))

    # Per-channel z-scores within each group, NaN where the reward is NaN.
    z = [[NAN] * c for _ in range(n)]
    for g in ordered_unique(groups):
        members = [i for i in range(n) if groups[i] == g]
        for k in range(c):
            present = [i for i in members if not math.isnan(rows_r[i][k])]
            if not present:
                continue
            scores = ref_group_normalize([rows_r[i][k] for i in present], convention)
            for i, score in zip(present, scores, strict=True):
                z[i][k] = score

    fused = [NAN] * n
    for i in range(n):
        if valid[i]:
            fused[i] = math.fsum(weights[k] * z[i][k] for k in range(c) if not math.isnan(z[i][k]))

    grpo = [0.0] * n
    gdpo = [0.0] * n
    for s in ordered_unique(steps):
        step_rows = [i for i in range(n) if steps[i] == s and valid[i]]
        if not step_rows:
            continue
        _, batch_std = ref_mean_std([total[i] for i in step_rows])
        for g in ordered_unique([groups[i] for i in step_rows]):
            members = [i for i in step_rows if groups[i] == g]
            advantages = ref_group_normalize([total[i] for i in members], convention, scale, batch_std)
            for i, a in zip(members, advantages, strict=True):
                grpo[i] = a
        mean, std = ref_mean_std([fused[i] for i in step_rows])
        for i in step_rows:
            gdpo[i] = ref_divide(fused[i] - mean, std, convention)
    return np.array(grpo), np.array(gdpo), np.array(z, dtype=np.float64).reshape(n, c)


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------


def ragged_batch(seed: int, kind: str = "mixed", n_steps: int = 3, max_group: int = 8):
    """Shuffled rows of several steps with ragged groups (sizes 1..max_group), partial and all-NaN rows.

    Channels: format (0/1), correct (0/1) and a third one, continuous (``mixed``) or on a coarse grid
    (``discrete``, many constant groups and ties). Every step keeps at least two rows with a reward.
    """
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    step_of_group: list[int] = []
    for s in range(n_steps):
        for _ in range(int(rng.integers(4, 8))):
            sizes.append(int(rng.integers(1, max_group + 1)))
            step_of_group.append(s)
    sizes[0] = 1  # at least one singleton group
    group = np.repeat(np.arange(len(sizes)), sizes)
    step = np.repeat(np.array(step_of_group), sizes)
    n = group.size
    third = rng.normal(0.5, 1.0, n) if kind == "mixed" else rng.choice([0.0, 0.25, 1.0], n)
    rewards = np.stack(
        [rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float), third], axis=1
    ).astype(np.float32)
    rewards[rng.random((n, 3)) < 0.12] = np.nan  # partial NaN
    rewards[rng.random(n) < 0.06] = np.nan  # all-NaN rows
    rewards[group == step_of_group.index(0) + 1] = np.nan  # a group with no reward at all
    for s in range(n_steps):
        rows = np.flatnonzero(step == s)[:2]
        rewards[rows, 0] = [0.0, 1.0]
    perm = rng.permutation(n)
    return rewards[perm], group[perm], step[perm]


def run_engine(rewards, group, step, weights, scale, convention):
    return compute_advantages(
        torch.from_numpy(np.ascontiguousarray(rewards, dtype=np.float32)),
        torch.from_numpy(np.asarray(group, dtype=np.int64)),
        weights=torch.tensor(weights, dtype=torch.float32),
        step_index=None if step is None else torch.from_numpy(np.asarray(step, dtype=np.int64)),
        scale=scale,
        convention=convention,
    )


def check(got: torch.Tensor, expected: np.ndarray, what: str, atol: float = ATOL) -> None:
    np.testing.assert_allclose(
        got.detach().cpu().double().numpy(), expected, rtol=0, atol=atol, equal_nan=True, err_msg=what
    )


def contiguous_batch(seed: int, group_size: int, n_groups: int = 6, nan: bool = True):
    """Sorted, equal-size groups of continuous rewards; each channel keeps >= 2 values per group."""
    rng = np.random.default_rng(seed)
    n = group_size * n_groups
    rewards = rng.normal([0.5, 1.0, -0.3], [1.0, 0.5, 2.0], size=(n, 3)).astype(np.float32)
    if nan and group_size > 2:
        mask = rng.random((n, 3)) < 0.2
        mask[np.arange(n) % group_size < 2] = False
        mask[mask.all(axis=1), 0] = False  # no all-NaN row: TRL would count it as a total of 0
        rewards[mask] = np.nan
    return rewards


# ---------------------------------------------------------------------------------------------------------
# The references agree with each other
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [2, 4, 8])
@pytest.mark.parametrize("scale", SCALES)
def test_loop_reference_matches_trl_literal(group_size, scale):
    rewards = contiguous_batch(10 + group_size, group_size).astype(np.float64)
    weights = [1.0, 0.5, 2.0]
    groups = list(np.arange(rewards.shape[0]) // group_size)
    grpo, gdpo, z = reference(rewards, groups, None, weights, scale, "trl")
    np.testing.assert_allclose(
        grpo, trl_sum_then_normalize_literal(rewards, np.array(weights), group_size, scale, 1e-4), atol=1e-12
    )
    literal_gdpo, literal_z = trl_normalize_then_sum_literal(rewards, np.array(weights), group_size, 1e-4)
    np.testing.assert_allclose(gdpo, literal_gdpo, atol=1e-12)
    np.testing.assert_allclose(z, literal_z, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# Engine vs TRL's literal code, contiguous layout (rows handed to the engine shuffled)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
@pytest.mark.parametrize("layout", ["shuffled", "in-order"])
def test_engine_matches_trl_literal_contiguous(convention, scale, group_size, layout):
    """On non-degenerate data (no singleton, no zero std) every convention is TRL's formula with its eps.

    ``in-order`` rows take the engine's block path (consecutive equal-size groups), ``shuffled`` the scatter path.
    """
    rewards = contiguous_batch(100 + group_size, group_size)
    weights = np.array([1.0, 0.5, 2.0])
    r64 = rewards.astype(np.float64)
    eps = EPS[convention]
    expected_grpo = trl_sum_then_normalize_literal(r64, weights, group_size, scale, eps)
    expected_gdpo, expected_z = trl_normalize_then_sum_literal(r64, weights, group_size, eps)
    group = np.arange(rewards.shape[0]) // group_size
    n = rewards.shape[0]
    perm = np.arange(n) if layout == "in-order" else np.random.default_rng(group_size).permutation(n)
    res = run_engine(rewards[perm], group[perm], None, weights.tolist(), scale, convention)
    check(res.grpo, expected_grpo[perm], "grpo")
    check(res.gdpo, expected_gdpo[perm], "gdpo")
    check(res.zscores, expected_z[perm], "zscores")


@pytest.mark.parametrize("scale", SCALES)
def test_engine_matches_trl_literal_per_step(scale):
    """Several contiguous steps in one call equal TRL's code run on each step's batch."""
    group_size, n_groups, n_steps = 4, 5, 3
    weights = np.array([1.0, 0.5, 2.0])
    blocks = [contiguous_batch(200 + s, group_size, n_groups) for s in range(n_steps)]
    rewards = np.concatenate(blocks)
    group = np.arange(rewards.shape[0]) // group_size
    step = np.arange(rewards.shape[0]) // (group_size * n_groups)
    expected_grpo = np.concatenate(
        [trl_sum_then_normalize_literal(b.astype(np.float64), weights, group_size, scale, 1e-4) for b in blocks]
    )
    expected_gdpo = np.concatenate(
        [trl_normalize_then_sum_literal(b.astype(np.float64), weights, group_size, 1e-4)[0] for b in blocks]
    )
    for perm in (np.random.default_rng(7).permutation(rewards.shape[0]), np.arange(rewards.shape[0])):
        res = run_engine(rewards[perm], group[perm], step[perm], weights.tolist(), scale, "trl")
        check(res.grpo, expected_grpo[perm], "grpo")
        check(res.gdpo, expected_gdpo[perm], "gdpo")


def test_block_layout_keeps_constant_groups_exactly_zero():
    """Consecutive equal-size groups (the engine's block path): a constant group still gives exactly 0."""
    from collapse_doctor.engine.advantages import Segments

    rewards = np.array([[0.1, 0.7]] * 4 + [[0.3, 0.2], [0.9, 0.1], [0.2, 0.4], [0.5, 0.5]], dtype=np.float32)
    group = np.repeat(np.arange(2), 4)
    assert Segments.build(torch.from_numpy(group)).block == 4
    for convention in CONVENTIONS:
        res = run_engine(rewards, group, None, [1.0, 0.5], "group", convention)
        assert res.grpo[:4].tolist() == [0.0] * 4
        assert res.zscores[:4].tolist() == [[0.0, 0.0]] * 4


# ---------------------------------------------------------------------------------------------------------
# Engine vs the loop reference, ragged / shuffled / NaN / several steps
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["mixed", "discrete"])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_engine_matches_reference_ragged(convention, scale, kind, seed):
    rewards, group, step = ragged_batch(seed, kind)
    weights = [1.0, 0.5, 2.0]
    expected_grpo, expected_gdpo, expected_z = reference(
        rewards.astype(np.float64), list(group), list(step), weights, scale, convention
    )
    res = run_engine(rewards, group, step, weights, scale, convention)
    check(res.grpo, expected_grpo, "grpo")
    check(res.gdpo, expected_gdpo, "gdpo")
    check(res.zscores, expected_z, "zscores")


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_individual_functions_match_reference(convention):
    rewards, group, step = ragged_batch(11, "mixed")
    weights = [1.0, 0.5]  # format=1, correct=0.5
    rewards = rewards[:, :2]
    r = torch.from_numpy(rewards)
    g = torch.from_numpy(group.astype(np.int64))
    s = torch.from_numpy(step.astype(np.int64))
    w = torch.tensor(weights)
    _, expected_gdpo, expected_z = reference(
        rewards.astype(np.float64), list(group), list(step), weights, "group", convention
    )
    check(group_zscores(r, g, convention=convention), expected_z, "group_zscores")
    check(gdpo_advantages(r, g, weights=w, step_index=s, convention=convention), expected_gdpo, "gdpo")
    for scale in SCALES:
        expected_grpo, _, _ = reference(rewards.astype(np.float64), list(group), list(step), weights, scale, convention)
        got = grpo_advantages(r, g, weights=w, step_index=s, scale=scale, convention=convention)
        check(got, expected_grpo, f"grpo scale={scale}")


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_several_steps_equal_separate_runs(convention, scale):
    rewards, group, step = ragged_batch(21, "mixed", n_steps=4)
    weights = [1.0, 0.5, 2.0]
    whole = run_engine(rewards, group, step, weights, scale, convention)
    for s in np.unique(step):
        rows = np.flatnonzero(step == s)
        _, dense = np.unique(group[rows], return_inverse=True)
        part = run_engine(rewards[rows], dense, None, weights, scale, convention)
        check(whole.grpo[rows], part.grpo.double().numpy(), f"grpo step {s}", atol=1e-6)
        check(whole.gdpo[rows], part.gdpo.double().numpy(), f"gdpo step {s}", atol=1e-6)
        check(whole.zscores[rows], part.zscores.double().numpy(), f"zscores step {s}", atol=1e-6)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_string_group_ids(convention, scale):
    """Group and step labels are strings; the test densifies them with np.unique(return_inverse=True)."""
    rewards, group, step = ragged_batch(31, "mixed")
    rng = np.random.default_rng(31)
    names = {g: f"prompt-{rng.integers(10**6):06d}-{g}" for g in np.unique(group)}
    group_labels = [names[g] for g in group]
    step_labels = [f"step-{1000 - 10 * s}" for s in step]  # lexicographic order reverses the steps
    _, group_dense = np.unique(np.array(group_labels), return_inverse=True)
    _, step_dense = np.unique(np.array(step_labels), return_inverse=True)
    weights = [1.0, 0.5, 2.0]
    expected_grpo, expected_gdpo, expected_z = reference(
        rewards.astype(np.float64), group_labels, step_labels, weights, scale, convention
    )
    res = run_engine(rewards, group_dense.reshape(-1), step_dense.reshape(-1), weights, scale, convention)
    check(res.grpo, expected_grpo, "grpo")
    check(res.gdpo, expected_gdpo, "gdpo")
    check(res.zscores, expected_z, "zscores")


# ---------------------------------------------------------------------------------------------------------
# Edge cases, stated directly
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_constant_groups_give_exactly_zero(convention, scale):
    """0.1, 0.7 and 0.3 are not representable; constant groups must still give exactly 0."""
    const_groups = {0: (0.1, 0.7, 0.3), 2: (0.1, 0.1, 0.1), 3: (1e6 + 0.1, -0.3, 0.7)}
    sizes = {0: 3, 1: 4, 2: 5, 3: 7}
    rows, group = [], []
    rng = np.random.default_rng(5)
    for g, size in sizes.items():
        for _ in range(size):
            rows.append(const_groups[g] if g in const_groups else tuple(rng.normal(size=3)))
            group.append(g)
    rewards = np.array(rows, dtype=np.float32)
    group = np.array(group)
    perm = rng.permutation(len(group))
    rewards, group = rewards[perm], group[perm]
    res = run_engine(rewards, group, None, [1.0, 0.5, 2.0], scale, convention)
    constant = np.isin(group, list(const_groups))
    assert (res.grpo.numpy()[constant] == 0).all()
    assert (res.zscores.numpy()[constant] == 0).all()
    assert (res.zscores.numpy()[~constant] != 0).all()


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_constant_step_gives_exactly_zero(convention, scale):
    """A step whose groups are all constant has fused scores all 0: GDPO is exactly 0, in every convention."""
    rewards = np.array([[0.1, 0.3]] * 3 + [[0.7, 0.1]] * 4 + [[0.3, NAN]] * 2, dtype=np.float32)
    group = np.array([0] * 3 + [1] * 4 + [2] * 2)
    res = run_engine(rewards, group, None, [1.0, 0.5], scale, convention)
    assert (res.grpo.numpy() == 0).all()
    assert (res.gdpo.numpy() == 0).all()


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_all_nan_rows_get_zero_and_are_excluded(convention, scale):
    """Documented deviation from TRL: an all-NaN row is not a reward of 0, it is not there at all."""
    rng = np.random.default_rng(3)
    clean = rng.normal(size=(12, 2)).astype(np.float32)
    clean_group = np.repeat(np.arange(4), 3)
    nan_rows = np.full((4, 2), np.nan, dtype=np.float32)
    rewards = np.concatenate([clean, nan_rows])
    group = np.concatenate([clean_group, [0, 0, 2, 3]])
    perm = rng.permutation(len(group))
    res = run_engine(rewards[perm], group[perm], None, [1.0, 0.5], scale, convention)
    without = run_engine(clean, clean_group, None, [1.0, 0.5], scale, convention)
    inverse = np.argsort(perm)
    grpo, gdpo, z = (t.numpy()[inverse] for t in (res.grpo, res.gdpo, res.zscores))
    np.testing.assert_allclose(grpo[:12], without.grpo.numpy(), atol=1e-6)
    np.testing.assert_allclose(gdpo[:12], without.gdpo.numpy(), atol=1e-6)
    np.testing.assert_allclose(z[:12], without.zscores.numpy(), atol=1e-6)
    assert (grpo[12:] == 0).all()
    assert (gdpo[12:] == 0).all()
    assert np.isnan(z[12:]).all()
    # TRL itself would have counted the NaN rows as totals of 0 and moved the baseline.
    trl_style = trl_sum_then_normalize_literal(
        np.concatenate([clean[:3], nan_rows[:1]]).astype(np.float64), np.array([1.0, 0.5]), 4, "group", 1e-4
    )
    assert not np.allclose(trl_style[:3], without.grpo.numpy()[:3], atol=1e-3)


def test_partial_nan_rows_use_nansum_and_nanmean():
    rewards = np.array([[1.0, NAN], [0.0, 1.0], [1.0, 0.0], [NAN, 1.0]], dtype=np.float32)
    group = np.zeros(4, dtype=np.int64)
    weights = [1.0, 0.5]
    res = run_engine(rewards, group, None, weights, "group", "trl")
    totals = np.array([1.0, 0.5, 1.0, 0.5])
    expected_grpo = (totals - totals.mean()) / (totals.std(ddof=1) + 1e-4)
    check(res.grpo, expected_grpo, "grpo")
    col0 = np.array([1.0, 0.0, 1.0])  # rows 0, 1, 2
    col1 = np.array([1.0, 0.0, 1.0])  # rows 1, 2, 3
    z0 = (col0 - col0.mean()) / (col0.std(ddof=1) + 1e-4)
    z1 = (col1 - col1.mean()) / (col1.std(ddof=1) + 1e-4)
    expected_z = np.array([[z0[0], NAN], [z0[1], z1[0]], [z0[2], z1[1]], [NAN, z1[2]]])
    check(res.zscores, expected_z, "zscores")
    s = np.array([z0[0], z0[1] + 0.5 * z1[0], z0[2] + 0.5 * z1[1], 0.5 * z1[2]])
    check(res.gdpo, (s - s.mean()) / (s.std(ddof=1) + 1e-4), "gdpo")


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_zscores_nan_exactly_where_reward_nan(convention):
    """Including channels that are constant, single-valued or absent within a group."""
    rewards = np.array(
        [
            [1.0, NAN, 0.3],  # group 0: channel 1 absent, channel 2 constant
            [0.0, NAN, 0.3],
            [NAN, NAN, 0.3],
            [0.5, 2.0, NAN],  # group 1: channel 1 single-valued, channel 2 single-valued
            [0.5, NAN, 0.7],
            [NAN, 0.4, 0.1],  # group 2: singleton
        ],
        dtype=np.float32,
    )
    group = np.array([0, 0, 0, 1, 1, 2])
    res = run_engine(rewards, group, None, [1.0, 1.0, 1.0], "group", convention)
    z = res.zscores.numpy()
    assert np.array_equal(np.isnan(z), np.isnan(rewards)), f"zscores={z.tolist()}"
    _, _, expected_z = reference(rewards.astype(np.float64), list(group), None, [1.0] * 3, "group", convention)
    check(res.zscores, expected_z, "zscores")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_singleton_groups(convention, scale):
    """TRL and paper: a group of one gives 0. verl: mean 0 and std 1, i.e. the raw value over (1 + 1e-6)."""
    rewards = np.array([[0.3], [1.0], [0.0], [1.0], [0.0], [-0.7]], dtype=np.float32)
    group = np.array([0, 1, 1, 2, 2, 3])
    res = run_engine(rewards, group, None, [1.0], scale, convention)
    singles = np.array([0, 5])
    raw = rewards[singles, 0].astype(np.float64)
    if convention == "verl":
        if scale == "group":
            expected = raw / (1 + 1e-6)
        elif scale == "none":
            expected = raw  # verl with norm_adv_by_std_in_grpo=False: score - mean, mean 0
        else:
            expected = raw / (rewards[:, 0].astype(np.float64).std(ddof=1) + 1e-6)
        expected_z = raw / (1 + 1e-6)
    else:
        expected = np.zeros(2)
        expected_z = np.zeros(2)
    check(res.grpo[singles], expected, f"grpo of singletons, scale={scale}")
    check(res.zscores[singles, 0], expected_z, "zscores of singletons")
    expected_grpo, expected_gdpo, _ = reference(rewards.astype(np.float64), list(group), None, [1.0], scale, convention)
    check(res.grpo, expected_grpo, "grpo")
    check(res.gdpo, expected_gdpo, "gdpo")


def test_paper_zero_std_gives_zero():
    # Batch of constant totals: batch std 0; groups also constant.
    rewards = np.array([[0.1], [0.1], [0.1], [0.1]], dtype=np.float32)
    res = run_engine(rewards, np.array([0, 0, 1, 1]), None, [1.0], "batch", "paper")
    assert (res.grpo.numpy() == 0).all()
    assert (res.gdpo.numpy() == 0).all()
    # Group 0 has spread, group 1 is constant: the constant group's advantages are 0 without eps.
    rewards = np.array([[1.0], [0.0], [0.1], [0.1]], dtype=np.float32)
    res = run_engine(rewards, np.array([0, 0, 1, 1]), None, [1.0], "group", "paper")
    assert np.isfinite(res.grpo.numpy()).all()
    check(res.grpo, np.array([0.5, -0.5, 0, 0]) / math.sqrt(0.5), "grpo")
    assert (res.grpo.numpy()[2:] == 0).all()


def test_weights_format_and_correct():
    """format=1, correct=0.5: a hand-computed group."""
    rewards = np.array([[1, 1], [1, 0], [0, 0], [0, 1]], dtype=np.float32)
    res = run_engine(rewards, np.zeros(4, dtype=np.int64), None, [1.0, 0.5], "group", "trl")
    totals = np.array([1.5, 1.0, 0.0, 0.5])
    check(res.grpo, (totals - 0.75) / (totals.std(ddof=1) + 1e-4), "grpo")
    z = (rewards - 0.5) / (np.sqrt(1 / 3) + 1e-4)
    s = z[:, 0] + 0.5 * z[:, 1]
    check(res.gdpo, (s - s.mean()) / (s.std(ddof=1) + 1e-4), "gdpo")


# ---------------------------------------------------------------------------------------------------------
# The dense (NumPy) engine: the same references, and the torch engine on the same rows
# ---------------------------------------------------------------------------------------------------------


def run_dense_engine(rewards, group_size, step, weights, scale, convention):
    """(grpo, gdpo, zscores) row by row from :class:`collapse_doctor.engine.stats.dense.DenseChunk` (no torch)."""
    from collapse_doctor.engine.stats.dense import DenseChunk, dense_layout

    step = np.asarray(step, dtype=np.int64)
    group = np.arange(rewards.shape[0]) // group_size
    num_steps = int(step.max()) + 1
    assert dense_layout(rewards, group, int(group.max()) + 1, step, num_steps) == group_size
    chunk = DenseChunk(rewards, group_size, step, list(weights), num_steps=num_steps, convention=convention)
    grpo = chunk.advantages["grpo"] if scale == "group" else chunk.grpo_scaled(scale)
    return chunk.rows(grpo), chunk.rows(chunk.advantages["gdpo"]), chunk.rows(chunk.zscores)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
def test_dense_engine_matches_trl_literal_per_step(convention, scale, group_size):
    """Steps of 3, 5 and 4 groups without NaN: each step is TRL's code on that step's batch, to 1e-5."""
    weights = np.array([1.0, 0.5, 2.0])
    blocks = [contiguous_batch(300 + 10 * s + group_size, group_size, n, nan=False) for s, n in enumerate((3, 5, 4))]
    eps = EPS[convention]
    expected = [
        np.concatenate(
            [trl_sum_then_normalize_literal(b.astype(np.float64), weights, group_size, scale, eps) for b in blocks]
        ),
        *(
            np.concatenate(part)
            for part in zip(
                *(trl_normalize_then_sum_literal(b.astype(np.float64), weights, group_size, eps) for b in blocks),
                strict=True,
            )
        ),
    ]
    rewards = np.concatenate(blocks)
    step = np.concatenate([np.full(b.shape[0], s) for s, b in enumerate(blocks)])
    grpo, gdpo, z = run_dense_engine(rewards, group_size, step, weights.tolist(), scale, convention)
    for got, want, what in zip((grpo, gdpo, z), expected, ("grpo", "gdpo", "zscores"), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("seed", [0, 1])
def test_dense_engine_matches_reference_and_torch_on_discrete_rewards(convention, scale, seed):
    """Coarse rewards (constant groups, ties, a constant step): the loop reference to 1e-5, exact zeros where the
    reference has a constant group, and the torch engine on the same rows to 1e-6."""
    rng = np.random.default_rng(seed)
    group_size, groups_per_step = 4, (6, 3, 5)
    n = group_size * sum(groups_per_step)
    rewards = np.stack(
        [rng.integers(0, 2, n), rng.choice([0.0, 0.25, 1.0], n), rng.integers(0, 3, n) * 0.5], axis=1
    ).astype(np.float32)
    rewards[: group_size * 2] = [1.0, 0.25, 0.5]  # two constant groups
    step = np.repeat(np.arange(3), [group_size * k for k in groups_per_step])
    rewards[step == 1] = [0.0, 1.0, 1.0]  # a constant step
    weights = [1.0, 0.5, 2.0]
    grpo, gdpo, z = run_dense_engine(rewards, group_size, step, weights, scale, convention)
    groups = list(np.arange(n) // group_size)
    expected_grpo, expected_gdpo, expected_z = reference(
        rewards.astype(np.float64), groups, list(step), weights, scale, convention
    )
    np.testing.assert_allclose(grpo, expected_grpo, rtol=0, atol=ATOL)
    np.testing.assert_allclose(gdpo, expected_gdpo, rtol=0, atol=ATOL)
    np.testing.assert_allclose(z, expected_z, rtol=0, atol=ATOL)
    assert grpo[: group_size * 2].tolist() == [0.0] * (group_size * 2)
    assert z[: group_size * 2].tolist() == [[0.0] * 3] * (group_size * 2)
    assert gdpo[step == 1].tolist() == [0.0] * int((step == 1).sum())
    torch_res = run_engine(rewards, np.arange(n) // group_size, step, weights, scale, convention)
    for got, other in ((grpo, torch_res.grpo), (gdpo, torch_res.gdpo), (z, torch_res.zscores)):
        np.testing.assert_allclose(got, other.numpy(), rtol=0, atol=1e-6)
