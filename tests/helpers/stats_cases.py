"""Chunks for the statistics tests, and the numpy view the loop references read.

Three layouts: ``dense`` (consecutive groups of one size without NaN: the dense path), the same chunk forced
through the general path, and ``messy`` (ragged groups, groups of one, rows shuffled across the chunk, NaN
rewards, rows with no reward at all). Rewards mix a binary channel, a continuous one and one on a grid of
0.25 (so totals tie exactly), with constant groups (one at every channel's step maximum, one at every
channel's step minimum), groups where one channel is constant, groups whose totals tie, heavy-tailed outlier
groups (an extreme value on a channel that varies), lone outliers (one success on a channel constant on
the rest of the group) and (messy) rows that tie under GDPO but not under GRPO.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import ChunkInput, dense_group_size, step_statistics

WEIGHTS = (1.0, 0.5, 2.0, 0.25)
LAYOUTS = ("dense", "dense-as-general", "messy")


@dataclass
class Case:
    """A chunk, how to reduce it, and its columns as float64 numpy arrays."""

    chunk: ChunkInput
    allow_dense: bool
    rewards: np.ndarray = field(init=False)
    group: np.ndarray = field(init=False)
    step: np.ndarray = field(init=False)
    weights: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.rewards = self.chunk.rewards.double().numpy()
        self.group = self.chunk.group_index.numpy()
        self.step = self.chunk.step_index.numpy()
        self.weights = self.chunk.weights.double().numpy()

    @property
    def num_steps(self) -> int:
        return self.chunk.num_steps

    @property
    def num_channels(self) -> int:
        return self.rewards.shape[1]

    @cached_property
    def stats(self) -> dict[str, np.ndarray]:
        return step_statistics(self.chunk, allow_dense=self.allow_dense)

    @property
    def grpo(self) -> np.ndarray:
        return self.chunk.advantages.grpo.double().numpy()

    @property
    def gdpo(self) -> np.ndarray:
        return self.chunk.advantages.gdpo.double().numpy()

    @property
    def zscores(self) -> np.ndarray:
        """``[N, C]`` the input's per-channel group z-scores, NaN where the reward is NaN."""
        return self.chunk.advantages.zscores.double().numpy()

    @property
    def logged(self) -> np.ndarray | None:
        return None if self.chunk.logged is None else self.chunk.logged.double().numpy()

    @cached_property
    def valid(self) -> np.ndarray:
        """Rows with at least one reward."""
        return ~np.isnan(self.rewards).all(axis=1)

    @cached_property
    def total(self) -> np.ndarray:
        """Weighted total reward per row (NaN rewards skipped), NaN on rows without any reward."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            total = np.nansum(self.rewards * self.weights, axis=1)
        return np.where(self.valid, total, np.nan)

    def groups(self, s: int) -> Iterator[np.ndarray]:
        """The groups of step ``s``, each as its row positions in ascending order."""
        in_step = np.flatnonzero(self.step == s)
        for g in np.unique(self.group[in_step]):
            yield np.flatnonzero(self.group == g)


def deviation(values: np.ndarray) -> np.ndarray:
    """Values minus their mean, ignoring NaN (which stay NaN); exactly 0 for equal values."""
    present = ~np.isnan(values)
    out = np.full(values.shape, np.nan)
    if present.any():
        x = values[present]
        out[present] = 0.0 if np.ptp(x) == 0 else x - x.mean()
    return out


def std1(values: np.ndarray) -> float:
    """Sample std (ddof=1) of the non-NaN values: NaN for fewer than two, exactly 0 for equal values."""
    x = values[~np.isnan(values)]
    if len(x) < 2:
        return np.nan
    return 0.0 if np.ptp(x) == 0 else float(x.std(ddof=1))


def _rewards(rng: np.random.Generator, sizes: list[int], channels: int, *, messy: bool) -> np.ndarray:
    n = sum(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    grid = rng.integers(0, 9, n) * 0.25
    third = rng.normal(0.0, 1.0, n) if messy else grid  # no exact grid ties in ragged groups (dominance)
    data = np.stack([rng.integers(0, 2, n).astype(float), rng.random(n), third, grid][:channels], axis=1)
    for k, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        rows = slice(start, start + size)
        if k < 3:
            data[rows] = 1.0  # constant groups
        elif k == 3:
            data[rows, -1] = 0.25  # a constant channel
        elif k % 5 == 4 and channels > 1:
            data[rows, 1] = 0.5  # totals of the binary and grid channels tie
            if messy and channels > 2:
                data[rows, 2] = grid[rows]
        elif k % 6 == 5 and size >= 4:
            # an outlier, far from the rest of its group or near OUTLIER_GAP stds of it
            bump = (40.0, 20.0, 14.0, 10.0)[k // 6 % 4] * (4.0 if messy else 1.0)  # messy: a wide third channel
            data[start + k % size, min(1, channels - 1)] += bump
        elif k % 7 == 6 and size >= 4:
            # a lone outlier: one large success on the binary channel, which is 0 on the rest of the group
            data[rows, 0] = 0.0
            data[start + k % size, 0] = 20.0
    return data


def _saturate(data: np.ndarray, group: np.ndarray, step: np.ndarray) -> None:
    """Group 1 constant at every channel's maximum over its step, group 2 at every channel's minimum."""
    for k, extreme in ((1, np.nanmax), (2, np.nanmin)):
        rows = group == k
        in_step = step == step[rows][0]
        data[rows] = extreme(data[in_step], axis=0)


def _chunk(data: np.ndarray, group: np.ndarray, step: np.ndarray, *, logged: bool, seed: int) -> ChunkInput:
    r = torch.from_numpy(data.astype(np.float32))
    gi, si = torch.from_numpy(group), torch.from_numpy(step)
    w = torch.tensor(WEIGHTS[: r.shape[1]])
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    log = None
    if logged:
        noise = torch.from_numpy(np.random.default_rng(seed).normal(0.0, 0.05, len(data)).astype(np.float32))
        log = adv.grpo * 1.3 + noise
        log[::11] = float("nan")
    return ChunkInput(r, gi, si, w, adv, int(group.max()) + 1, int(step.max()) + 1, log)


def dense_case(
    *,
    seed: int = 0,
    group_size: int = 8,
    channels: int = 3,
    groups_per_step: tuple[int, ...] = (9, 12, 7, 10),
    logged: bool = False,
    allow_dense: bool = True,
) -> Case:
    rng = np.random.default_rng(seed)
    num_groups = sum(groups_per_step)
    data = _rewards(rng, [group_size] * num_groups, channels, messy=False)
    group = np.repeat(np.arange(num_groups), group_size)
    step = np.repeat(np.arange(len(groups_per_step)), np.array(groups_per_step) * group_size)
    _saturate(data, group, step)
    chunk = _chunk(data, group, step, logged=logged, seed=seed)
    assert dense_group_size(chunk) == group_size
    return Case(chunk, allow_dense)


def messy_case(*, seed: int = 0, channels: int = 3, steps: int = 4, logged: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    num_groups = 12 * steps
    sizes = [int(s) for s in rng.integers(1, 13, num_groups)]
    for k in [3, *range(4, num_groups, 5)]:
        sizes[k] = 8  # the group with a constant channel, and exact grid sums in the tie groups
    sizes[7] = 2
    sizes[1] = sizes[2] = 4  # the groups at the step's maxima and minima
    data = _rewards(rng, sizes, channels, messy=True)
    group = np.repeat(np.arange(num_groups), sizes)
    step = np.repeat(np.arange(num_groups) * steps // num_groups, sizes)
    plain = np.isin(group, [k for k in range(num_groups) if k > 3 and k % 5 != 4])
    data[plain & (rng.random(len(data)) < 0.08), 0] = np.nan
    data[plain & (rng.random(len(data)) < 0.04)] = np.nan  # rows without any reward
    data[group == 7] = np.nan  # a group without any reward
    # GDPO ties that GRPO ranks: in group 3 channel 0 is 1 where present, so its z-scores are 0 on every row;
    # a row without it and one with it that agree on the other channels get the same fused sum, not the same total.
    if channels > 1:
        rows3 = np.flatnonzero(group == 3)
        data[rows3, 0] = 1.0
        data[rows3[:2], 0] = np.nan
        data[rows3[2:4], 1] = data[rows3[:2], 1]
    _saturate(data, group, step)
    order = rng.permutation(len(data))
    chunk = _chunk(data[order], group[order], step[order], logged=logged, seed=seed)
    assert dense_group_size(chunk) is None
    return Case(chunk, allow_dense=False)


def make_case(layout: str, *, channels: int = 3, logged: bool = False, seed: int = 0) -> Case:
    if layout == "messy":
        return messy_case(seed=seed, channels=channels, logged=logged)
    return dense_case(seed=seed, channels=channels, logged=logged, allow_dense=layout == "dense")


def assert_close(case: Case, expected: dict[str, np.ndarray], *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Each expected series against the statistics of ``case`` (NaN where expected NaN)."""
    for name, want in expected.items():
        np.testing.assert_allclose(case.stats[name], want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)


def mean_or_nan(values: list[float]) -> float:
    return float(np.mean(values)) if values else np.nan
