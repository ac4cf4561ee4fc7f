"""What the scalar-log detectors (CD501-CD511) share: support, persistence, smoothing, early levels and trends.

These detectors need no rollouts: they read the canonical scalar series (:mod:`collapse_doctor.core.scalars`).
Each series has its own steps (tags are logged at different rates), so persistence is counted in logged
points of that series: a condition must hold for the same share of the points as the rollout detectors
require of the steps (5%, at least 3). Levels are judged against the run's own early level, so they work
whatever the reward scale. A series with fewer than ``min_points`` logged points is not judged (the detector
is listed as skipped with "not enough data to judge"); a series the log does not have is simply not judged.

A held-out score is logged on its own cadence (every ``eval_steps``): it is never interpolated onto the training
steps. Trends are judged with robust statistics (:mod:`collapse_doctor.judge.detectors.trends`): a Mann-Kendall
test in point order and the Theil-Sen change over the stretch, which must exceed the series' own noise floor
(from its point-to-point changes).

A scalar log says nothing about what the other aggregation would do: these findings leave ``gdpo_resolves``
unset and never propose switching aggregation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from collapse_doctor.core import scalars as S
from collapse_doctor.core.scalars import TagPoints
from collapse_doctor.core.smoothing import rolling
from collapse_doctor.judge.detectors.base import DetectionContext, Detector, NotEnoughData
from collapse_doctor.judge.detectors.remedies import nanmedian
from collapse_doctor.judge.detectors.trends import TrendTest, thin

MIN_POINTS = 8
"""Default ``min_points``: fewer logged points than this say nothing about a trend."""

ZERO = 1e-6
"""A std at or below this fraction of a series' own scale is exactly zero (every value the same)."""

ALPHA = 0.05
"""Default significance level of the Mann-Kendall tests."""

LEVEL_POINTS = 4000
"""Levels and trends of longer series are judged on this many bin medians (a log of millions of points smooths in
seconds; persistence is a share of the points either way). Spikes and non-finite values are counted on every point."""


@dataclass(frozen=True)
class Trend:
    """The training reward before a change and at its end, and whether it rose beyond its own noise."""

    before: float
    after: float
    noise: float
    points: int

    @property
    def rising(self) -> bool:
        return bool(np.isfinite(self.before) and np.isfinite(self.after) and self.after - self.before > self.noise)

    def evidence(self) -> dict[str, float]:
        return {"reward_before": self.before, "reward_after": self.after, "reward_noise": self.noise}


class ScalarDetector(Detector):
    """Shared helpers: support, persistence, smoothing and the early reference level on one scalar series."""

    requires: ClassVar[tuple[str, ...]] = ("scalars",)
    reads: ClassVar[tuple[tuple[str, ...], ...]] = ()
    """Canonical series the detector reads: one of each group must be in the log, or it is skipped as lacking
    them (not judged: a log without entropy says nothing about entropy collapse)."""

    def minimum(self, ctx: DetectionContext, key: str = "min_points") -> int:
        return int(ctx.threshold(self.code, key))

    def series(self, ctx: DetectionContext, name: str, minimum_key: str = "min_points") -> TagPoints | None:
        """The series ``name`` (``None`` when the log does not have it); fewer finite points than the threshold
        ``minimum_key`` is not enough data."""
        found = logged_series(ctx, name)
        if found is None:
            return None
        points = int(np.count_nonzero(np.isfinite(found.values)))
        minimum = self.minimum(ctx, minimum_key)
        if points < minimum:
            tag = tag_of(ctx, name)
            raise NotEnoughData(f"`{tag}` has {points} logged point(s); {minimum} are needed ({minimum_key})")
        return found

    def optional(self, ctx: DetectionContext, name: str, minimum_key: str = "min_points") -> TagPoints | None:
        """A second signal: the series when it has at least ``minimum_key`` finite points, else ``None`` (no error)."""
        found = logged_series(ctx, name)
        if found is None or int(np.count_nonzero(np.isfinite(found.values))) < self.minimum(ctx, minimum_key):
            return None
        return found

    @staticmethod
    def persistence(ctx: DetectionContext, n: int) -> int:
        return ctx.config.persistence_steps(n)

    def smooth(self, ctx: DetectionContext, values: np.ndarray) -> np.ndarray:
        return rolling(values, max(1, self.persistence(ctx, len(values)) // 2) | 1)

    def smoothing_window(self, ctx: DetectionContext, n: int) -> int:
        """An odd smoothing window of about the persistence window (at least 3 points)."""
        return max(3, self.persistence(ctx, n)) | 1

    def alpha(self, ctx: DetectionContext) -> float:
        return float(ctx.threshold(self.code, "alpha"))

    def early(self, ctx: DetectionContext, values: np.ndarray) -> float:
        """The run's early level: median of the first 10% of the points (at least the persistence window)."""
        n = len(values)
        head = max(self.persistence(ctx, n), math.ceil(0.1 * n), 3)
        return nanmedian(values[: min(n, head)])

    def relative_to_early(self, ctx: DetectionContext, values: np.ndarray) -> tuple[float, np.ndarray] | None:
        """The early level of the smoothed series and the series over it (``None`` when that level is not > 0)."""
        smooth = self.smooth(ctx, values)
        early = self.early(ctx, smooth)
        if not (np.isfinite(early) and early > 0):
            return None
        with np.errstate(invalid="ignore"):
            return early, smooth / early

    @staticmethod
    def settled_level(values: np.ndarray, stretch: tuple[int, int], persist: int) -> float:
        """Median over the last persistence window of a stretch: where the series stands at its end."""
        start, end = stretch
        return nanmedian(values[max(start, end - persist + 1) : end + 1])

    def reward_trend(self, ctx: DetectionContext, from_step: int, to_step: int) -> Trend | None:
        """The training reward just before ``from_step`` and over the last points up to ``to_step``.

        Each level is the median of a persistence window of the reward's own points; the noise is twice the
        standard error of the difference of two such medians, from the reward's step-to-step changes (robust
        to a trend). ``None`` when the run logs no reward series with enough points.
        """
        reward = self.optional(ctx, S.REWARD)
        if reward is None:
            return None
        finite = np.isfinite(reward.values)
        steps, values = reward.steps[finite], reward.values[finite]
        w = max(3, self.persistence(ctx, len(values)))
        before = values[steps <= from_step][-w:]
        after = values[steps <= to_step][-w:]
        if len(before) == 0 or len(after) == 0:
            return None
        sigma = 1.4826 * nanmedian(np.abs(np.diff(values))) / math.sqrt(2) if len(values) > 1 else 0.0
        noise = 2 * 1.2533 * sigma * math.sqrt(1 / len(before) + 1 / len(after))
        return Trend(nanmedian(before), nanmedian(after), max(noise, 1e-12), len(values))


def logged_series(ctx: DetectionContext, name: str) -> TagPoints | None:
    """The series the log has under the canonical ``name``, whatever its length (``None`` when it has none)."""
    return ctx.scalars.get(name) if ctx.scalars is not None else None


def tag_of(ctx: DetectionContext, name: str) -> str:
    """The raw tag the log carried a canonical series under (the name itself when unknown)."""
    return ctx.scalars.tags.get(name, name) if ctx.scalars is not None else name


def support(points: int, stretch: tuple[int, int] | None = None) -> dict[str, int]:
    """The evidence a finding rests on: the points judged and, for a sustained stretch, the points inside it."""
    out = {"points": points}
    if stretch is not None:
        out["stretch_points"] = stretch[1] - stretch[0] + 1
    return out


def extremes(found: TagPoints, high: bool = True) -> TagPoints:
    """The series as spike and bound checks read it: of a folded series (:mod:`collapse_doctor.core.fold`) each
    bucket's largest (``high``) or smallest finite value, so one step's spike is not averaged away in its bucket;
    any other series as it is."""
    if found.buckets is None:
        return found
    return TagPoints(found.steps, found.buckets.maxima if high else found.buckets.minima, found.buckets)


def nonfinite_points(found: TagPoints) -> tuple[np.ndarray, np.ndarray]:
    """Per point (per bucket of a folded series): the non-finite points and the NaN points among them."""
    if found.buckets is None:
        return (~np.isfinite(found.values)).astype(np.int64), np.isnan(found.values).astype(np.int64)
    return found.buckets.points - found.buckets.finite, found.buckets.nan


def finite_points(found: TagPoints) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(found.values)
    return found.steps[keep], found.values[keep]


def points_within(found: TagPoints, first: float, last: float) -> tuple[np.ndarray, np.ndarray]:
    """The finite points logged from step ``first`` to step ``last`` (both included)."""
    steps, values = finite_points(found)
    keep = (steps >= first) & (steps <= last)
    return steps[keep], values[keep]


def mean_within(found: TagPoints | None, first: float, last: float) -> float | None:
    """The mean of the finite points logged from step ``first`` to step ``last`` (``None`` when there are none)."""
    if found is None:
        return None
    _, values = points_within(found, first, last)
    return float(np.mean(values)) if len(values) else None


def level_points(found: TagPoints) -> tuple[np.ndarray, np.ndarray]:
    """The finite points, as bin medians when there are more than :data:`LEVEL_POINTS`."""
    steps, values = thin(found.steps, found.values, LEVEL_POINTS)
    return steps.astype(np.int64) if len(steps) == len(found.steps) else steps, values


def trend_evidence(prefix: str, test: TrendTest) -> dict[str, float | int]:
    return {
        f"{prefix}_theil_sen_slope": test.slope,
        f"{prefix}_change": test.change,
        f"{prefix}_mann_kendall_z": test.z,
        f"{prefix}_mann_kendall_p": test.p_value,
        f"{prefix}_points": test.points,
    }


def fall_start(ratio: np.ndarray, start: int, level: float = 0.9) -> int:
    """The last point at or before ``start`` where the series still stood at ``level`` of its reference."""
    above = np.flatnonzero(ratio[: start + 1] >= level)
    return int(above[-1]) if len(above) else 0


def rise_start(ratio: np.ndarray, start: int, level: float = 1.1) -> int:
    """The last point at or before ``start`` where the series was still below ``level`` of its reference."""
    below = np.flatnonzero(ratio[: start + 1] <= level)
    return int(below[-1]) if len(below) else 0


def holds_at_end(condition: np.ndarray, persist: int) -> bool:
    """Whether a condition still holds at the end of the log (in most of its last persistence window).

    A fall that recovered (a rare reward earned by no completion for three batches, then again) is not a collapse.

    >>> holds_at_end(np.array([0, 1, 1, 1, 0, 0, 0], bool), 3), holds_at_end(np.array([0, 0, 1, 1, 0, 1], bool), 3)
    (False, True)
    """
    tail = np.asarray(condition, dtype=bool)[-max(1, persist) :]
    return bool(len(tail)) and float(np.mean(tail)) >= 0.5
