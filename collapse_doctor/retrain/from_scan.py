"""``--from-scan``: a scan's remedy actions as one resolved set of changes, each printed with the finding behind it.

A finding carries its remedy twice: in words (``remedy``, for people) and as typed actions (``actions``,
:class:`collapse_doctor.core.findings.Action`). Only the actions are read here; rewording a remedy changes nothing
retrain does. What is applied (to the channels given with ``--reward``):

- ``drop``: the channel leaves the rewards (never the last one; CD401 names the collinear channel to drop);
- ``weight``: suggested weights (CD402). When findings disagree about a channel, the rule is: the finding of
  **highest severity** wins, then the **most specific** (the one naming the fewest channels), then the one listed
  first. Every overruled suggestion is printed with why. A weight suggested for a channel at its floor (CD101
  evidence ``state = floor``, never rewarded) is overruled: a channel constant within its groups adds no
  advantage, so its weight changes nothing; the line says what would (a curriculum, or ``channel_start``);
- ``condition`` and ``recipe`` (:mod:`collapse_doctor.retrain.schedule`): the scan chooses them where the math
  supports them (CD402: `x` drowns `y` conditions `x` on `y`, ``condition = {x = "y >= 1"}``, unless `y` is at
  its ceiling by the end; a GRPO run whose CD402 began in the first half of the run gets
  ``hybrid_switch = "on-finding:CD402@<level>"``); here they are checked against the ``--reward`` channels (one
  condition per channel) and applied (``hybrid_switch``, ``channel_start``; another key is reported, not applied);
- ``aggregation``, and a finding whose counterfactual says GDPO resolves it (``gdpo_resolves``), make that the
  algorithm (when nothing chose one);
- ``trainer_setting``: printed (what to change in one's own trainer), not applied.

A finding of a phase before a hybrid switch (``judged_under`` in its evidence) is history: not applied. A scan
written before findings carried actions is refused with a line saying so (re-run ``scan``). A scan of several runs
(``{"runs": [...]}``) needs ``--from-scan-run NAME`` (a run's source, or its directory name); without it the error
lists the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import CollapseDoctorError, InputError, UsageError
from collapse_doctor.core.findings import (
    Action,
    ChangeSetting,
    ConditionChannel,
    DropChannel,
    SetAggregation,
    SetRecipe,
    SetWeight,
    Severity,
)
from collapse_doctor.retrain.rewards import RewardSpec
from collapse_doctor.retrain.schedule import Condition, HybridSwitch, parse_channel_start, parse_hybrid_switch

_HINT = "write one with collapse-doctor scan RUN --json"


@dataclass
class ScanAdvice:
    """What a scan changes: rewards, weights, recipes, and one line per change or overruled suggestion."""

    rewards: list[RewardSpec]
    weights: dict[str, float]
    changes: list[str] = field(default_factory=list)
    wants_gdpo: bool = False
    conditions: list[Condition] = field(default_factory=list)
    hybrid: HybridSwitch | None = None
    channel_start: dict[str, int] = field(default_factory=dict)
    algorithm: str | None = None
    """The aggregation an ``aggregation`` action names (that of the most severe finding, then the first)."""


@dataclass(frozen=True)
class _Suggestion:
    channel: str
    weight: float
    code: str
    severity: Severity
    specificity: int
    order: int

    def rank(self) -> tuple[int, int, int]:
        return (-int(self.severity), self.specificity, self.order)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


_GENERIC = {"rollouts", "tensorboard", "completions", "runs"}


def _run_names(run: dict[str, Any]) -> list[str]:
    """What ``--from-scan-run`` accepts for a run: a source as written, or the name of a directory it is in."""
    summary = _dict(run.get("run"))
    names: list[str] = []
    for source in summary.get("sources") or []:
        path = Path(str(source))
        names.append(str(source))
        directory = path.parent if path.suffix else path
        names.append(str(directory))
        names.extend(d.name for d in (directory, *directory.parents)[:3] if d.name)
    return list(dict.fromkeys(n for n in names if n))


def _label(run: dict[str, Any]) -> str:
    """The run's nearest directory name that says which run it is (not ``rollouts``, ``tensorboard``...)."""
    sources = _dict(run.get("run")).get("sources") or []
    if not sources:
        return "?"
    path = Path(str(sources[0]))
    directory = path.parent if path.suffix else path
    for d in (directory, *directory.parents):
        if d.name and d.name not in _GENERIC:
            return d.name
    return str(directory)


def read_scan(path: str | Path, run_name: str | None = None) -> dict[str, Any]:
    """The one run of a ``scan --json`` result (``run_name`` picks one of several)."""
    path = Path(path)
    try:
        data = json_text.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the scan result ({exc.strerror or exc})", hint=_HINT) from exc
    except ValueError as exc:
        raise InputError(f"{path}: not a scan result: not valid JSON ({exc})", hint=_HINT) from exc
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        runs = [r for r in data["runs"] if isinstance(r, dict)]
        labels = [_label(r) for r in runs]
        if run_name is None:
            raise UsageError(
                f"{path}: a scan of {len(runs)} runs ({', '.join(labels)}); --from-scan needs one",
                hint="pick it with --from-scan-run NAME, or scan that run alone with scan RUN --json",
            )
        chosen = [r for r in runs if run_name in _run_names(r)]
        if len(chosen) != 1:
            what = "no run" if not chosen else f"{len(chosen)} runs"
            raise UsageError(
                f"{path}: --from-scan-run {run_name!r} matches {what}; the runs are {', '.join(labels)}",
                hint="pass one of those names",
            )
        data = chosen[0]
    elif run_name is not None and isinstance(data, dict) and run_name not in _run_names(data):
        raise UsageError(
            f"{path}: --from-scan-run {run_name!r} is not the scan's run ({_label(data)})", hint="drop --from-scan-run"
        )
    findings = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        raise InputError(f"{path}: not a scan result: no 'findings' list of objects", hint=_HINT)
    return dict(data)


def _severity(finding: dict[str, Any]) -> Severity:
    try:
        return Severity.parse(str(finding.get("severity") or "info"))
    except UsageError:
        return Severity.INFO


def _actions(path: str | Path, finding: dict[str, Any]) -> list[Action]:
    """A finding's actions; a finding without them was written by an older collapse-doctor."""
    code = str(finding.get("code", "?"))
    raw = finding.get("actions")
    if not isinstance(raw, list):
        raise InputError(
            f"{path}: finding {code} has no 'actions' (what --from-scan applies): the scan was written by an older "
            "collapse-doctor",
            hint="re-run collapse-doctor scan RUN --json scan.json",
        )
    try:
        return [Action.from_dict(a) for a in raw]
    except CollapseDoctorError as exc:
        raise InputError(f"{path}: finding {code}: {exc.message}", hint=exc.hint) from None


def scan_advice(
    path: str | Path, rewards: list[RewardSpec], weights: dict[str, float], run_name: str | None = None
) -> ScanAdvice:
    """Resolve a scan's remedy actions against the rewards (see the module docstring for the rules)."""
    data = read_scan(path, run_name)
    findings: list[dict[str, Any]] = data["findings"]
    summary = _dict(data.get("run"))
    advice = ScanAdvice(list(rewards), dict(weights))
    names = {r.name for r in rewards}
    floors: dict[str, str] = {}
    suggestions: list[_Suggestion] = []
    algorithms: list[tuple[tuple[int, int], str]] = []
    for order, finding in enumerate(findings):
        code = str(finding.get("code", "?"))
        actions = _actions(path, finding)
        channels = [str(c) for c in finding.get("channels") or []]
        evidence = _dict(finding.get("evidence"))
        if "judged_under" in evidence and finding.get("severity") != "error":
            # a finding of a phase before the run switched aggregation: history, not what the run needs now
            where = evidence.get("phase", "earlier")
            advice.changes.append(f"{code}: from the {where} phase, before the switch; not applied")
            continue
        # Only where the scan's own counterfactual says GDPO's advantages would not show the problem.
        advice.wants_gdpo = advice.wants_gdpo or finding.get("gdpo_resolves") is True
        if code == "CD101" and evidence.get("state") == "floor":
            floors.update({c: code for c in channels})
        severity = _severity(finding)
        for action in actions:
            if isinstance(action, DropChannel):
                _drop(advice, action.channel, code, str(finding.get("title", "")), names)
            elif isinstance(action, SetWeight):
                if action.channel in names:
                    suggestions.append(
                        _Suggestion(action.channel, float(action.weight), code, severity, len(channels), order)
                    )
            elif isinstance(action, SetAggregation):
                algorithms.append(((-int(severity), order), action.algorithm))
                advice.wants_gdpo = advice.wants_gdpo or action.algorithm == "gdpo"
            elif isinstance(action, ConditionChannel):
                _condition(advice, action, code, names)
            elif isinstance(action, SetRecipe):
                _recipe(advice, action, code, finding, summary, f"{path}: {code}")
            elif isinstance(action, ChangeSetting):
                advice.changes.append(f"{code}: {action.describe()} (a trainer setting: not changed by --from-scan)")
    advice.algorithm = min(algorithms)[1] if algorithms else None
    _resolve_weights(advice, suggestions, floors)
    if not advice.changes:
        advice.changes.append(f"{Path(path).name}: no channel or weight change ({data.get('verdict', '?')})")
    return advice


def _drop(advice: ScanAdvice, channel: str, code: str, title: str, names: set[str]) -> None:
    if channel not in names:
        advice.changes.append(f"{code}: would drop `{channel}`, which is not among --reward; ignored")
    elif len(advice.rewards) > 1:
        advice.rewards = [r for r in advice.rewards if r.name != channel]
        names.discard(channel)
        advice.weights.pop(channel, None)
        advice.changes.append(f"{code}: dropped channel `{channel}` ({title})")


def _condition(advice: ScanAdvice, action: ConditionChannel, code: str, names: set[str]) -> None:
    loud, objective = action.channel, action.objective
    missing = [c for c in (loud, objective) if c not in names]
    if missing:
        which = ", ".join(f"`{c}`" for c in missing)
        advice.changes.append(f"{code}: would {action.describe()}, but {which} is not among --reward; ignored")
        return
    if any(c.channel == loud for c in advice.conditions):
        return
    advice.conditions.append(Condition(loud, objective, action.op, float(action.threshold)))
    advice.changes.append(
        f"{code}: condition `{loud}` on `{objective}` {action.op} {action.threshold:g} (`{loud}` drowns `{objective}`: "
        f"it now counts only where `{objective}` passes, so it cannot be farmed while the objective fails)"
    )


def _recipe(
    advice: ScanAdvice, action: SetRecipe, code: str, finding: dict[str, Any], summary: dict[str, Any], source: str
) -> None:
    if action.key == "hybrid_switch":
        if advice.hybrid is not None:
            return
        advice.hybrid = parse_hybrid_switch(action.value, source)
        onset, steps = finding.get("onset_step"), summary.get("steps")
        advice.changes.append(
            f"{code}: hybrid_switch {action.value} (the GRPO run showed it at step {onset} of {steps}: summed "
            "rewards while the channels agree, GDPO from when one drowns another)"
        )
    elif action.key == "channel_start":
        starts = parse_channel_start(action.value, source)
        ignored = sorted(c for c in starts if c not in {r.name for r in advice.rewards})
        kept = {c: s for c, s in starts.items() if c not in ignored and c not in advice.channel_start}
        advice.channel_start.update(kept)
        if kept:
            advice.changes.append(f"{code}: channel_start {', '.join(f'{c} = {s}' for c, s in kept.items())}")
        if ignored:
            advice.changes.append(f"{code}: channel_start for {', '.join(ignored)}, not among --reward; ignored")
    else:
        advice.changes.append(f"{code}: {action.describe()}: not a recipe --from-scan applies; set it in --config")


def _resolve_weights(advice: ScanAdvice, suggestions: list[_Suggestion], floors: dict[str, str]) -> None:
    by_channel: dict[str, list[_Suggestion]] = {}
    for s in suggestions:
        by_channel.setdefault(s.channel, []).append(s)
    for channel, offered in by_channel.items():
        offered.sort(key=_Suggestion.rank)
        if channel in floors:
            for s in offered:
                advice.changes.append(
                    f"{s.code}: weight `{channel}`={s.weight:g} overruled: `{channel}` is at its floor "
                    f"({floors[channel]}), constant within its groups, so its weight changes no advantage; give it "
                    f"signal with easier prompts (a curriculum) or start the other channels later (channel_start)"
                )
            continue
        best = offered[0]
        before = advice.weights.get(channel, 1.0)
        if before != best.weight:
            advice.changes.append(f"{best.code}: weight of `{channel}` {before:g} -> {best.weight:g}")
            advice.weights[channel] = best.weight
        for s in offered[1:]:
            if s.weight == best.weight:
                continue
            if s.severity != best.severity:
                why = f"{best.code} is {best.severity.label}, {s.code} {s.severity.label}"
            elif s.specificity != best.specificity:
                why = (
                    f"{best.code} names {best.specificity} channel(s), {s.code} {s.specificity}: the more specific wins"
                )
            else:
                why = f"same severity and scope; {best.code} is listed first"
            advice.changes.append(f"{s.code}: weight `{channel}`={s.weight:g} overruled by {best.code} ({why})")
