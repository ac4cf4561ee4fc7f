"""The dense layout on NumPy: advantages and the shared intermediates of every statistic family, without torch.

A chunk is *dense* when its rows come in consecutive groups of ``g`` rows (``2 <= g <=`` :data:`MAX_DENSE_GROUP`),
every step of it has at least one group and no reward is NaN: TRL's layout and that of most dumps. There the
advantage engine and the statistics need no scatter: each tensor is laid out member-major, ``[..., g, G]``
(member of the group, then group), so a reduction over a group adds ``g`` contiguous rows of length ``G``, and
the advantages are computed from the same deviations the statistics read (one pass, not two). It runs on NumPy
(which releases the GIL in its loops, so chunks still run on one thread per core) and so a scan of such a run on
CPU never imports torch. Every other layout, and CUDA, goes through torch (:class:`~collapse_doctor.engine.stats.chunk.
GeneralChunk` and :mod:`collapse_doctor.engine.advantages`); a test checks that both agree on every series.

The arithmetic is the torch engine's, step for step: group deviations after a shift by the group's first value,
float32 within groups, float64 over a step (GDPO's batch normalisation), ``1 / (std + eps)`` or 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from collapse_doctor.core.series import CUT_BY_FLAG
from collapse_doctor.engine.advantages import STD_EPS
from collapse_doctor.engine.stats.kernels import HASH_MIX, to_host

MAX_DENSE_GROUP = 64
"""Largest group size for the dense path (its pair comparisons are ``g`` passes over ``[g, G]``)."""

_MIX = tuple(np.int64(m) for m in HASH_MIX)


def dense_layout(
    rewards: np.ndarray, group_index: np.ndarray, num_groups: int, step_index: np.ndarray, num_steps: int
) -> int | None:
    """``g`` when the rows are consecutive groups of ``g`` rows, the steps ascend with a group in each of the
    ``num_steps`` and no reward is NaN; else None.

    >>> dense_layout(np.zeros((4, 1), np.float32), np.array([0, 0, 1, 1]), 2, np.array([0, 0, 1, 1]), 2)
    2
    >>> dense_layout(np.zeros((4, 1), np.float32), np.array([0, 1, 0, 1]), 2, np.zeros(4, np.int64), 1) is None
    True
    """
    n = rewards.shape[0]
    if num_groups == 0 or n % num_groups:
        return None
    g = n // num_groups
    if not 2 <= g <= MAX_DENSE_GROUP or bool(np.isnan(rewards).any()):
        return None
    if not bool((group_index.reshape(num_groups, g) == np.arange(num_groups)[:, None]).all()):
        return None  # row i is not in group i // g
    steps = step_index[::g]
    if not bool((step_index.reshape(num_groups, g) == steps[:, None]).all()):
        return None  # a group's rows in different steps
    d = np.diff(steps)
    if steps[0] != 0 or steps[-1] != num_steps - 1 or not bool(((d == 0) | (d == 1)).all()):
        return None  # a step without a group (or unsorted steps): the reductions per step need each step's groups
    return g


@dataclass(frozen=True)
class CompletionRows:
    """What the reader knows of each row's completion, on the host (both engines count on these with NumPy).

    ``codes`` ``[N]`` int64: equal codes, equal completion text (comparable within a step; -1, a null text, is a
    value of its own), None without completion text; ``lengths`` ``[N]`` float64: tokens, else characters, NaN
    where unknown, None without lengths; ``cut`` ``[N]`` float64: 1.0 cut at the length cap, 0.0 ended on its own,
    NaN unknown, None without a ``truncated`` flag or a length cap; ``cut_rule`` how ``cut`` was told (``cut_rule``
    values of :mod:`collapse_doctor.core.series`); ``tokens`` whether ``lengths`` count tokens.
    """

    codes: np.ndarray | None = None
    lengths: np.ndarray | None = None
    cut: np.ndarray | None = None
    cut_rule: float = CUT_BY_FLAG
    tokens: bool = False

    @property
    def token_lengths(self) -> np.ndarray | None:
        """``lengths`` where they count tokens (what a token-weighted estimator weights by), else None."""
        return self.lengths if self.tokens else None

    @classmethod
    def of(
        cls,
        codes: np.ndarray | None,
        lengths: np.ndarray | None,
        cut: np.ndarray | None = None,
        cut_rule: float = CUT_BY_FLAG,
        tokens: bool = False,
    ) -> CompletionRows | None:
        """The rows' completions, or None when nothing is known of them."""
        if codes is None and lengths is None and cut is None:
            return None
        return cls(
            None if codes is None else np.asarray(codes, dtype=np.int64),
            None if lengths is None else np.asarray(lengths, dtype=np.float64),
            None if cut is None else np.asarray(cut, dtype=np.float64),
            cut_rule,
            tokens and lengths is not None,
        )


@dataclass(frozen=True)
class RowAdvantages:
    """GRPO and GDPO advantages row by row (the order of the chunk's rows), ``[N]`` each, for the collectors."""

    grpo: np.ndarray
    gdpo: np.ndarray


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0.

    >>> ratio(np.array([1.0, 1.0]), np.array([4.0, 0.0])).tolist()
    [0.25, nan]
    """
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)


def finite_or_nan(x: np.ndarray) -> np.ndarray:
    """``x`` in float64 with ``inf`` (a step without a value) as NaN."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), x, np.nan)


def quantize(values: np.ndarray, quantum: float) -> np.ndarray:
    """Integer bins of width ``quantum`` (the values hold no NaN)."""
    with np.errstate(invalid="ignore"):  # beyond int64 (totals above 9e13): one bin, as torch saturates
        return np.round(values.astype(np.float64) / quantum).astype(np.int64)


def hash_rows(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per entry mixing several int64 arrays (the torch engine's mix: collisions negligible at 64 bits)."""
    h = np.zeros(columns[0].shape, dtype=np.int64)
    for k, column in enumerate(columns):
        h = (h ^ column) * _MIX[k % len(_MIX)]  # wraps around, as torch's int64 does
        h = h ^ (h >> 31)
    return h


def first_argmax(values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Index of the largest of equally shaped arrays (the first on ties) and that largest value: a few passes of
    ``where`` and ``maximum`` (NumPy's argmax over a short first axis copies and runs many times slower).

    >>> index, best = first_argmax([np.array([1.0, 5.0]), np.array([3.0, 5.0])])
    >>> index.tolist(), best.tolist()
    ([1, 0], [3.0, 5.0])
    """
    best, index = values[0], np.zeros(values[0].shape, dtype=np.int64)
    for k, value in enumerate(values[1:], start=1):
        index = np.where(value > best, k, index)
        best = np.maximum(best, value)
    return index, best


def inverse_denominator(std: np.ndarray, convention: str) -> np.ndarray:
    """Per segment 1 / (std + eps), or 0 where that is undefined or zero (no ranking signal); float32 like ``std``."""
    denominator = np.nan_to_num(std, nan=0.0) + std.dtype.type(STD_EPS[convention])
    return np.where(denominator > 0, 1.0 / np.maximum(denominator, std.dtype.type(1e-30)), 0).astype(std.dtype)


def _to_members(x: np.ndarray, G: int, g: int) -> np.ndarray:
    if x.ndim == 1:
        return np.ascontiguousarray(x.reshape(G, g).T)
    return np.ascontiguousarray(x.reshape(G, g, x.shape[1]).transpose(2, 1, 0))


class DenseChunk:
    """A dense chunk (see the module docstring): the advantages and the intermediates the statistics share.

    Built from the reader's arrays (:meth:`from_rows`, advantages computed here) or from a torch
    :class:`~collapse_doctor.engine.stats.chunk.ChunkInput` (:meth:`from_input`, its advantages taken as given).
    Per-group values reduce per step with :meth:`steps_sum` (float64, steps are consecutive).
    """

    def __init__(
        self,
        rewards: np.ndarray,
        g: int,
        step_index: np.ndarray,
        weights: list[float],
        *,
        num_steps: int,
        logged: np.ndarray | None = None,
        advantages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        convention: str = "trl",
        completions: CompletionRows | None = None,
    ) -> None:
        self.rewards = rewards
        """``[N, C]`` float32, row by row."""
        self.g = g
        self.num_rows, self.num_channels = rewards.shape
        self.num_groups = G = self.num_rows // g
        self.num_steps = S = num_steps
        self.step_index = step_index
        self.weights = [float(np.float32(w)) for w in weights]
        self.logged = logged
        """``[N]`` logged advantages row by row, or None."""
        self.completions = completions
        """The rows' completion codes and lengths (row by row), or None."""
        self.convention = convention
        self._given = advantages
        self.group_step = np.ascontiguousarray(step_index[::g]).astype(np.int64)
        """``[G]`` the step of each group (steps are sorted)."""
        self.groups_per_step = np.bincount(self.group_step, minlength=S)
        self.gps = self.groups_per_step.astype(np.float64)
        """``[S]`` groups per step, float64."""
        self._starts = np.concatenate([[0], np.cumsum(self.groups_per_step)[:-1]]).astype(np.intp)
        assert G > 0 and bool((self.groups_per_step > 0).all()), "a dense chunk has a group in every step"

    @classmethod
    def from_rows(
        cls,
        rewards: np.ndarray,
        g: int,
        step_index: np.ndarray,
        weights: list[float],
        num_steps: int,
        logged: np.ndarray | None = None,
        completions: CompletionRows | None = None,
    ) -> DenseChunk:
        """A chunk as the reader stacked it (``dense_layout`` said ``g``); advantages under TRL's convention."""
        rewards = np.asarray(rewards, dtype=np.float32)
        if logged is not None:
            logged = np.asarray(logged, dtype=np.float32)
        return cls(rewards, g, step_index, weights, num_steps=num_steps, logged=logged, completions=completions)

    @classmethod
    def from_input(cls, chunk: Any, g: int) -> DenseChunk:
        """A torch :class:`~collapse_doctor.engine.stats.chunk.ChunkInput` on CPU in the dense layout, its advantages as
        given."""

        adv = chunk.advantages
        rewards = to_host(chunk.rewards).astype(np.float32, copy=False)
        G = rewards.shape[0] // g
        given = (
            _to_members(to_host(adv.zscores), G, g),
            _to_members(to_host(adv.grpo), G, g),
            _to_members(to_host(adv.gdpo), G, g),
        )
        logged = to_host(chunk.logged).astype(np.float32) if chunk.logged is not None else None
        weights = to_host(chunk.weights).astype(np.float32).tolist()
        return cls(
            rewards,
            g,
            to_host(chunk.step_index),
            weights,
            num_steps=chunk.num_steps,
            logged=logged,
            advantages=given,
            completions=chunk.completions,
        )

    # -- layout --------------------------------------------------------------------------------------------

    def members(self, x: np.ndarray) -> np.ndarray:
        """Rows ``[N]`` or ``[N, K]`` as ``[g, G]`` or ``[K, g, G]``."""
        return _to_members(x, self.num_groups, self.g)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`members`: ``[g, G]`` -> ``[N]``, ``[K, g, G]`` -> ``[N, K]``."""
        if x.ndim == 2:
            return np.ascontiguousarray(x.T).reshape(-1)
        return np.ascontiguousarray(x.transpose(2, 1, 0)).reshape(self.num_rows, x.shape[0])

    def steps_sum(self, x: np.ndarray) -> np.ndarray:
        """Per-group values ``[G]`` or ``[K, G]`` summed per step: ``[S]`` or ``[S, K]`` (float64)."""
        x = np.asarray(x)
        if x.ndim == 2 and x.shape[0] == 0:
            return np.zeros((self.num_steps, 0))
        return self._per_step(np.add, x, dtype=np.float64)

    def steps_max(self, x: np.ndarray) -> np.ndarray:
        """Per-group values ``[G]`` or ``[K, G]``: the step's largest, ``[S]`` or ``[S, K]``, in their dtype."""
        return self._per_step(np.maximum, x)

    def steps_min(self, x: np.ndarray) -> np.ndarray:
        """Per-group values ``[G]`` or ``[K, G]``: the step's smallest, ``[S]`` or ``[S, K]``, in their dtype."""
        return self._per_step(np.minimum, x)

    def _per_step(self, ufunc: np.ufunc, x: np.ndarray, **kwargs: Any) -> np.ndarray:
        """``ufunc`` over each step's groups (steps are consecutive): ``[G]`` -> ``[S]``, ``[K, G]`` -> ``[S, K]``."""
        if x.ndim == 1:
            return ufunc.reduceat(x, self._starts, **kwargs)
        return np.ascontiguousarray(ufunc.reduceat(x, self._starts, axis=1, **kwargs).T)

    def per_group(self, x: np.ndarray) -> np.ndarray:
        """A per-step value ``[S]`` for each group, ``[G]``."""
        return x[self.group_step]

    # -- the advantage engine --------------------------------------------------------------------------------

    def centred(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Deviation from the group mean (shifted by the group's first value) and the group std (ddof=1)."""
        shifted = x - x[..., :1, :]
        dev = shifted - shifted.mean(axis=-2, keepdims=True, dtype=x.dtype)
        return dev, np.sqrt((dev * dev).sum(axis=-2) / x.dtype.type(self.g - 1))

    def step_std(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[g, G]`` values: their deviation from the step's mean and the step's std (ddof=1), computed in
        float64 after a shift by the step's first value, returned in ``x``'s dtype."""
        first = x[0, self._starts]
        shifted = (x - self.per_group(first)).astype(np.float64)
        count = self.gps * self.g
        mean = self.steps_sum(shifted.sum(axis=0)) / count
        deviation = shifted - self.per_group(mean)
        squares = self.steps_sum((deviation * deviation).sum(axis=0))
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.where(count >= 2, np.sqrt(squares / (count - 1)), np.nan)
        return deviation.astype(x.dtype), std.astype(x.dtype)

    def weighted(self, parts: np.ndarray | list[np.ndarray]) -> list[np.ndarray]:
        """Channel parts ``[C, ...]`` times their weights, one array per channel (a weight of 1 multiplies nothing:
        the part itself, not a copy; do not write into it)."""
        return [parts[c] if w == 1.0 else parts[c] * np.float32(w) for c, w in enumerate(self.weights)]

    @staticmethod
    def channel_sum(parts: list[np.ndarray]) -> np.ndarray:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    @cached_property
    def weight_column(self) -> np.ndarray:
        """``[C]`` weights, float64."""
        return np.array(self.weights, dtype=np.float64)

    @cached_property
    def member_rewards(self) -> np.ndarray:
        """``[C, g, G]`` rewards."""
        return self.members(self.rewards)

    @cached_property
    def channel_centred(self) -> tuple[np.ndarray, np.ndarray]:
        """``[C, g, G]`` deviations ``dev_c`` and ``[C, G]`` group stds."""
        return self.centred(self.member_rewards)

    @property
    def dev(self) -> np.ndarray:
        return self.channel_centred[0]

    @cached_property
    def total(self) -> np.ndarray:
        """``[g, G]`` weighted total reward ``t``."""
        return self.channel_sum(self.weighted(self.member_rewards))

    @cached_property
    def total_centred(self) -> tuple[np.ndarray, np.ndarray]:
        """``[g, G]`` deviation of the total from its group mean and ``[G]`` its group std."""
        return self.centred(self.total)

    @property
    def dev_t(self) -> np.ndarray:
        return self.total_centred[0]

    @property
    def std_t(self) -> np.ndarray:
        return self.total_centred[1]

    @cached_property
    def zscores(self) -> np.ndarray:
        """``[C, g, G]`` per-channel group z-scores."""
        if self._given is not None:
            return self._given[0]
        dev, std = self.channel_centred
        return dev * inverse_denominator(std, self.convention)[:, None, :]

    @cached_property
    def fused(self) -> np.ndarray:
        """``[g, G]`` GDPO's weighted sum of channel z-scores ``s``."""
        return self.channel_sum(self.weighted(self.zscores))

    @cached_property
    def advantages(self) -> dict[str, np.ndarray]:
        """``{"grpo": [g, G], "gdpo": [g, G]}``: GRPO (group z-score of the total) and GDPO (the fused sum's
        z-score over the step)."""
        if self._given is not None:
            return {"grpo": self._given[1], "gdpo": self._given[2]}
        grpo = self.dev_t * inverse_denominator(self.std_t, self.convention)[None, :]
        deviation, std = self.step_std(self.fused)
        gdpo = deviation * self.per_group(inverse_denominator(std, self.convention))[None, :]
        return {"grpo": grpo, "gdpo": gdpo}

    def grpo_scaled(self, scale: str) -> np.ndarray:
        """``[g, G]`` GRPO advantages with another scale: ``batch`` (the step's std of the totals) or ``none``."""
        if scale == "none":
            return self.dev_t
        _, std = self.step_std(self.total)
        return self.dev_t * self.per_group(inverse_denominator(std, self.convention))[None, :]

    def release(self) -> None:
        """Drop the intermediates the statistics needed, keeping the advantages (what a collector reads): a chunk
        waiting for its turn in the in-order merge then holds a few MB, not tens."""
        for name in list(vars(self)):
            if name != "advantages" and isinstance(getattr(type(self), name, None), cached_property):
                del self.__dict__[name]

    def row_advantages(self) -> RowAdvantages:
        """The advantages in the chunk's row order (what the collectors read)."""
        adv = self.advantages
        return RowAdvantages(grpo=self.rows(adv["grpo"]), gdpo=self.rows(adv["gdpo"]))

    # -- intermediates of several families ---------------------------------------------------------------------

    @cached_property
    def signal(self) -> np.ndarray:
        """``[G]`` groups that carry signal (their totals differ)."""
        return self.std_t > 0

    @cached_property
    def signal_float(self) -> np.ndarray:
        """``[G]`` :attr:`signal` as 0/1 in the rewards' dtype."""
        return self.signal.astype(self.rewards.dtype)

    @cached_property
    def num_signal(self) -> np.ndarray:
        """``[S]`` groups that carry signal, float64."""
        return self.steps_sum(self.signal)

    @cached_property
    def member_extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """``[C, G]`` each channel's group max and min."""
        rewards = self.member_rewards
        return rewards.max(axis=-2), rewards.min(axis=-2)

    @cached_property
    def step_extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """``[S, C]`` each channel's max and min over the step, in the rewards' dtype."""
        high, low = self.member_extremes
        return self.steps_max(high), self.steps_min(low)

    @cached_property
    def constant_at(self) -> tuple[np.ndarray, np.ndarray]:
        """``[C, G]`` whether the channel is constant in the group at the step's maximum (first) or minimum."""
        high, low = self.member_extremes
        step_high, step_low = self.step_extremes
        constant = high == low
        return (
            constant & (high == step_high.T[:, self.group_step]),
            constant & (low == step_low.T[:, self.group_step]),
        )

    @cached_property
    def equal_rewards(self) -> np.ndarray:
        """``[G]`` groups whose reward vectors are all equal (every channel constant in the group)."""
        high, low = self.member_extremes
        return np.asarray((high == low).all(axis=0))

    @cached_property
    def identical_completions(self) -> np.ndarray | None:
        """``[G]`` groups whose completions are all the same logged text (one code, not null), None without completion
        codes."""
        if self.completions is None or self.completions.codes is None:
            return None
        codes = self.completions.codes.reshape(self.num_groups, self.g)
        low = codes.min(axis=1)
        return np.asarray((low == codes.max(axis=1)) & (low >= 0))

    @cached_property
    def known_completions(self) -> np.ndarray | None:
        """``[G]`` groups whose every completion was logged (no null text), None without completion codes."""
        if self.completions is None or self.completions.codes is None:
            return None
        return np.asarray(self.completions.codes.reshape(self.num_groups, self.g).min(axis=1) >= 0)

    @cached_property
    def total_ss(self) -> np.ndarray:
        """``[S]`` sum of ``dev_t^2`` over the step's rows."""
        dev_t = self.dev_t
        return self.steps_sum((dev_t * dev_t).sum(axis=0))

    @cached_property
    def pooled_total_std(self) -> np.ndarray:
        """``[S]`` pooled within-group std of the totals: ``sqrt(sum dev_t^2 / sum (n_g - 1))``."""
        dof = self.gps * (self.g - 1)
        return np.where(dof > 0, np.sqrt(self.total_ss / np.maximum(dof, 1.0)), np.nan)
