"""A run's scalar log in canonical names: what the CD5xx detectors and the report's scalar panels read.

Values only (no I/O, nothing from :mod:`collapse_doctor.io`):

- the canonical series names (``REWARD``, ``KL``, ``ZERO_STD_SHARE``, the per-channel prefixes such as
  ``CHANNEL_MEAN`` + ``<channel>``, ...);
- :class:`TagPoints`, one series' points;
- :class:`ScalarSeries`, every canonical series of one run, and its JSON form.

Readers (TensorBoard event files, TRL ``trainer_state.json``, verl's file-logger JSONL) produce raw tags;
:func:`collapse_doctor.io.logs.tags.scalar_series` maps them to these names with the framework's tag map.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from collapse_doctor.core.fold import Buckets

# Canonical scalar names.
REWARD = "reward"
REWARD_STD = "reward_std"
ZERO_STD_SHARE = "frac_reward_zero_std"
KL = "kl"
ENTROPY = "entropy"
ADVANTAGE_MEAN = "advantage_mean"
ADVANTAGE_STD = "advantage_std"
ADVANTAGE_MAX = "advantage_max"
ADVANTAGE_MIN = "advantage_min"
CLIP_RATIO = "clip_ratio"
"""Share of tokens the trust region clipped, both sides (TRL ``clip_ratio/region_mean``, verl ``actor/pg_clipfrac``)."""
CLIP_RATIO_LOW = "clip_ratio_low"
"""Share of tokens clipped below ``1 - epsilon`` with a negative advantage (TRL ``clip_ratio/low_mean``)."""
CLIP_RATIO_HIGH = "clip_ratio_high"
"""Share of tokens clipped above ``1 + epsilon_high`` with a positive advantage (TRL ``clip_ratio/high_mean``)."""
CLIP_RATIO_DUAL = "clip_ratio_dual"
"""verl's ``actor/pg_clipfrac_lower``: negative-advantage tokens held by the dual clip (``clip_ratio_c``)."""
EVAL_SCORE = "eval_score"
"""A held-out score, logged on its own cadence: TRL ``eval_reward`` (``eval/reward``), verl ``val-core/.../mean@N``
or ``val/test_score/<data source>``."""
LEARNING_RATE = "learning_rate"
LOSS = "loss"
GRAD_NORM = "grad_norm"
COMPLETION_LENGTH = "completion_length"
PCT_ALL_FAIL = "pct_all_fail"
"""NeMo-RL's share (in percent) of prompts whose baseline reward is 0: every completion failed."""
PCT_ALL_PASS = "pct_all_pass"
PASS_RATE = "dynamic_filtering_pass_rate"
"""OpenRLHF's share (in percent) of prompts whose group passed dynamic filtering (mean reward inside the range)."""
FILTERED_GROUPS = "filtered_groups"
"""Groups generated and then dropped by dynamic sampling because the filter metric was the same for every member
(verl ``training/filter_groups/evicted_samples``: a count of prompt groups, whatever its name says)."""
SURPLUS_GROUPS = "surplus_groups"
"""Groups generated with signal beyond the trained batch and discarded (verl
``training/filter_groups/discarded_surplus_samples``, groups too)."""
TRAINED_GROUPS = "trained_groups"
"""Groups in the trained batch (verl ``data.train_batch_size``), logged by the verl hook beside verl's metrics."""
FILTER_ON_REWARD = "filter_on_reward"
"""1 where dynamic sampling filters groups on the trained reward, 0 where on another metric (the verl hook writes it
from ``algorithm.filter_groups.metric``)."""
GEN_BATCHES = "gen_batches"
"""Generation batches it took to fill one trained batch (NeMo-RL ``dynamic_sampling_num_gen_batches``)."""
DYNAMIC_SAMPLING_SERIES = (FILTERED_GROUPS, SURPLUS_GROUPS, GEN_BATCHES, PASS_RATE)
"""Series that only a run with dynamic sampling logs: such a run trains on groups with signal by construction."""
TRUNCATED_SHARE = "truncated_share"
"""Share of completions cut at the length cap (they ended without EOS): TRL ``completions/clipped_ratio``, verl
``response_length/clip_ratio``, OpenRLHF ``rollout/truncated_rate``, NeMo-RL ``truncation_rate``."""
CHANNEL_MEAN = "channel_mean/"
CHANNEL_STD = "channel_std/"
CHANNEL_REL_GAIN = "channel_rel_gain/"
"""Per-channel rel_gain (mean within-group max - min), as ``collapse-doctor retrain`` logs it."""
CHANNEL_SIGNAL_SHARE = "channel_signal_share/"
"""Per-channel share of the within-group advantage variance under the retrain's algorithm."""
CHANNEL_WEIGHT = "channel_weight/"
CHANNEL_ZERO_VAR_SHARE = "channel_zero_var_share/"
"""Per-channel share of groups in which the channel is constant."""
CHANNEL_DOMINANCE = "channel_dominance/"
"""Per-channel share of the rows with signal whose advantage sign the channel decides (the run's aggregation)."""
CHANNEL_CEILING_SHARE = "channel_ceiling_share/"
"""Of the groups where the channel has 2+ values: the share constant at its maximum so far (the TRL callback)."""
CHANNEL_FLOOR_SHARE = "channel_floor_share/"
"""Of the groups where the channel has 2+ values: the share constant at its minimum so far (the TRL callback)."""
CHANNEL_GROUPS = "channel_groups/"
"""Groups per step in which the channel has two or more values (the support of its rel_gain)."""
CHANNEL_SCORED_SHARE = "channel_scored_share/"
"""Share of the step's valid rollouts on which the channel has a value (TRL's None is none)."""
CHANNEL_MIN = "channel_min/"
CHANNEL_MAX = "channel_max/"
CHANNEL_GROUP_STD = "channel_group_std/"
"""Mean over groups (2+ values) of the channel's within-group std (ddof=1); ``channel_std/`` is the batch's."""
AGGREGATION_GDPO = "aggregation_gdpo"
"""1 where the TRL callback's run normalised each channel in its group first (GDPO), 0 where it summed first."""
CHANNEL_PREFIXES = (
    CHANNEL_MEAN,
    CHANNEL_STD,
    CHANNEL_REL_GAIN,
    CHANNEL_SIGNAL_SHARE,
    CHANNEL_WEIGHT,
    CHANNEL_ZERO_VAR_SHARE,
    CHANNEL_DOMINANCE,
    CHANNEL_CEILING_SHARE,
    CHANNEL_FLOOR_SHARE,
    CHANNEL_GROUPS,
    CHANNEL_SCORED_SHARE,
    CHANNEL_MIN,
    CHANNEL_MAX,
    CHANNEL_GROUP_STD,
)
"""Canonical per-channel series: ``<prefix><channel>``."""

JSON_MAX_POINTS = 10_000
"""Points per series in the JSON output; longer series are decimated (min and max per slice)."""


@dataclass(frozen=True)
class TagPoints:
    """One tag's points, sorted by step, one point per step; of a series too long to keep point for point
    (:mod:`collapse_doctor.core.fold`), one point per step bucket: its first step and the mean of its values."""

    steps: np.ndarray
    values: np.ndarray
    buckets: Buckets | None = None
    """Set when the series was folded: each bucket's counts, minimum and maximum (``values`` are the means)."""

    @property
    def logged(self) -> int:
        """Points the series logged (a folded series: more than its buckets)."""
        return len(self.steps) if self.buckets is None else self.buckets.total

    def select(self, keep: np.ndarray) -> TagPoints:
        """The points (buckets) where ``keep`` is true."""
        buckets = None if self.buckets is None else self.buckets.select(keep)
        return TagPoints(self.steps[keep], self.values[keep], buckets)


@dataclass
class ScalarSeries:
    """Canonical scalar series of one run: ``series[name]`` holds its own steps (tags are logged unevenly)."""

    framework: str | None
    series: dict[str, TagPoints]
    tags: dict[str, str]
    """``{canonical name: raw tag}`` (derived series name their inputs)."""
    points: int
    sources: tuple[Path, ...] = ()
    notes: list[str] = field(default_factory=list)
    raw_tags: tuple[str, ...] = ()

    def __contains__(self, name: str) -> bool:
        return name in self.series

    def between(self, first: int, last: int) -> ScalarSeries:
        """The points of steps ``first..last`` (inclusive) of every series."""
        series = {}
        for name, points in self.series.items():
            series[name] = points.select((points.steps >= first) & (points.steps <= last))
        return replace(self, series=series, points=sum(p.logged for p in series.values()))

    def get(self, name: str) -> TagPoints | None:
        return self.series.get(name)

    @property
    def channels(self) -> tuple[str, ...]:
        """Reward channels seen as per-channel series (mean, std, collapse-doctor's monitor), in name order."""
        names = {key.split("/", 1)[1] for key in self.series if key.startswith(CHANNEL_PREFIXES)}
        return tuple(sorted(names))

    def steps(self) -> np.ndarray:
        """Every step at which some canonical series has a point (of a folded series: its buckets' first steps)."""
        parts = [p.steps for p in self.series.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def step_span(self) -> tuple[int, int | None, int | None]:
        """``(steps, first, last)``: how many steps some series logged, the first and the last. With a folded
        series the count is the larger of the other series' distinct steps and the steps each folded one logged
        (exact when the tags are logged at the same steps, as trainers do)."""
        exact = [p.steps for p in self.series.values() if p.buckets is None]
        folded = [p for p in self.series.values() if p.buckets is not None and len(p.steps)]
        steps = np.unique(np.concatenate(exact)) if exact else np.zeros(0, dtype=np.int64)
        firsts = [int(steps[0])] if len(steps) else []
        lasts = [int(steps[-1])] if len(steps) else []
        for p in folded:
            assert p.buckets is not None
            firsts.append(int(p.steps[0]))
            lasts.append(int(p.buckets.last_steps[-1]))
        count = max([len(steps)] + [p.logged for p in folded])
        return count, (min(firsts) if firsts else None), (max(lasts) if lasts else None)

    def to_json(self, max_points: int = JSON_MAX_POINTS) -> dict[str, Any]:
        """``{"framework", "points", "tags", "series": {name: {"points", "step", "value"}}}``, NaN as null.

        A series longer than ``max_points`` keeps the lowest and highest point of each of ``max_points / 2``
        equal slices of its steps (spikes survive, the plot looks the same); ``points`` is its full length (of a
        folded series, the points it logged; ``step`` and ``value`` are then its buckets' first steps and means).
        """
        out: dict[str, Any] = {}
        for name, p in self.series.items():
            keep = decimate(p.values, max_points)
            out[name] = {
                "points": p.logged,
                "step": [int(s) for s in p.steps[keep].tolist()],
                "value": [None if not np.isfinite(v) else float(f"{v:.6g}") for v in p.values[keep].tolist()],
            }
        return {"framework": self.framework, "points": self.points, "tags": dict(self.tags), "series": out}


def decimate(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices keeping each slice's minimum and maximum, at most ``max_points`` of them, in order.

    >>> decimate(np.array([0.0, 5.0, 1.0, 2.0, -3.0, 0.0]), 4).tolist()
    [0, 1, 3, 4]
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    bucket = (np.arange(n) * buckets) // n  # non-decreasing: each bucket is a run of consecutive points
    starts = np.flatnonzero(np.diff(bucket, prepend=-1))
    keyed = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=np.inf)  # NaN sorts last, as a maximum
    low = np.minimum.reduceat(keyed, starts)[bucket]
    high = np.maximum.reduceat(keyed, starts)[bucket]
    at_low = np.flatnonzero(keyed == low)  # the first of each bucket's minima, the last of its maxima
    first = at_low[np.unique(bucket[at_low], return_index=True)[1]]
    at_high = np.flatnonzero(keyed == high)[::-1]
    last = at_high[np.unique(bucket[at_high], return_index=True)[1]]
    return np.unique(np.concatenate([first, last]))
