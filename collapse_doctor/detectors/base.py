"""Detector machinery: severities, findings, the registry and the persistence helper.

A detector is a class with its metadata as class attributes (``code``, ``name``, ``default_severity``,
``requires``) and its documentation in the docstring, under the headings ``What it detects``,
``Why it matters``, ``Evidence`` and ``Remedy`` (``collapse-doctor explain CODE`` prints it). It is
registered with :func:`register`, which refuses malformed or duplicate codes and missing headings at
import time. :meth:`Detector.detect` reads the per-step series of a run and returns findings.
"""

from __future__ import annotations

import enum
import inspect
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from collapse_doctor.config import Config
    from collapse_doctor.diagnosis import RunSummary
    from collapse_doctor.scalars import ScalarSeries
    from collapse_doctor.series import RunSeries

EXPLAIN_HEADINGS: tuple[str, ...] = ("What it detects", "Why it matters", "Evidence", "Remedy")
_CODE = re.compile(r"^CD[1-9][0-9]{2}$")


class Severity(enum.IntEnum):
    """How bad a finding is; ``ERROR`` marks a detector that crashed."""

    INFO = 1
    WARNING = 2
    CRITICAL = 3
    ERROR = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str, *, option: str = "severity") -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            from collapse_doctor.errors import UsageError

            names = ", ".join(s.label for s in cls if s is not cls.ERROR)
            raise UsageError(f"{option} {text!r} is not one of {names}") from None


def severity_counts(severities: Iterable[Severity]) -> str:
    """Findings counted by severity, most severe first: ``"1 critical, 2 warnings, 1 info"`` ("" for none).

    >>> severity_counts([Severity.WARNING, Severity.CRITICAL, Severity.WARNING])
    '1 critical, 2 warnings'
    """
    counts = Counter(severities)
    plural = {Severity.WARNING: "warnings", Severity.ERROR: "errors"}
    return ", ".join(
        f"{counts[s]} {plural.get(s, s.label) if counts[s] != 1 else s.label}" for s in sorted(counts, reverse=True)
    )


@dataclass(frozen=True)
class Finding:
    """One problem found in a run, with the numbers behind it and what to do."""

    code: str
    severity: Severity
    title: str
    message: str
    channels: tuple[str, ...] = ()
    onset_step: int | None = None
    step_range: tuple[int, int] | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    remedy: str = ""
    gdpo_resolves: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.label,
            "channels": list(self.channels),
            "onset_step": self.onset_step,
            "step_range": list(self.step_range) if self.step_range else None,
            "title": self.title,
            "message": self.message,
            "evidence": {k: _plain(v) for k, v in self.evidence.items()},
            "remedy": self.remedy,
            "gdpo_resolves": self.gdpo_resolves,
        }


def _plain(value: Any) -> Any:
    """JSON-friendly numbers: numpy scalars to Python, floats rounded to 4 significant decimals."""
    if isinstance(value, (np.floating, float)):
        number = float(value)
        return None if not np.isfinite(number) else float(f"{number:.4g}")
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class DetectionContext:
    """What a detector sees: the run summary, its per-step series and the configuration."""

    run: RunSummary
    series: RunSeries
    config: Config
    scalars: ScalarSeries | None = None
    """The run's scalar log in canonical names (CD5xx), when it has one."""

    def threshold(self, code: str, name: str) -> Any:
        return self.config.threshold(code, name)

    @property
    def persistence(self) -> int:
        """Consecutive steps a condition must hold before it becomes a finding."""
        return self.config.persistence_steps(self.series.num_steps)

    def smooth(self, values: np.ndarray) -> np.ndarray:
        """Rolling median over about half the persistence window, so one noisy step decides nothing."""
        from collapse_doctor.series import rolling

        return rolling(values, max(1, self.persistence // 2) | 1)

    def smooth_rate(self, values: np.ndarray) -> np.ndarray:
        """Rolling mean over twice the persistence window, for shares of groups or pairs.

        A share counted over a few groups per step moves in large quanta (1 of 16 groups is 6%); its
        mean over a window estimates the underlying rate instead of reacting to one lucky step.
        """
        from collapse_doctor.series import rolling

        return rolling(values, 2 * self.persistence + 1, how="mean")

    def sustained(self, condition: np.ndarray) -> tuple[int, int] | None:
        return persistent_onset(np.asarray(condition, dtype=bool), self.persistence)

    @staticmethod
    def window(stretch: tuple[int, int]) -> slice:
        """The series rows of a stretch (both ends included)."""
        return slice(stretch[0], stretch[1] + 1)

    @property
    def algorithm(self) -> str:
        """The aggregation the run used; an unknown one is judged as plain GRPO (TRL's default)."""
        return "gdpo" if self.run.algorithm == "gdpo" else "grpo"


class Detector:
    """Base class; subclasses set the class attributes and implement :meth:`detect`."""

    code: ClassVar[str]
    name: ClassVar[str]
    default_severity: ClassVar[Severity] = Severity.WARNING
    requires: ClassVar[tuple[str, ...]] = ("rollouts",)
    thresholds: ClassVar[Mapping[str, float | int]] = {}
    per_channel: ClassVar[bool] = False

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
        **rest: Any,
    ) -> Finding:
        """A finding of this detector whose onset and step range come from a sustained stretch.

        ``stretch`` indexes ``steps``: the run's per-step series by default, or the steps of one scalar
        series (CD5xx, whose tags are logged at their own rates).
        """
        if steps is None:
            steps = ctx.series.steps
        return Finding(
            code=self.code,
            severity=severity,
            title=title,
            message=message,
            onset_step=int(steps[stretch[0]]),
            step_range=(int(steps[stretch[0]]), int(steps[stretch[1]])),
            **rest,
        )

    @classmethod
    def explain(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


REGISTRY: dict[str, type[Detector]] = {}


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
    REGISTRY[code] = cls
    return cls


def explain_sections(cls: type[Detector]) -> dict[str, str]:
    """The docstring split into its summary and the four headed sections."""
    text = cls.explain()
    parts = re.split(rf"^({'|'.join(EXPLAIN_HEADINGS)})\s*$", text, flags=re.MULTILINE)
    sections = {"summary": parts[0].strip()}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[heading] = inspect.cleandoc(body.strip("\n").strip("-").strip("\n"))
    return sections


def persistent_onset(condition: np.ndarray, min_run: int) -> tuple[int, int] | None:
    """Where a condition holds persistently: (start, end) indices, inclusive, or ``None``.

    ``start`` opens the first stretch of at least ``min_run`` consecutive True values (the onset);
    ``end`` closes the last such stretch, so the range covers every sustained episode.

    >>> persistent_onset(np.array([0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1], bool), 3)
    (4, 11)
    >>> persistent_onset(np.array([1, 0, 1], bool), 2) is None
    True
    """
    min_run = max(1, int(min_run))
    values = np.asarray(condition, dtype=bool)
    padded = np.concatenate([[False], values, [False]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    starts, ends = edges[::2], edges[1::2] - 1
    long_enough = (ends - starts + 1) >= min_run
    if not long_enough.any():
        return None
    return int(starts[long_enough][0]), int(ends[long_enough][-1])


def select(codes: Sequence[str] | None, only: Sequence[str] | None, ignore: Sequence[str] | None) -> list[str]:
    """Codes to run, in code order, after ``--only`` and ``--ignore`` (prefixes like ``CD4`` allowed)."""
    from collapse_doctor.errors import UsageError

    all_codes = sorted(codes if codes is not None else REGISTRY)

    def expand(patterns: Sequence[str], option: str) -> set[str]:
        chosen: set[str] = set()
        for pattern in patterns:
            p = pattern.strip().upper()
            if not p:
                continue
            matched = {c for c in all_codes if c.startswith(p.rstrip("X"))}
            if not matched:
                raise UsageError(f"{option} {pattern!r} matches no detector; known codes: {', '.join(all_codes)}")
            chosen |= matched
        return chosen

    selected = expand(only, "--only") if only else set(all_codes)
    if ignore:
        selected -= expand(ignore, "--ignore")
    return [c for c in all_codes if c in selected]
