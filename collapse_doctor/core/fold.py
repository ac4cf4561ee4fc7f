"""A very long scalar series folded into consecutive step buckets while it is read: memory flat in its length.

A series of at most :data:`FOLD_CAP` points is kept point for point. A longer one becomes buckets of ``2**k`` steps
(bucket ``b`` holds the steps ``b * 2**k`` to ``(b + 1) * 2**k - 1``), ``k`` the smallest width that leaves at most
:data:`FOLD_CAP` buckets; each bucket keeps exact counts (points, finite points), the sum of its finite values,
their minimum and maximum, and its first and last logged step. The detectors read the bucket means at the
buckets' first steps (:class:`~collapse_doctor.core.scalars.TagPoints` with :class:`Buckets`); spike and
non-finite checks read the minima, maxima and counts.

:class:`SeriesFold` is fed points in the order they were logged. It keeps up to :data:`FOLD_CAP` of them as they
came and folds them :data:`FOLD_CAP` at a time, at fixed positions of the series' own sequence of points, so the
result depends only on that sequence: not on how a file was cut into blocks or a growing file into polls.

What folding cannot keep exact, because a bucket no longer knows its points:

- a step logged again after its bucket was folded (a restart without a SessionLog START) drops the folded buckets
  from the one holding that step on: the later points replace them (the latest is what an unfolded series keeps),
  and the bucket's earlier steps go with it;
- a SessionLog START at a step inside a folded bucket drops that whole bucket too (its points before the step
  included).

Points still unfolded are treated exactly as an unfolded series treats them (the later of two points of a step
is kept: event files are written in time order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FOLD_CAP", "Buckets", "SeriesFold", "fold_series"]

FOLD_CAP = 16_384
"""Points of a series kept point for point; a longer series is read as at most this many step buckets. Four times
the 4,000 bin medians on which the detectors judge levels and trends, above the 10,000 points a series keeps in
the JSON output, and small enough that a run's detectors and its folded series take a few MB whatever its length."""


@dataclass(frozen=True)
class Buckets:
    """What a folded series keeps of each bucket besides its mean (the series' ``values``) and first step."""

    width: int
    """Steps per bucket (a power of two)."""
    points: np.ndarray
    """Points logged in each bucket (``int32``, as the other counts)."""
    finite: np.ndarray
    """Finite points in each bucket: the mean is over these (NaN where there are none)."""
    nan: np.ndarray
    """NaN points in each bucket (the other non-finite ones are infinite)."""
    minima: np.ndarray
    """The smallest finite value of each bucket (NaN where none is finite)."""
    maxima: np.ndarray
    """The largest finite value of each bucket (NaN where none is finite)."""
    last_steps: np.ndarray
    """The last step logged in each bucket."""

    @property
    def total(self) -> int:
        """Points the series logged."""
        return int(self.points.sum())

    def select(self, keep: np.ndarray) -> Buckets:
        return Buckets(
            self.width,
            self.points[keep],
            self.finite[keep],
            self.nan[keep],
            self.minima[keep],
            self.maxima[keep],
            self.last_steps[keep],
        )


_FIELDS = ("first", "last", "points", "finite", "nan", "total", "low", "high")
"""A bucket's key (its number) is ``first >> k``: the first step logged in it, at the fold's width."""


class SeriesFold:
    """One series' points, folded into step buckets once there are more than ``cap`` (see the module docstring).

    >>> fold = SeriesFold(cap=4)
    >>> fold.add(np.arange(10), np.arange(10.0))
    >>> steps, values, buckets = fold.result()
    >>> steps.tolist(), values.tolist(), buckets.width
    ([0, 4, 8], [1.5, 5.5, 8.5], 4)
    """

    __slots__ = ("_arrays", "_pending", "_pending_points", "cap", "duplicates", "folded", "k", "last_step", "purged")

    def __init__(self, cap: int | None = None) -> None:
        self.cap = int(FOLD_CAP if cap is None else cap)
        self.k = 0
        self.folded = False
        """Whether any point was folded (else :meth:`result` is the points themselves)."""
        self.last_step = -(2**63)
        self.duplicates = 0
        """Points a later point of the same step replaced, and folded points dropped with a bucket a step was logged
        again in."""
        self.purged = 0
        """Points dropped by :meth:`truncate` (a SessionLog START), whole straddling buckets included."""
        self._arrays: dict[str, np.ndarray] = {name: np.zeros(0, _dtype(name)) for name in _FIELDS}
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_points = 0

    @property
    def points(self) -> int:
        """Points held: those folded into buckets and those still pending."""
        return int(self._arrays["points"].sum()) + self._pending_points

    def copy(self) -> SeriesFold:
        other = SeriesFold(self.cap)
        other.k, other.folded, other.last_step = self.k, self.folded, self.last_step
        other.duplicates, other.purged = self.duplicates, self.purged
        other._arrays = dict(self._arrays)  # arrays are replaced, never written in place
        other._pending = list(self._pending)
        other._pending_points = self._pending_points
        return other

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Points in the order they were logged; every ``cap`` of them since the first are folded together."""
        if not len(steps):
            return
        values = np.asarray(values)  # float32 as an event file stores them: float64 once folded
        self._pending.append((np.asarray(steps, dtype=np.int64), values if values.dtype.kind == "f" else values * 1.0))
        self._pending_points += len(steps)
        if self._pending_points <= self.cap:
            return
        steps, values = self._take_pending()
        cut = (len(steps) - 1) // self.cap * self.cap  # 1 to cap points stay pending
        for lo in range(0, cut, self.cap):
            self._fold(steps[lo : lo + self.cap], values[lo : lo + self.cap])
        self._pending = [(steps[cut:], values[cut:])] if cut < len(steps) else []
        self._pending_points = len(steps) - cut

    def extend(self, other: SeriesFold) -> SeriesFold:
        """The points of ``other`` (a later file of the same tag) after these: its buckets replace those from its
        first step on (logged again), the coarser width of the two is kept. Returns ``self``."""
        self.duplicates += other.duplicates
        if other.folded:
            if self._pending_points:
                self._fold(*self._take_pending())
                self._pending, self._pending_points = [], 0
            theirs = other._arrays
            if self.folded and len(theirs["first"]) and int(theirs["first"][0]) <= self.last_step:
                self.duplicates += self._drop_from(int(theirs["first"][0]))
            k = max(self.k, other.k)
            mine = _regrouped(self._arrays, self._arrays["first"] >> k)
            theirs = _regrouped(theirs, theirs["first"] >> k)
            self.k, self._arrays, self.folded = k, _joined(mine, theirs, k), True
            self._shrink()
            if len(self._arrays["last"]):
                self.last_step = int(self._arrays["last"][-1])
        if other._pending_points:
            self.add(*other._take_pending())
        return self

    def truncate(self, step: int) -> int:
        """Drop the points at ``step`` or later (a SessionLog START): how many. A folded bucket that holds ``step``
        goes whole."""
        dropped = 0
        pending = []
        for steps, values in self._pending:
            keep = steps < step
            dropped += int(len(keep) - keep.sum())
            if keep.any():
                pending.append((steps[keep], values[keep]))
        self._pending = pending
        self._pending_points = sum(len(s) for s, _ in pending)
        if self.folded and self.last_step >= step:
            dropped += self._drop_from(step)
        self.purged += dropped
        return dropped

    def result(self) -> tuple[np.ndarray, np.ndarray, Buckets | None]:
        """``(steps, values, buckets)``: the points (unresolved duplicates and all) with ``buckets`` ``None`` while
        nothing was folded; else the buckets' first steps and means (what is pending folded into a copy)."""
        if not self.folded:
            if not self._pending:
                return np.zeros(0, np.int64), np.zeros(0), None
            steps, values = self._take_pending()
            self._pending = [(steps, values)]
            return steps, values.astype(np.float64, copy=False), None
        fold = self.finished()
        a = fold._arrays
        some = a["finite"] > 0
        means = np.where(some, a["total"] / np.maximum(a["finite"], 1), np.nan)
        low, high = np.where(some, a["low"], np.nan), np.where(some, a["high"], np.nan)
        buckets = Buckets(1 << fold.k, a["points"], a["finite"], a["nan"], low, high, a["last"])
        return a["first"], means, buckets

    def finished(self) -> SeriesFold:
        """This fold with its pending points folded too (a copy; itself when nothing is pending or nothing was
        folded): its ``duplicates`` count the repeats among them."""
        if not self.folded or not self._pending_points:
            return self
        fold = self.copy()
        fold._fold(*fold._take_pending())
        fold._pending, fold._pending_points = [], 0
        return fold

    def _take_pending(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self._pending) == 1:
            return self._pending[0]
        return np.concatenate([s for s, _ in self._pending]), np.concatenate([v for _, v in self._pending])

    def _drop_from(self, step: int) -> int:
        """Drop the folded buckets whose last step is ``step`` or later: the points dropped."""
        a = self._arrays
        keep = int(np.searchsorted(a["last"], step, side="left"))  # last steps rise with the buckets
        dropped = int(a["points"][keep:].sum())
        self._arrays = {name: array[:keep] for name, array in a.items()}
        self.last_step = int(a["last"][keep - 1]) if keep else -(2**63)
        return dropped

    def _fold(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Fold one run of points (in logged order) into the buckets."""
        values = values.astype(np.float64)
        if not bool(np.all(steps[1:] > steps[:-1])):  # not one point per rising step (the usual case): sort
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
            last = np.ones(len(steps), dtype=bool)
            last[:-1] = steps[1:] != steps[:-1]  # the later of two points of a step
            self.duplicates += int(len(steps) - last.sum())
            steps, values = steps[last], values[last]
        if self.folded and int(steps[0]) <= self.last_step:  # logged again: the later points replace the buckets
            self.duplicates += self._drop_from(int(steps[0]))
        keys = steps >> self.k
        starts = np.flatnonzero(np.diff(keys, prepend=keys[0] - 1))
        finite = np.isfinite(values)
        new = {
            "first": steps[starts],
            "last": steps[np.append(starts[1:], len(steps)) - 1],
            "points": np.diff(np.append(starts, len(steps))).astype(np.int32),
            "finite": np.add.reduceat(finite.astype(np.int32), starts),
            "nan": np.add.reduceat(np.isnan(values).astype(np.int32), starts),
            "total": np.add.reduceat(np.where(finite, values, 0.0), starts),
            "low": np.minimum.reduceat(np.where(finite, values, np.inf), starts),
            "high": np.maximum.reduceat(np.where(finite, values, -np.inf), starts),
        }
        self._arrays = _joined(self._arrays, new, self.k)
        self.folded = True
        self.last_step = int(self._arrays["last"][-1])
        self._shrink()

    def _shrink(self) -> None:
        """Double the width until at most ``cap`` buckets are left."""
        while len(self._arrays["first"]) > self.cap:
            self.k += 1
            self._arrays = _regrouped(self._arrays, self._arrays["first"] >> self.k)


def _dtype(name: str) -> type:
    if name in ("points", "finite", "nan"):
        return np.int32  # a bucket of 2**31 points would need as many steps
    return np.float64 if name in ("total", "low", "high") else np.int64


def _joined(old: dict[str, np.ndarray], new: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Buckets appended after the old ones (the first new one combined with the last old one of the same key at
    width ``2**k``)."""
    joined = {name: np.concatenate([old[name], new[name]]) for name in _FIELDS}
    if len(old["first"]) and len(new["first"]) and old["first"][-1] >> k == new["first"][0] >> k:
        return _regrouped(joined, joined["first"] >> k)
    return joined


def _regrouped(a: dict[str, np.ndarray], keys: np.ndarray) -> dict[str, np.ndarray]:
    """Buckets of equal (consecutive) ``keys`` combined: counts and sums added, extremes of the extremes."""
    if not len(keys):
        return a
    starts = np.flatnonzero(np.diff(keys, prepend=keys[0] - 1))
    return {
        "first": a["first"][starts],
        "last": a["last"][np.append(starts[1:], len(keys)) - 1],
        "points": np.add.reduceat(a["points"], starts),
        "finite": np.add.reduceat(a["finite"], starts),
        "nan": np.add.reduceat(a["nan"], starts),
        "total": np.add.reduceat(a["total"], starts),
        "low": np.minimum.reduceat(a["low"], starts),
        "high": np.maximum.reduceat(a["high"], starts),
    }


def fold_series(
    steps: np.ndarray, values: np.ndarray, cap: int | None = None
) -> tuple[np.ndarray, np.ndarray, Buckets]:
    """A whole series (sorted, one point per step) longer than ``cap`` as step buckets: ``(first steps, means,
    buckets)``.

    >>> steps, means, buckets = fold_series(np.arange(8), np.array([1.0, 3.0, 5, 7, 0, 0, np.nan, 2]), cap=4)
    >>> steps.tolist(), means.tolist(), buckets.width, buckets.maxima.tolist()
    ([0, 2, 4, 6], [2.0, 6.0, 0.0, 2.0], 2, [3.0, 7.0, 0.0, 2.0])
    """
    fold = SeriesFold(cap)
    fold.add(steps, values)
    if not fold.folded:
        fold._fold(*fold._take_pending())
        fold._pending, fold._pending_points = [], 0
    out_steps, means, buckets = fold.result()
    assert buckets is not None
    return out_steps, means, buckets
