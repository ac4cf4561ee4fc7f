"""Run the selected detectors on a run's values: check each one's ``requires``, contain crashes, apply overrides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from collapse_doctor.core.estimators import has_group_baseline
from collapse_doctor.core.findings import Finding, Severity
from collapse_doctor.core.result import LACKS_SERIES
from collapse_doctor.judge.detectors.base import REGISTRY, REQUIREMENTS, DetectionContext, NotEnoughData, NotJudged


def missing_requirement(
    ctx: DetectionContext, requires: Sequence[str], reads: Sequence[Sequence[str]] = ()
) -> str | None:
    """The reason a detector cannot run on this run, or ``None`` when everything it requires is there: its
    sources (``requires``) and, for a scalar detector, one series of each group it ``reads`` (a name ending in
    ``/`` is a per-channel prefix: any channel's series)."""
    present = {
        "rollouts": bool(ctx.run.rollouts),
        "group_baseline": has_group_baseline(ctx.run.algorithm),
        "channel_series": ctx.judges_groups,
        "logged_advantage": ctx.run.logged_advantage,
        "scalars": ctx.scalars is not None,
    }
    for need in requires:
        if not present[need]:
            return REQUIREMENTS[need]
    if ctx.scalars is not None:
        names = tuple(ctx.scalars.series)
        for group in reads:
            if not any(n.startswith(g) if g.endswith("/") else n == g for g in group for n in names):
                shown = ", ".join(f"{g}<channel>" if g.endswith("/") else g for g in group)
                return f"{LACKS_SERIES}{shown} (none of its tags is in the log; docs/input-formats.md, Tag maps)"
    return None


def _too_few_steps(ctx: DetectionContext) -> str | None:
    """The reason a check of the per-step series cannot judge a run this short, or ``None``."""
    steps = ctx.series.num_steps
    if steps >= ctx.min_steps:
        return None
    if ctx.series.from_callback_scalars:
        what = f"{steps} logged point{'s' if steps != 1 else ''} of the callback's channel series"
    else:
        what = f"{steps} step{'s' if steps != 1 else ''} of rollouts"
    return f"not enough data to judge: {what}, a sustained condition needs {ctx.min_steps}+"


def run_detectors(ctx: DetectionContext, codes: Sequence[str]) -> tuple[list[Finding], dict[str, str]]:
    """Run the selected detectors (most severe findings first); a crash becomes an ``error`` finding."""
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    for code in codes:
        detector = REGISTRY[code]
        reason = missing_requirement(ctx, detector.requires, getattr(detector, "reads", ()))
        if reason is None and {"rollouts", "channel_series"} & set(detector.requires):
            reason = _too_few_steps(ctx)
        if reason is not None:
            skipped[code] = reason
            continue
        try:
            found = detector().detect(ctx)
        except NotEnoughData as exc:
            skipped[code] = f"not enough data to judge: {exc}"
            continue
        except NotJudged as exc:
            skipped[code] = str(exc)
            continue
        except Exception as exc:  # a broken detector must not hide the others' findings
            found = [
                Finding(
                    code=code,
                    severity=Severity.ERROR,
                    title=f"detector {code} crashed",
                    message=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                    remedy="report this with the input file; the other detectors ran",
                )
            ]
        override = ctx.config.severity.get(code)
        if override:
            level = Severity[override.upper()]
            found = [replace(f, severity=level) if f.severity != Severity.ERROR else f for f in found]
        findings.extend(found)
    findings.sort(key=lambda f: (-int(f.severity), f.code, f.onset_step if f.onset_step is not None else -1))
    return findings, skipped
