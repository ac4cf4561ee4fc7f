"""The result of a scan as frozen values: what was read (RunSummary) and what was found (Diagnosis).

Renderers read only these; the pipeline (:mod:`collapse_doctor.pipeline.scan`) builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collapse_doctor.core.config import Config
from collapse_doctor.core.estimators import display_name, has_group_baseline, is_sparse
from collapse_doctor.core.findings import Finding, exit_code, failing, plain
from collapse_doctor.core.numbers import pct

if TYPE_CHECKING:
    from collapse_doctor.core.scalars import ScalarSeries
    from collapse_doctor.core.series import RunSeries

JSON_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Phase:
    """Steps ``first_step..last_step`` trained under one aggregation (``grpo`` or ``gdpo``)."""

    first_step: int
    last_step: int
    algorithm: str

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "step_range": [self.first_step, self.last_step]}

    def label(self) -> str:
        return f"{self.algorithm.upper()} steps {self.first_step}-{self.last_step}"


@dataclass(frozen=True)
class RunSummary:
    """What was read: sizes, channels, weights and the aggregation the run used."""

    sources: tuple[str, ...]
    steps: int
    rollouts: int
    groups: int
    group_size_min: int
    group_size_max: int
    first_step: int | None
    last_step: int | None
    channels: tuple[str, ...]
    weights: dict[str, float]
    algorithm: str
    algorithm_source: str
    logged_advantage: bool
    device: str
    warnings: tuple[str, ...] = ()
    ground_truth: dict[str, Any] | None = None
    name: str | None = None
    """The run's name when the input held several runs (a log directory with one subdirectory per run)."""
    scalar_points: int = 0
    """Scalar points read from the run's scalar log (every point, before duplicates were dropped)."""
    scalar_framework: str | None = None
    weights_source: str = "default 1.0"
    """Where ``weights`` came from: "--weights", "file metadata", "inferred from logged advantages" or "default 1.0"
    (several sources joined with " + " when channels differ)."""
    signal: Mapping[str, Any] | None = None
    """The signal budget under the run's algorithm (:func:`collapse_doctor.judge.summary.signal_budget`): shares of the
    whole run's rollouts with zero advantage and of its groups that are silent all-pass / all-fail, with their
    support. ``None`` for a run without rollouts."""
    dynamic_weight_channels: tuple[str, ...] = ()
    """Channels whose per-row weights the rollouts carry (``weight/<channel>``: retrain's gdpo-dynamic).

    Read by the detectors and remedies; not part of the JSON output."""

    set_aside: tuple[str, ...] = ()
    """Rollout files of the run that were found and not read, each with why (TRL's ``completions/`` beside the
    callback's ``rollouts/``: one training, one rollout source)."""
    channel_series: str | None = None
    """Where a run without rollouts got the per-channel series its channel checks judge: the TRL callback's
    scalars (``"callback scalars"``), or ``None``."""
    phases: tuple[Phase, ...] = ()
    """A run that switched aggregation (the rollouts' ``aggregation`` column): its phases in step order, each
    judged under its own; ``algorithm`` is the last one's. Empty for a run under one aggregation."""
    counterfactuals: Mapping[str, Any] | None = None
    """The run's rewards under every estimator of the catalogue on the same sampled groups
    (:func:`collapse_doctor.judge.counterfactuals.counterfactual_table`): zero-advantage and tied shares and who
    decides a sign, with their support. ``None`` for a run without rollouts."""

    @property
    def counterfactual_algorithm(self) -> str:
        """The aggregation a finding's ``gdpo_resolves`` was computed on: GRPO for a GDPO run, else GDPO."""
        return "GRPO" if self.algorithm == "gdpo" else "GDPO"

    def to_dict(self) -> dict[str, Any]:
        return (
            ({"name": self.name} if self.name is not None else {})
            | {
                "sources": list(self.sources),
                "steps": self.steps,
                "rollouts": self.rollouts,
                "groups": self.groups,
                "group_size": {"min": self.group_size_min, "max": self.group_size_max},
                "step_range": [self.first_step, self.last_step],
                "channels": list(self.channels),
                "weights": self.weights,
                "weights_source": self.weights_source,
                "algorithm": self.algorithm,
                "algorithm_source": self.algorithm_source,
                "logged_advantage": self.logged_advantage,
                "device": self.device,
                "warnings": list(self.warnings),
                "scalar_points": self.scalar_points,
                "scalar_framework": self.scalar_framework,
            }
            | ({"set_aside": list(self.set_aside)} if self.set_aside else {})
            | ({"channel_series": self.channel_series} if self.channel_series else {})
            | ({"phases": [p.to_dict() for p in self.phases]} if self.phases else {})
            | ({"signal": dict(self.signal)} if self.signal is not None else {})
            | ({"counterfactuals": dict(self.counterfactuals)} if self.counterfactuals is not None else {})
        )


REQUIREMENTS = {
    "rollouts": "needs rollouts; the input is a scalar log only",
    "group_baseline": "needs an estimator with a group baseline; under the run's (REINFORCE++: a batch baseline) a "
    "group of equal rewards still gets advantages",
    "channel_series": "needs rollouts, or the per-channel series CollapseDoctorCallback logs (collapse_doctor/"
    "dominance/<channel> and the others, docs/usage.md); the input is a scalar log without them",
    "logged_advantage": "needs a logged 'advantage' column",
    "scalars": "needs a scalar log (events, trainer_state, verl JSONL)",
}
"""What a detector may require, and the reason a skipped detector shows when a run lacks it."""
LACKS_SERIES = "the scalar log has none of the series it reads: "
"""The start of the reason a scalar detector is skipped for: its log lacks what it reads (``entropy``, ``kl``...)."""
_LACKS = {
    "rollouts": "rollouts",
    "scalars": "a scalar log",
    "series": "a series the scalar log lacks",
    "logged_advantage": "logged advantages",
}


@dataclass(frozen=True)
class Diagnosis:
    """The result of a scan: verdict, findings (most severe first), run summary and per-step series."""

    verdict: str
    findings: tuple[Finding, ...]
    run: RunSummary
    series: RunSeries
    detectors: Mapping[str, str]
    """``{code: name}`` of every detector selected, in code order (ran or skipped)."""
    skipped: dict[str, str] = field(default_factory=dict)
    config: Config = field(default_factory=Config)
    seconds: float = 0.0
    scalars: ScalarSeries | None = None
    """The run's scalar log in canonical names (TensorBoard, trainer_state.json, verl file logger)."""
    channels: tuple[Mapping[str, Any], ...] = ()
    """The channel table (:func:`collapse_doctor.engine.channel_table.channel_table`), one row per channel."""

    def counterfactual_of(self, finding: Finding) -> str:
        """The aggregation ``finding.gdpo_resolves`` was computed on: the other of the one it was judged under
        (a finding from before a hybrid switch names it in ``evidence["judged_under"]``), else the run's."""
        judged = finding.evidence.get("judged_under")
        if judged in ("grpo", "gdpo"):
            return "GRPO" if judged == "gdpo" else "GDPO"
        return self.run.counterfactual_algorithm

    def failing(self, fail_on: str | None = None) -> list[Finding]:
        """Findings at or above ``fail_on`` (crashed detectors always count, except with ``never``)."""
        return failing(self.findings, fail_on or self.config.fail_on)

    def exit_code(self, fail_on: str | None = None) -> int:
        """1 when a finding fails ``fail_on`` or the run could not be judged (see :func:`findings.exit_code`)."""
        return exit_code(self.verdict, self.failing(fail_on), fail_on or self.config.fail_on)

    def gate_summary(self, fail_on: str | None = None) -> str:
        """What the gate does, in words: ``"2 failing -> exit 1"``, ``"nothing failing -> exit 0"``, or why a run
        no detector could judge fails it."""
        level = fail_on or self.config.fail_on
        failing_now = self.failing(level)
        if failing_now:
            return f"{len(failing_now)} failing -> exit 1"
        if self.exit_code(level):
            return "nothing judged -> exit 1 (no selected detector could judge this run; --fail-on never passes it)"
        return "nothing failing -> exit 0"

    def coverage(self) -> dict[str, Any]:
        """What the verdict rests on: the sources read, how many of the selected checks ran, and why the others
        did not (``{"rollouts": n, "scalars": n, "series": n, "logged_advantage": n, "data": n}``: what the run lacks;
        "series": a series of the scalar log the check reads, "data": too little of it).

        A verdict that rests on part of the checks says so wherever it is shown (:func:`coverage_clause`).
        """
        lacks = {key: 0 for key in (*_LACKS, "data")}
        # a check that could judge the TRL callback's channel series counts as needing rollouts (the run lacks both)
        # and one not for the run's estimator (no group baseline) is not judged, like one with too little data
        reasons = {
            reason: key if key in _LACKS else "data" if key == "group_baseline" else "rollouts"
            for key, reason in REQUIREMENTS.items()
        }
        for reason in self.skipped.values():
            lacks[reasons.get(reason, "series" if reason.startswith(LACKS_SERIES) else "data")] += 1
        has_rollouts, has_scalars = bool(self.run.rollouts), self.scalars is not None
        sources = (
            "rollouts and a scalar log"
            if has_rollouts and has_scalars
            else "rollouts only"
            if has_rollouts
            else ("a scalar log with the callback's channel series" if self.run.channel_series else "a scalar log only")
            if has_scalars
            else "nothing readable"
        )
        return {
            "sources": sources,
            "checks": len(self.detectors),
            "ran": len(self.detectors) - len(self.skipped),
            "skipped": {key: n for key, n in lacks.items() if n},
        }

    def coverage_clause(self) -> str:
        """``"rollouts only: 8 of 21 checks ran; 11 need a scalar log"`` when checks were skipped, else "" (the
        sources the run lacks are named; checks with too little data are listed with the skipped ones)."""
        cover = self.coverage()
        if cover["ran"] == cover["checks"]:
            return ""
        why = [f"{n} need{'s' if n == 1 else ''} {_LACKS[key]}" for key, n in cover["skipped"].items() if key in _LACKS]
        return f"{cover['sources']}: {cover['ran']} of {cover['checks']} checks ran" + "".join(f"; {w}" for w in why)

    def channel_table(self) -> list[dict[str, Any]]:
        """Per channel: weight, rel_gain peak -> now, variance share, constant-group share (see ``channels``)."""
        return [dict(row) for row in self.channels]

    def to_dict(self, *, include_series: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format_version": JSON_FORMAT_VERSION,
            "verdict": self.verdict,
            "fail_on": self.config.fail_on,
            "exit_code": self.exit_code(),
            "run": plain(self.run.to_dict() | {"coverage": self.coverage()}),
            "channels": plain(self.channel_table()),
            "detectors": {
                code: {"name": name, "status": "skipped" if code in self.skipped else "ran"}
                | ({"reason": self.skipped[code]} if code in self.skipped else {})
                for code, name in self.detectors.items()
            },
            "findings": [f.to_dict() for f in self.findings],
        }
        if include_series:
            out["series"] = self.series.to_json()
            if self.scalars is not None:
                out["scalars"] = self.scalars.to_json()
        return out

    def to_json(self, *, include_series: bool = True, indent: int | None = 2) -> str:
        from collapse_doctor.core.json_text import dumps

        return dumps(self.to_dict(include_series=include_series), indent=indent)


def signal_sentence(signal: Mapping[str, Any] | None) -> str:
    """The signal budget in words: ``"31% of rollouts gave no gradient under GRPO (24% of groups all-pass, ...)"``;
    a collapse to one completion is named first.

    >>> signal_sentence({"algorithm": "grpo", "zero_advantage_rollout_share": 0.31, "all_pass_group_share": 0.24,
    ...     "all_fail_group_share": 0.05})
    '31% of rollouts gave no gradient under GRPO (24% of groups all-pass, 5% all-fail)'
    >>> signal_sentence({"algorithm": "grpo", "zero_advantage_rollout_share": 0.9, "all_pass_group_share": 0.88,
    ...     "all_fail_group_share": 0.0, "silent_causes": {"identical_completions": 0.87, "all_pass": 0.01,
    ...     "all_fail": 0.0}})
    '90% of rollouts gave no gradient under GRPO (87% of groups one completion repeated, 1% all-pass, 0% all-fail)'
    """
    if signal is None:
        return "no rollouts: the signal budget needs them"
    estimator = signal.get("estimator")
    if estimator and not has_group_baseline(str(estimator)):
        return (
            f"no group is silent by its rewards alone under {display_name(str(estimator))} (a batch baseline); "
            f"under GRPO {pct(signal['zero_advantage_rollout_share'])} of rollouts would give no gradient"
        )
    causes = signal.get("silent_causes") or {}
    repeated = causes.get("identical_completions")
    if repeated:
        split = (
            f"{pct(repeated)} of groups one completion repeated, {pct(causes.get('all_pass'))} all-pass, "
            f"{pct(causes.get('all_fail'))} all-fail"
        )
    else:
        split = (
            f"{pct(signal['all_pass_group_share'])} of groups all-pass, {pct(signal['all_fail_group_share'])} all-fail"
        )
    sentence = (
        f"{pct(signal['zero_advantage_rollout_share'])} of rollouts gave no gradient under "
        f"{display_name(str(estimator or signal['algorithm']))} ({split})"
    )
    if estimator and is_sparse(str(estimator)):
        sentence += "; besides, pass@k gives 0 to every rollout but each group's best by design"
    return sentence
