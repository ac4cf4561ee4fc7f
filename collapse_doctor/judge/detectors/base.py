"""Detector machinery: severities, findings, the registry and the persistence helper.

A detector is a class with its metadata as class attributes (``code``, ``name``, ``default_severity``,
``requires``) and its documentation in the docstring, under the headings ``What it detects``,
``Why it matters``, ``Evidence`` and ``Remedy`` (``collapse-doctor explain CODE`` prints it). It is
registered with :func:`register`, which refuses malformed or duplicate codes and missing headings at
import time. :meth:`Detector.detect` reads the per-step series of a run and returns findings.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from collapse_doctor.core.config import ThresholdRange
from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import Finding, Remedy, Severity, severity_counts
from collapse_doctor.core.result import REQUIREMENTS
from collapse_doctor.core.smoothing import persistent_onset, rolling

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.core.result import RunSummary
    from collapse_doctor.core.scalars import ScalarSeries
    from collapse_doctor.core.series import RunSeries

__all__ = [
    "EXPLAIN_HEADINGS",
    "REGISTRY",
    "REQUIREMENTS",
    "TARGETS",
    "DetectionContext",
    "Detector",
    "Finding",
    "Severity",
    "explain_sections",
    "persistent_onset",
    "register",
    "select",
    "severity_counts",
    "threshold_defaults",
]

EXPLAIN_HEADINGS: tuple[str, ...] = ("What it detects", "Why it matters", "Evidence", "Remedy")
_CODE = re.compile(r"^CD[1-9][0-9]{2}$")


@dataclass(frozen=True)
class DetectionContext:
    """What a detector sees: the run summary, its per-step series and the configuration."""

    run: RunSummary
    series: RunSeries
    config: Config
    scalars: ScalarSeries | None = None
    """The run's scalar log in canonical names (CD5xx), when it has one."""
    algorithm_override: str | None = None
    """Judge as if the run had used this aggregation (:meth:`counterfactual`)."""

    def threshold(self, code: str, name: str) -> Any:
        return self.config.threshold(code, name)

    @property
    def judges_groups(self) -> bool:
        """Whether the per-group channel checks can judge this run: it has rollouts, or its scalar log holds the
        per-channel series the TRL callback logs (``series`` rebuilt from them)."""
        return bool(self.run.rollouts) or self.series.from_callback_scalars

    @property
    def recomputed(self) -> bool:
        """Whether the other aggregation's advantages were recomputed (rollouts were read): the counterfactual
        (:meth:`counterfactual`) exists only then."""
        return bool(self.run.rollouts)

    @property
    def persistence(self) -> int:
        """Consecutive steps a condition must hold before it becomes a finding."""
        return self.config.persistence_steps(self.series.num_steps)

    @property
    def min_steps(self) -> int:
        """Fewest steps of rollouts on which a sustained condition can be told from a passing one: the shortest
        persistence window twice over (a condition that holds for the whole of a 3-step run is not sustained,
        it is all there is)."""
        return 2 * max(1, self.config.min_persistence)

    def smooth(self, values: np.ndarray) -> np.ndarray:
        """Rolling median over about half the persistence window, so one noisy step decides nothing."""
        return rolling(values, max(1, self.persistence // 2) | 1)

    def smooth_rate(self, values: np.ndarray) -> np.ndarray:
        """Rolling mean over twice the persistence window, for shares of groups or pairs.

        A share counted over a few groups per step moves in large quanta (1 of 16 groups is 6%); its
        mean over a window estimates the underlying rate instead of reacting to one lucky step.
        """
        return rolling(values, 2 * self.persistence + 1, how="mean")

    def sustained(self, condition: np.ndarray) -> tuple[int, int] | None:
        return persistent_onset(np.asarray(condition, dtype=bool), self.persistence)

    @property
    def current_window(self) -> slice:
        """The rows of the run's current window (:func:`current_size` of its steps): a condition that holds through
        it is graded on it."""
        n = self.series.num_steps
        return slice(n - current_size(n, self.persistence), n)

    def recovered_at(self, stretch: tuple[int, int], steps: np.ndarray | None = None) -> int | None:
        """The step a sustained condition ended at, when it ended before the current window; ``None`` while it
        holds through it (see :data:`CURRENT_WINDOW_RULE`).

        ``stretch`` indexes ``steps`` (the run's steps by default, or one scalar series' own steps, whose current
        window is counted in its own points).
        """
        if steps is None:
            steps = self.series.steps
        n = len(steps)
        start = n - current_size(n, self.config.persistence_steps(n))
        if stretch[1] >= start or stretch[1] + 1 >= n:
            return None
        held = getattr(stretch, "condition", None)
        if held is not None and len(held) == n and float(np.mean(held[start:])) >= 0.5:
            return None  # no sustained episode reaches the window, but the condition holds in most of it
        return int(steps[stretch[1] + 1])

    @staticmethod
    def window(stretch: tuple[int, int]) -> slice:
        """The series rows of a stretch (both ends included)."""
        return slice(stretch[0], stretch[1] + 1)

    @property
    def algorithm(self) -> str:
        """The aggregation the run used; an unknown one is judged as plain GRPO (TRL's default)."""
        if self.algorithm_override is not None:
            return self.algorithm_override
        return "gdpo" if self.run.algorithm == "gdpo" else "grpo"

    @property
    def other_algorithm(self) -> str:
        return "grpo" if self.algorithm == "gdpo" else "gdpo"

    def counterfactual(self) -> DetectionContext:
        """The same run judged on the other algorithm's recomputed advantages (GDPO for a GRPO run, and back).

        A finding's ``gdpo_resolves`` is whether its condition would NOT fire on this context.
        """
        return replace(self, algorithm_override=self.other_algorithm)


CURRENT_SHARE = 0.1
"""The current window of a run or a series: its last 10% (at least the persistence window)."""

CURRENT_WINDOW_RULE = (
    "A sustained condition is graded on the run's current window: its last 10% of steps (of points, for a "
    "scalar series), at least the persistence window. A condition that holds through the current window is "
    "graded on it (a collapse that lasts to the end is critical and the verdict COLLAPSED). A condition that "
    'ended before the current window is reported as info, with "recovered at step N" in its title and '
    "`recovered_step` in the JSON; its remedy is kept for reference but proposes no action, and it never "
    "decides the verdict or fails a gate at `--fail-on warning`. A detector whose harm is done while its condition "
    "holds (a transition that always ends) keeps its severity after it ends; the reference says which."
)
"""The grading rule every detector with an onset follows (:meth:`Detector.finding` applies it); docs/detectors.md
states it."""


def current_size(n: int, persistence: int, minimum: int = 1) -> int:
    """How many of ``n`` steps (or points) the current window holds: :data:`CURRENT_SHARE` of them, at least the
    persistence window and ``minimum``, at most all.

    >>> current_size(200, 10), current_size(40, 3, minimum=5), current_size(2, 3)
    (20, 5, 2)
    """
    return min(n, max(persistence, math.ceil(CURRENT_SHARE * n), minimum))


class NotEnoughData(Exception):
    """Raised by a detector whose statistics rest on less than its stated minimum support.

    The runner lists the detector as skipped with this reason ("not enough data to judge"), instead of a
    finding or a silent pass.
    """


class NotJudged(Exception):
    """Raised by a detector that does not judge this run for a reason other than support (too many channels for
    its pairwise statistics): the runner lists it as skipped with this message as it is."""


class Detector:
    """Base class; subclasses set the class attributes and implement :meth:`detect`."""

    code: ClassVar[str]
    name: ClassVar[str]
    default_severity: ClassVar[Severity] = Severity.WARNING
    requires: ClassVar[tuple[str, ...]] = ("rollouts",)
    thresholds: ClassVar[Mapping[str, float | int]] = {}
    threshold_ranges: ClassVar[Mapping[str, ThresholdRange]] = {}
    """Ranges of the thresholds that the rule of :func:`threshold_range` does not state."""
    targets: ClassVar[str] = "run"
    """What one finding is about: the whole ``run``, one ``channel``, or a channel ``pair`` (JUnit has a test
    case per target)."""
    channel_state: ClassVar[str | None] = None
    """The state the channel table gives the channels this detector's findings name (e.g. CD104: ``clipped``)."""
    graded_on_current_window: ClassVar[bool] = True
    """Whether :meth:`finding` applies :data:`CURRENT_WINDOW_RULE`. False for a detector whose harm is done while
    its condition holds (CD402: a channel squeezed while another one saturates, a transition that always ends), which
    keeps its severity after the condition ends."""

    def detect(self, ctx: DetectionContext) -> list[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(
        self,
        ctx: DetectionContext,
        stretch: tuple[int, int],
        *,
        severity: Severity,
        title: str,
        message: str,
        steps: np.ndarray | None = None,
        remedy: str | Remedy = "",
        recovered: int | Literal["auto"] | None = "auto",
        **rest: Any,
    ) -> Finding:
        """A finding of this detector whose onset and step range come from a sustained stretch.

        ``stretch`` indexes ``steps``: the run's per-step series by default, or the steps of one scalar
        series (CD5xx, whose tags are logged at their own rates). A :class:`Remedy` gives the finding its words
        and its actions together. :data:`CURRENT_WINDOW_RULE` is applied here: ``recovered`` is the step an
        ended condition recovered at (``"auto"``: :meth:`DetectionContext.recovered_at` of the stretch; ``None``:
        the detector measured that it still holds).
        """
        if steps is None:
            steps = ctx.series.steps
        if isinstance(remedy, Remedy):
            rest["actions"] = remedy.actions
            remedy = remedy.text
        if recovered == "auto":
            recovered = ctx.recovered_at(stretch, steps) if self.graded_on_current_window else None
        if recovered is not None:  # CURRENT_WINDOW_RULE: an ended condition is history, not a call to act
            severity, title = Severity.INFO, f"{title}; recovered at step {recovered}"
            rest["actions"] = ()
            if remedy:
                remedy = f"if it returns: {remedy}"
        return Finding(
            code=self.code,
            severity=severity,
            title=title,
            recovered_step=recovered,
            message=message,
            onset_step=int(steps[stretch[0]]),
            step_range=(int(steps[stretch[0]]), int(steps[stretch[1]])),
            remedy=remedy,
            **rest,
        )

    @classmethod
    def explain(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


REGISTRY: dict[str, type[Detector]] = {}
TARGETS = ("run", "channel", "pair")


def register(cls: type[Detector]) -> type[Detector]:
    """Class decorator: add a detector to :data:`REGISTRY`, checking its code and its documentation."""
    code = getattr(cls, "code", None)
    if not isinstance(code, str) or not _CODE.match(code):
        raise ValueError(f"{cls.__name__}: detector code {code!r} must look like CD101")
    if code in REGISTRY:
        raise ValueError(f"{cls.__name__}: code {code} is already used by {REGISTRY[code].__name__}")
    text = cls.explain()
    missing = [h for h in EXPLAIN_HEADINGS if not re.search(rf"^{h}\s*$", text, flags=re.MULTILINE)]
    if missing:
        raise ValueError(f"{cls.__name__}: docstring lacks the heading(s) {missing}")
    if not getattr(cls, "name", ""):
        raise ValueError(f"{cls.__name__}: detector needs a name")
    if cls.targets not in TARGETS:
        raise ValueError(f"{cls.__name__}: targets {cls.targets!r} is not one of {TARGETS}")
    for name, default in cls.thresholds.items():
        if not threshold_range(cls, name).check(float(default)):
            raise ValueError(f"{cls.__name__}: threshold {name}={default} is outside its own range")
    unknown = [need for need in cls.requires if need not in REQUIREMENTS]
    if unknown:
        raise ValueError(f"{cls.__name__}: requires {unknown}; known: {sorted(REQUIREMENTS)}")
    REGISTRY[code] = cls
    return cls


SHARE = ThresholdRange(0.0, 1.0)
COUNT = ThresholdRange(1.0, whole=True)
POSITIVE = ThresholdRange(0.0)


def threshold_range(cls: type[Detector], name: str) -> ThresholdRange:
    """The values a threshold may take: the detector's own statement, else by its default: a count (``min_*``,
    ``*_points``, ``*_groups``, ``*_spikes`` with a whole default of 1 or more) is a whole number >= 1, a default
    from 0 to 1 is a share, ratio or correlation (0 to 1), any other a finite number >= 0."""
    if name in cls.threshold_ranges:
        return cls.threshold_ranges[name]
    default = float(cls.thresholds[name])
    counting = name.startswith("min_") or name.endswith(("_points", "_groups", "_spikes", "_rows", "_pairs"))
    if counting and default >= 1 and default.is_integer():
        return COUNT
    return SHARE if 0 <= default <= 1 else POSITIVE


def threshold_ranges() -> dict[str, dict[str, ThresholdRange]]:
    """Every registered code with the range of each of its thresholds (what a config file is checked against)."""
    return {
        code: {name: threshold_range(cls, name) for name in cls.thresholds} for code, cls in sorted(REGISTRY.items())
    }


def threshold_defaults() -> dict[str, dict[str, float]]:
    """Every registered code with its default thresholds (what a config file may set)."""
    return {code: dict(cls.thresholds) for code, cls in sorted(REGISTRY.items())}


def explain_sections(cls: type[Detector]) -> dict[str, str]:
    """The docstring split into its summary and the four headed sections."""
    text = cls.explain()
    parts = re.split(rf"^({'|'.join(EXPLAIN_HEADINGS)})\s*$", text, flags=re.MULTILINE)
    sections = {"summary": parts[0].strip()}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[heading] = inspect.cleandoc(body.strip("\n").strip("-").strip("\n"))
    return sections


def codes_matching(pattern: str, codes: Sequence[str] | None = None) -> list[str]:
    """The codes a ``--only``/``explain`` pattern names: a code, or a prefix (``CD1``, ``CD1XX``), in code order.

    >>> codes_matching("cd50x", ["CD101", "CD501", "CD502"])
    ['CD501', 'CD502']
    """
    prefix = pattern.strip().upper().rstrip("X")
    return [c for c in sorted(codes if codes is not None else REGISTRY) if c.startswith(prefix)]


def select(codes: Sequence[str] | None, only: Sequence[str] | None, ignore: Sequence[str] | None) -> list[str]:
    """Codes to run, in code order, after ``--only`` and ``--ignore`` (prefixes like ``CD4`` allowed)."""
    all_codes = sorted(codes if codes is not None else REGISTRY)

    def expand(patterns: Sequence[str], option: str) -> set[str]:
        chosen: set[str] = set()
        for pattern in patterns:
            p = pattern.strip().upper()
            if not p:
                continue
            matched = set(codes_matching(p, all_codes))
            if not matched:
                raise UsageError(f"{option} {pattern!r} matches no detector; known codes: {', '.join(all_codes)}")
            chosen |= matched
        return chosen

    selected = expand(only, "--only") if only else set(all_codes)
    if ignore:
        selected -= expand(ignore, "--ignore")
    if not selected:
        raise UsageError(
            f"--only {','.join(only or ['(all)'])} --ignore {','.join(ignore or [])} selects no detector",
            hint="a scan that runs no detector judges nothing; drop the code from --ignore or widen --only",
        )
    return [c for c in all_codes if c in selected]
