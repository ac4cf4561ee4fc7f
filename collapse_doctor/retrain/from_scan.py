"""``--from-scan``: a scan's remedies as one resolved set of changes, each printed with the finding behind it.

What is applied (to the channels given with ``--reward``):

- a channel a finding says to drop (CD401, "drop `x`") leaves the rewards (never the last one);
- suggested weights (``--weights name=w`` in a remedy: CD101, CD402). When findings disagree about a channel,
  the rule is: the finding of **highest severity** wins, then the **most specific** (the one naming the fewest
  channels), then the one listed first. Every overruled suggestion is printed with why. A weight suggested for a
  channel at its floor (CD101, never rewarded) is overruled: a channel constant within its groups adds no
  advantage, so its weight changes nothing; the line says what would (a curriculum, or ``channel_start``);
- recipes (:mod:`collapse_doctor.retrain.schedule`) where the math supports them: a channel drowning the
  objective (CD402: `x` drowns `y`) is conditioned on it (``condition = {x = "y >= 1"}``: it counts only where
  the objective passes, so it cannot be farmed while the objective fails; 1 is a binary verifier's pass value;
  not when `y` is at its ceiling by the end of the scan: a channel earned almost everywhere gates nothing);
  a GRPO run whose CD402 began in the first half of the run gets ``hybrid_switch = "on-finding:CD402@<level>"``
  (summed rewards until the monitor sees it, then GDPO);
- a finding whose counterfactual says GDPO resolves it makes ``gdpo`` the algorithm (when nothing chose one).

A scan of several runs (``{"runs": [...]}``) needs ``--from-scan-run NAME`` (a run's source, or its directory
name); without it the error lists the names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.core.findings import Severity
from collapse_doctor.retrain.rewards import RewardSpec
from collapse_doctor.retrain.schedule import Condition, HybridSwitch

_DROP = re.compile(r"drop `([^`]+)`")
_WEIGHT = re.compile(r"--weights ([A-Za-z_][\w.-]*)=([0-9.eE+-]+)")
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
        data = json.loads(path.read_text(encoding="utf-8"))
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


def scan_advice(
    path: str | Path, rewards: list[RewardSpec], weights: dict[str, float], run_name: str | None = None
) -> ScanAdvice:
    """Resolve a scan's remedies against the rewards (see the module docstring for the rules)."""
    data = read_scan(path, run_name)
    findings: list[dict[str, Any]] = data["findings"]
    summary = _dict(data.get("run"))
    advice = ScanAdvice(list(rewards), dict(weights))
    names = {r.name for r in rewards}
    floors: dict[str, str] = {}
    suggestions: list[_Suggestion] = []
    states = {
        str(c.get("channel")): str(c.get("state") or "") for c in data.get("channels") or [] if isinstance(c, dict)
    }
    for order, finding in enumerate(findings):
        code = str(finding.get("code", "?"))
        remedy = str(finding.get("remedy") or "")
        channels = [str(c) for c in finding.get("channels") or []]
        evidence = _dict(finding.get("evidence"))
        if "judged_under" in evidence and finding.get("severity") != "error":
            # a finding of a phase before the run switched aggregation: history, not what the run needs now
            where = evidence.get("phase", "earlier")
            advice.changes.append(f"{code}: from the {where} phase, before the switch; not applied")
            continue
        # Only where the scan's own counterfactual says GDPO's advantages would not show the problem.
        advice.wants_gdpo = advice.wants_gdpo or finding.get("gdpo_resolves") is True
        for channel in _DROP.findall(remedy):
            if channel not in names:
                advice.changes.append(f"{code}: would drop `{channel}`, which is not among --reward; ignored")
            elif len(advice.rewards) > 1:
                advice.rewards = [r for r in advice.rewards if r.name != channel]
                names.discard(channel)
                advice.weights.pop(channel, None)
                advice.changes.append(f"{code}: dropped channel `{channel}` ({finding.get('title', '')})")
        if code == "CD101" and evidence.get("state") == "floor":
            floors.update({c: code for c in channels})
        for channel, value in _WEIGHT.findall(remedy):
            try:
                weight = float(value.rstrip("."))
            except ValueError:
                continue
            if channel in names:
                suggestions.append(_Suggestion(channel, weight, code, _severity(finding), len(channels), order))
        if code == "CD402":
            _cd402_recipes(advice, finding, channels, evidence, names, summary, states)
    _resolve_weights(advice, suggestions, floors)
    if not advice.changes:
        advice.changes.append(f"{Path(path).name}: no channel or weight change ({data.get('verdict', '?')})")
    return advice


def _cd402_recipes(
    advice: ScanAdvice,
    finding: dict[str, Any],
    channels: list[str],
    evidence: dict[str, Any],
    names: set[str],
    summary: dict[str, Any],
    states: dict[str, str],
) -> None:
    if not channels:
        return
    loud = channels[0]
    drowned = [str(c) for c in evidence.get("drowned_channels") or channels[1:]]
    objective = next((c for c in drowned if c in names and c != loud), None)
    if objective is not None and states.get(objective) == "ceiling":
        # A channel earned almost everywhere is not an objective that fails: a condition on it gates nothing.
        advice.changes.append(
            f"CD402: `{loud}` drowns `{objective}`, but `{objective}` is at its ceiling by the end: not conditioned"
        )
        objective = None
    if loud in names and objective is not None and all(c.channel != loud for c in advice.conditions):
        advice.conditions.append(Condition(loud, objective, ">=", 1.0))
        advice.changes.append(
            f"CD402: condition `{loud}` on `{objective}` >= 1 (`{loud}` drowns `{objective}`: it now counts only "
            f"where `{objective}` passes, so it cannot be farmed while the objective fails)"
        )
    onset, steps = finding.get("onset_step"), summary.get("steps")
    early = isinstance(onset, int) and isinstance(steps, int) and steps > 0 and onset <= steps // 2
    if summary.get("algorithm") == "grpo" and early and advice.hybrid is None:
        severity = _severity(finding)
        advice.hybrid = HybridSwitch(code="CD402", severity=severity)
        advice.changes.append(
            f"CD402: hybrid_switch on-finding:CD402@{severity.label} (the GRPO run showed it at step {onset} of "
            f"{steps}: summed rewards while the channels agree, GDPO from when one drowns another)"
        )


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
