"""Findings and verdicts: the values every layer shares (detectors make them, renderers read them).

Nothing here imports anything above it: a finding is a frozen value with its numbers and its remedy.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapse_doctor.core.errors import UsageError

FAIL_ON_LEVELS: tuple[str, ...] = ("never", "info", "warning", "critical")
VERDICTS = {"healthy": "HEALTHY", "inconclusive": "INCONCLUSIVE", "at_risk": "AT RISK", "collapsed": "COLLAPSED"}
"""Verdict keys (JSON) and how they are shown. ``inconclusive``: no selected detector could judge the run (too
short, or the data a detector needs is missing); a gate never passes it (:func:`exit_code`)."""
VERDICT_ORDER: tuple[str, ...] = ("healthy", "inconclusive", "at_risk", "collapsed")
"""Verdicts from best to worst (a several-run scan reports the worst)."""


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
            "evidence": {k: plain(v) for k, v in self.evidence.items()},
            "remedy": self.remedy,
            "gdpo_resolves": self.gdpo_resolves,
        }


def plain(value: Any) -> Any:
    """JSON-friendly numbers: numpy scalars to Python, floats rounded to 4 significant decimals."""
    if isinstance(value, (np.floating, float)):
        number = float(value)
        return None if not np.isfinite(number) else float(f"{number:.4g}")
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def check_fail_on(value: str, *, option: str = "--fail-on") -> str:
    """A ``--fail-on`` level, lower-cased; a UsageError for anything else.

    >>> check_fail_on(" Warning ")
    'warning'
    """
    level = value.strip().lower()
    if level not in FAIL_ON_LEVELS:
        raise UsageError(f"{option} {value!r} is not one of {', '.join(FAIL_ON_LEVELS)}")
    return level


def failing(findings: Iterable[Finding], fail_on: str) -> list[Finding]:
    """Findings at or above ``fail_on`` (crashed detectors always count, except with ``never``)."""
    level = check_fail_on(fail_on)
    if level == "never":
        return []
    threshold = Severity[level.upper()]
    return [f for f in findings if f.severity >= threshold]


def verdict_of(findings: Sequence[Finding], *, judged: bool = True) -> str:
    """``collapsed`` with a critical finding, ``at_risk`` with a warning, else ``healthy``, or ``inconclusive``
    when no detector could judge the run (``judged=False``) and nothing was found.

    >>> verdict_of([Finding("CD101", Severity.WARNING, "t", "m")])
    'at_risk'
    >>> verdict_of([], judged=False)
    'inconclusive'
    """
    levels = {f.severity for f in findings}
    if Severity.CRITICAL in levels:
        return "collapsed"
    if Severity.WARNING in levels:
        return "at_risk"
    return "healthy" if judged or findings else "inconclusive"


def exit_code(verdict: str, failing_findings: Sequence[Finding], fail_on: str) -> int:
    """1 when a finding fails the gate, or when the run could not be judged (``inconclusive``) and the gate is
    on: a gate must never pass a run it did not judge (``--fail-on never`` lets it through); else 0.

    >>> exit_code("inconclusive", [], "critical"), exit_code("inconclusive", [], "never")
    (1, 0)
    """
    if failing_findings:
        return 1
    return 1 if verdict == "inconclusive" and check_fail_on(fail_on) != "never" else 0


def worst_verdict(verdicts: Iterable[str]) -> str:
    """The worst of several verdicts.

    >>> worst_verdict(["healthy", "collapsed", "at_risk"])
    'collapsed'
    """
    return max(verdicts, key=VERDICT_ORDER.index)
