"""Score one scan against its labelled expectation: pure functions shared by the accuracy benchmark and its CI test.

``score_run(entry, diagnosis)`` takes a run's entry of ``tests/data/trl_corpus/manifest.json`` (or one built from a
simulator's ground truth by :func:`simulation_entry`) and the scan as users see it (``Diagnosis.to_dict()``: the JSON
of ``scan --json``), and returns a plain dict: every expectation with its status, and ``failures``, one line per
failed expectation, each starting with its category in brackets (``[expect]``, ``[forbid]``, ...).

Statuses: ``ok``; ``fail`` (the scan reports something else); ``n/a`` (the scan does not report the quantity at all:
a field not in its JSON yet); ``skip`` (nothing to compare, e.g. a gdpo_resolves for a code the scan did not report).
Only ``ok`` and ``skip`` pass. The scan's JSON is read defensively: fields that the detectors are still growing
(per-channel states, ``run.signal``, ``run.weights_source``) may be missing or shaped differently.

Nothing here imports collapse_doctor: the scoring reads JSON, never the tool's internals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SEVERITY_RANK: dict[str, int] = {"info": 1, "warning": 2, "critical": 3, "error": 4}
"""Finding severities as the JSON spells them (``error``: a detector that crashed, worse than critical)."""

CODE_ALIASES: dict[str, tuple[str, ...]] = {
    "SPARSE": ("CD103", "SPARSE"),
    "TRUNCATION": ("CD104", "TRUNCATION"),
    "CD105": ("CD105", "MODE_COLLAPSE"),
    "MODE_COLLAPSE": ("CD105", "MODE_COLLAPSE"),
    "CD104": ("CD104", "TRUNCATION"),
}
"""The corpus's placeholder codes and the codes that replace them (a finding under either name counts). CD105 is
"mode collapse" (most groups of the last window hold identical completions); CD103 the sparse channel."""

SIGNAL_KEYS: dict[str, tuple[str, ...]] = {
    "zero_advantage_share": ("zero_advantage_rollout_share", "zero_advantage_share"),
    "zero_advantage_group_share": ("zero_advantage_group_share", "silent_group_share"),
    "all_pass_group_share": ("all_pass_group_share",),
    "all_fail_group_share": ("all_fail_group_share",),
}
"""Manifest ``signal_budget`` keys -> the keys ``run.signal`` may use for them (first present wins)."""

CHANNEL_STATES = ("floor", "ceiling", "sparse", "ranking", "clipped")
STATE_KEYS = ("state", "channel_state", "status", "saturation", "regime")
"""Channel-table keys that may hold a channel's state (first present wins); else boolean flags named as a state."""

WEIGHT_RTOL = 0.05
"""Inferred weights match when every ratio to the reference channel is within 5% of the expected ratio."""
BUDGET_ATOL = 1e-9

GDPO_SWITCH = re.compile(r"--algo\s+gdpo(?![\w-])|normalize_then_sum|switch(?:ing)?\s+to\s+GDPO", re.IGNORECASE)
"""Remedy text proposing a switch to GDPO (``--algo gdpo-dynamic`` is not a switch: it adapts the weights)."""
_NAMED_LOWER = re.compile(r"(?:lower|reduce|decrease)\s+`([^`]+)`'?s?\s+weight", re.IGNORECASE)
_NAMED_DROP = re.compile(r"\bdrop\s+`([^`]+)`", re.IGNORECASE)
_GENERIC_LOWER = re.compile(r"\b(?:lower|reduce|decrease)\b[^.;`]*\bweight|\bdrop\b", re.IGNORECASE)
_WEIGHTS_FLAG = re.compile(r"--weights[ =]+([^\s)]+)")
GDPO_DYNAMIC = re.compile(r"--algo\s+gdpo-dynamic|\bgdpo-dynamic\b|dynamic(?:[- ]channel)?\s+weights", re.IGNORECASE)
"""Remedy text proposing per-step adaptive channel weights (a reweighting, GDPO-based)."""
_REWEIGHT = re.compile(
    r"\bre-?weight\w*|\b(?:lower|raise|reduce|increase|decrease|change|adjust|rebalance|tune|set)\b[^.;`]*\bweights?\b"
    r"|--weights[ =]",
    re.IGNORECASE,
)
"""Remedy text proposing to change channel weights (named or not)."""
_HARDER = re.compile(r"\bharder\s+(?:prompts?|tasks?|problems?|questions?|examples?|data)\b", re.IGNORECASE)
_EASIER = re.compile(r"\beasier\s+(?:prompts?|tasks?|problems?|questions?|examples?|data)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|never|don't|avoid|instead\s+of|rather\s+than)\b", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[.;:!?]")


def _affirmed(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """Matches of ``pattern`` not negated in their clause ("do not lower its weight" proposes nothing)."""
    out = []
    for match in pattern.finditer(text):
        before = text[: match.start()]
        ends = [m.end() for m in _CLAUSE_END.finditer(before)]
        if not _NEGATION.search(before[ends[-1] if ends else 0 :]):
            out.append(match)
    return out


# ---------------------------------------------------------------------------------------------------
# small readers of the scan's JSON


def verdict_label(key: Any) -> str | None:
    """A JSON verdict key as the manifest spells verdicts.

    >>> verdict_label("at_risk"), verdict_label("HEALTHY"), verdict_label(None)
    ('AT RISK', 'HEALTHY', None)
    """
    if not isinstance(key, str) or not key:
        return None
    return key.strip().upper().replace("_", " ")


def severity_rank(label: Any) -> int:
    """Rank of a severity label (0 for anything unknown)."""
    return SEVERITY_RANK.get(str(label).lower(), 0) if label is not None else 0


def code_names(code: str) -> tuple[str, ...]:
    """The finding codes that satisfy an expectation written with ``code``.

    >>> code_names("SPARSE"), code_names("CD101")
    (('CD103', 'SPARSE'), ('CD101',))
    """
    return CODE_ALIASES.get(code, (code,))


def _findings(diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for index, raw in enumerate(diagnosis.get("findings") or []):
        if not isinstance(raw, Mapping):
            continue
        finding = dict(raw)
        finding["_index"] = index
        finding["channels"] = [str(c) for c in (finding.get("channels") or [])]
        out.append(finding)
    return out


def _label(finding: Mapping[str, Any]) -> str:
    channels = finding.get("channels") or []
    return f"{finding.get('code')}[{','.join(channels)}]" if channels else str(finding.get("code"))


def _channels_match(expected: Sequence[str] | None, found: Sequence[str], mode: str = "all") -> bool:
    if not expected:
        return True
    if mode == "any":
        return any(c in found for c in expected)
    return all(c in found for c in expected)


def channel_states(diagnosis: Mapping[str, Any]) -> dict[str, str | None]:
    """``{channel: state}`` from the scan's channel table; ``None`` where a row carries no state.

    >>> channel_states({"channels": [{"channel": "a", "state": "Floor"}, {"channel": "b", "ceiling": True},
    ...                               {"channel": "c", "weight": 1.0}]})
    {'a': 'floor', 'b': 'ceiling', 'c': None}
    """
    out: dict[str, str | None] = {}
    for row in diagnosis.get("channels") or []:
        if not isinstance(row, Mapping) or row.get("channel") is None:
            continue
        state: str | None = None
        for key in STATE_KEYS:
            value = row.get(key)
            if isinstance(value, str) and value:
                state = value.strip().lower()
                break
            if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
                state = ",".join(sorted(v.strip().lower() for v in value))
                break
        if state is None:
            flags = [name for name in CHANNEL_STATES if row.get(name) is True]
            if flags:
                state = ",".join(flags)
        out[str(row["channel"])] = state
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        for key in ("share", "value", "fraction"):
            if key in value:
                return _number(value[key])
    return None


def _signal(diagnosis: Mapping[str, Any]) -> Mapping[str, Any] | None:
    run = diagnosis.get("run") or {}
    signal = run.get("signal") if isinstance(run, Mapping) else None
    return signal if isinstance(signal, Mapping) else None


# ---------------------------------------------------------------------------------------------------
# the checks


def _score_expect(
    items: Sequence[Mapping[str, Any]], findings: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], set[int]]:
    rows, matched = [], set()
    for item in items:
        code = str(item["code"])
        names = code_names(code)
        channels = list(item.get("channels") or [])
        mode = str(item.get("channels_match", "all"))
        low, high = severity_rank(item.get("min_severity", "info")), severity_rank(item.get("max_severity", "critical"))
        same_code = [f for f in findings if f.get("code") in names]
        crashed = [f for f in same_code if f.get("severity") == "error"]
        reported = [f for f in same_code if f.get("severity") != "error"]
        on_channels = [f for f in reported if _channels_match(channels, f["channels"], mode)]

        def in_range(f: Mapping[str, Any], lo: int = low, hi: int = high) -> bool:
            return lo <= severity_rank(f.get("severity")) <= hi

        # the best candidate: right channels, severity and details, else right channels and severity, else right
        # channels (most severe)
        pick = next((f for f in on_channels if in_range(f) and not detail_misses(item, f)), None)
        if pick is None:
            pick = next((f for f in on_channels if in_range(f)), None)
        if pick is None and on_channels:
            pick = max(on_channels, key=lambda f: severity_rank(f.get("severity")))
        row: dict[str, Any] = {
            "code": code,
            "channels": channels,
            "min_severity": item.get("min_severity", "info"),
            "max_severity": item.get("max_severity", "critical"),
            "found": pick is not None,
            "found_code": pick.get("code") if pick else None,
            "found_severity": pick.get("severity") if pick else None,
            "found_channels": pick["channels"] if pick else None,
            "severity_ok": bool(pick is not None and in_range(pick)),
            "gdpo_resolves_found": pick.get("gdpo_resolves") if pick else None,
            "other_channels": [f["channels"] for f in reported if f not in on_channels],
        }
        if pick is not None:
            matched.add(pick["_index"])
            misses = detail_misses(item, pick)
            if misses:
                row["detail_misses"] = misses
            row["status"] = "wrong_severity" if not row["severity_ok"] else "wrong_detail" if misses else "ok"
        elif reported:
            row["status"] = "wrong_channels"
        elif crashed:
            row["status"] = "crashed"
            row["crash"] = str(crashed[0].get("message") or "")
        else:
            row["status"] = "missing"
        if item.get("onset_step") is not None:
            onset = item["onset_step"]
            found_onset = pick.get("onset_step") if pick else None
            row["onset_expected"] = onset
            row["onset_found"] = found_onset
            row["onset_error"] = (found_onset - onset) if isinstance(found_onset, int) else None
        rows.append(row)
    return rows, matched


DETAIL_KEYS = ("title_matches", "actions_include", "evidence_ranges")
"""Expect-item keys that a matching finding must also satisfy (see :func:`detail_misses`)."""


def detail_misses(item: Mapping[str, Any], finding: Mapping[str, Any]) -> list[str]:
    """What a finding lacks of an expect item's details, one line each (empty: it has them all).

    ``title_matches``: a regular expression the finding's title must match (``re.search``, case-insensitive);
    ``actions_include``: typed actions (``findings[].actions``), each matched by some action whose given fields are
    equal; ``evidence_ranges``: ``{key: [lo, hi]}`` on the finding's ``evidence`` (a missing key is a miss).

    >>> item = {"title_matches": "recovered at step [0-9]+", "evidence_ranges": {"share": [0.2, 0.3]},
    ...         "actions_include": [{"kind": "trainer_setting", "setting": "num_generations"}]}
    >>> detail_misses(item, {"title": "identical completions at steps 3-9, recovered at step 10",
    ...                      "evidence": {"share": 0.25},
    ...                      "actions": [{"kind": "trainer_setting", "setting": "num_generations", "change": "raise"}]})
    []
    >>> for line in detail_misses(item, {"title": "collapsed", "evidence": {"share": 0.5}, "actions": []}):
    ...     print(line)
    title 'collapsed' does not match /recovered at step [0-9]+/
    no action {'kind': 'trainer_setting', 'setting': 'num_generations'} (actions: none)
    evidence share = 0.5, expected in [0.2, 0.3]
    """
    misses: list[str] = []
    pattern = item.get("title_matches")
    if pattern and not re.search(str(pattern), str(finding.get("title") or ""), re.IGNORECASE):
        misses.append(f"title {str(finding.get('title') or '')!r} does not match /{pattern}/")
    actions = [a for a in finding.get("actions") or [] if isinstance(a, Mapping)]
    for want in item.get("actions_include") or []:
        if not any(all(a.get(k) == v for k, v in want.items()) for a in actions):
            shown = "; ".join(
                f"{a.get('kind')}:{a.get('setting') or a.get('channel') or a.get('algorithm') or ''}" for a in actions
            )
            misses.append(f"no action {dict(want)} (actions: {shown or 'none'})")
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), Mapping) else {}
    for key, bounds in (item.get("evidence_ranges") or {}).items():
        value = _number(evidence.get(key)) if evidence is not None else None
        low, high = float(bounds[0]), float(bounds[1])
        if value is None:
            misses.append(f"evidence {key} not reported")
        elif not (low - BUDGET_ATOL <= value <= high + BUDGET_ATOL):
            misses.append(f"evidence {key} = {value:.4g}, expected in [{low:g}, {high:g}]")
    return misses


def _run_field(diagnosis: Mapping[str, Any], field: str) -> tuple[bool, Any]:
    value: Any = diagnosis.get("run") or {}
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _score_run_facts(expected: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The manifest's ``run_expect`` facts against the scan's ``run`` block.

    >>> facts = {"run_expect": [{"field": "rollouts", "equals": 640},
    ...                         {"field": "algorithm_source", "contains": "scale none"},
    ...                         {"field": "warnings", "any_startswith": "advantages reused"},
    ...                         {"field": "signal.rollouts", "equals": 640}]}
    >>> scan = {"run": {"rollouts": 1280, "algorithm_source": "logged advantages match GRPO (scale none)",
    ...                 "warnings": ["advantages reused: 20 of 40 logged steps"]}}
    >>> [(r["field"], r["status"]) for r in _score_run_facts(facts, scan)]
    [('rollouts', 'fail'), ('algorithm_source', 'ok'), ('warnings', 'ok'), ('signal.rollouts', 'n/a')]
    """
    rows = []
    for fact in expected.get("run_expect") or []:
        if not isinstance(fact, Mapping) or "field" not in fact:
            continue
        field = str(fact["field"])
        present, value = _run_field(diagnosis, field)
        if "equals" in fact:
            check, want = "equals", fact["equals"]
            ok = present and (
                value == want
                or (
                    _number(value) is not None
                    and _number(want) is not None
                    and math.isclose(float(value), float(want), abs_tol=1e-9)
                )
            )
        elif "contains" in fact:
            check, want = "contains", fact["contains"]
            ok = present and str(want).lower() in str(value).lower()
        elif "any_startswith" in fact:
            check, want = "any_startswith", fact["any_startswith"]
            items = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
            ok = present and any(str(v).startswith(str(want)) for v in items)
        else:
            continue
        status = "n/a" if not present else "ok" if ok else "fail"
        rows.append({"field": field, "check": check, "expected": want, "found": value, "status": status})
    return rows


def _score_false_alarms(
    expected: Mapping[str, Any], findings: list[dict[str, Any]], matched: set[int]
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    reasons: dict[int, list[str]] = {}
    for item in expected.get("forbid") or []:
        names = code_names(str(item["code"]))
        channels = list(item.get("channels") or [])
        floor = severity_rank(item.get("min_severity", "warning"))
        for f in findings:
            if f.get("code") not in names or f.get("severity") == "error" or severity_rank(f.get("severity")) < floor:
                continue
            if channels and not _channels_match(channels, f["channels"], "any"):
                continue
            scope = f"[{','.join(channels)}]" if channels else ""
            reasons.setdefault(f["_index"], []).append(f"forbidden {item['code']}{scope} >= {item['min_severity']}")
    warn_plus = [f for f in findings if f.get("severity") in ("warning", "critical")]
    limit = expected.get("max_warning")
    warnings: dict[str, Any] = {"count": len(warn_plus), "max": limit, "status": "skip"}
    if isinstance(limit, int):
        warnings["status"] = "ok" if len(warn_plus) <= limit else "fail"
        if len(warn_plus) > limit:
            # the findings over the limit: those no expectation accounts for first
            excess = len(warn_plus) - limit
            extra = [f for f in warn_plus if f["_index"] not in matched] or warn_plus
            for f in extra[:excess] if limit else warn_plus:
                reasons.setdefault(f["_index"], []).append(f"warning or worse where max_warning is {limit}")
    alarms = [
        {"code": f.get("code"), "channels": f["channels"], "severity": f.get("severity"), "reasons": reasons[i]}
        for i, f in ((f["_index"], f) for f in findings)
        if i in reasons
    ]
    unexpected = [
        {"code": f.get("code"), "channels": f["channels"], "severity": f.get("severity")}
        for f in warn_plus
        if f["_index"] not in matched and f["_index"] not in reasons
    ]
    return alarms, warnings, unexpected


def _score_channel_states(expected: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    reported = channel_states(diagnosis)
    rows = []
    for channel, state in (expected.get("channel_states") or {}).items():
        found = reported.get(channel)
        status = "n/a" if found is None else "ok" if state in found.split(",") else "fail"
        rows.append({"channel": channel, "expected": state, "reported": found, "status": status})
    return rows


def _score_signal(expected: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    budget = expected.get("signal_budget") or {}
    signal = _signal(diagnosis)
    rows = []
    for key, bounds in budget.items():
        if not (isinstance(bounds, Sequence) and len(bounds) == 2 and not isinstance(bounds, str)):
            continue  # "why", "measured"
        tool_key, value = None, None
        for candidate in SIGNAL_KEYS.get(key, (key,)):
            if signal is not None and candidate in signal:
                tool_key, value = candidate, _number(signal[candidate])
                break
        low, high = float(bounds[0]), float(bounds[1])
        status = "n/a" if value is None else "ok" if low - BUDGET_ATOL <= value <= high + BUDGET_ATOL else "fail"
        rows.append({"key": key, "tool_key": tool_key, "range": [low, high], "found": value, "status": status})
    return rows


def _score_gdpo(
    expected: Mapping[str, Any], findings: list[dict[str, Any]], expect_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for code, spec in (expected.get("gdpo_resolves") or {}).items():
        want = spec.get("resolves") if isinstance(spec, Mapping) else spec
        names = code_names(code)
        # the finding matched to the expectation of that code, else any finding of that code
        picked = [r for r in expect_rows if r["code"] == code and r["found"]]
        if picked:
            values = [r["gdpo_resolves_found"] for r in picked]
        else:
            values = [f.get("gdpo_resolves") for f in findings if f.get("code") in names]
        if not values:
            rows.append({"code": code, "expected": want, "found": None, "status": "skip"})
            continue
        found = values[0]
        status = "n/a" if found is None else "ok" if bool(found) == bool(want) else "fail"
        rows.append({"code": code, "expected": want, "found": found, "status": status})
    return rows


def _score_weights(expected: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> dict[str, Any] | None:
    want = expected.get("weights_inferred")
    if not want:
        return None
    run = diagnosis.get("run") or {}
    found = run.get("weights") if isinstance(run, Mapping) else None
    row: dict[str, Any] = {"expected": dict(want), "found": found, "source": run.get("weights_source")}
    if not isinstance(found, Mapping) or any(_number(found.get(c)) is None for c in want):
        row["status"] = "n/a"
        return row
    reference = next(c for c in want if want[c])
    base = float(found[reference])
    if base == 0:
        row["status"] = "fail"
        return row
    ok = all(
        math.isclose(float(found[c]) / base, float(want[c]) / float(want[reference]), rel_tol=WEIGHT_RTOL, abs_tol=1e-9)
        for c in want
    )
    row["status"] = "ok" if ok else "fail"
    return row


def lowered_channels(finding: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> set[str]:
    """Channels whose weight a finding's remedy proposes to lower, or which it proposes to drop.

    Named in the remedy (``lower `x`'s weight``, ``drop `x```, ``--weights x=0.1`` below the run's weight); a remedy
    that says "lower the ... weight" or "drop" without naming a channel targets the finding's only channel. A proposal
    negated in its clause ("do not lower its weight") does not count.

    >>> sorted(lowered_channels({"remedy": "lower `format`'s weight (e.g. retrain --weights format=0.1) or drop it"}))
    ['format']
    >>> sorted(lowered_channels({"remedy": "drop `b`: it repeats `a`", "channels": ["a", "b"]}))
    ['b']
    >>> sorted(lowered_channels({"remedy": "Lower the saturated channel's weight or drop it", "channels": ["f"]}))
    ['f']
    >>> lowered_channels({"remedy": "give the channels distinct weights (e.g. retrain --weights a=1,b=0.5)"}, {})
    set()
    >>> lowered_channels({"remedy": "give partial credit; do not lower its weight", "channels": ["c"]})
    set()
    """
    remedy = str(finding.get("remedy") or "")
    weights = weights or {}
    out = {m.group(1) for m in _affirmed(_NAMED_LOWER, remedy) + _affirmed(_NAMED_DROP, remedy)}
    for spec in (m.group(1) for m in _affirmed(_WEIGHTS_FLAG, remedy)):
        for part in spec.split(","):
            name, _, value = part.partition("=")
            number = _number(_parse_float(value))
            current = _number(weights.get(name))
            if number is not None and current is not None and number < current:
                out.add(name)
    channels = list(finding.get("channels") or [])
    if not out and len(channels) == 1 and _affirmed(_GENERIC_LOWER, remedy):
        out.add(channels[0])
    return out


def _parse_float(text: str) -> float | None:
    try:
        return float(text.strip().rstrip(".,;"))
    except ValueError:
        return None


def proposes_gdpo_switch(remedy: Any) -> bool:
    """Whether a remedy proposes switching to GDPO.

    >>> proposes_gdpo_switch('switch to GDPO: collapse-doctor retrain --algo gdpo --from-scan scan.json')
    True
    >>> proposes_gdpo_switch("adapt the channel weights per step: collapse-doctor retrain --algo gdpo-dynamic")
    False
    """
    return bool(GDPO_SWITCH.search(str(remedy or "")))


def remedy_contradictions(diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Findings whose remedy contradicts the scan's own numbers.

    ``gdpo_unresolved``: the remedy proposes switching to GDPO while the finding's ``gdpo_resolves`` is false.
    ``lower_floor``: the remedy proposes a lower weight for (or dropping) a channel the scan reports at its floor
    (needs per-channel states in the channel table).
    """
    states = channel_states(diagnosis)
    run = diagnosis.get("run") or {}
    weights = run.get("weights") if isinstance(run, Mapping) else None
    out = []
    for f in _findings(diagnosis):
        remedy = str(f.get("remedy") or "")
        if f.get("gdpo_resolves") is False and proposes_gdpo_switch(remedy):
            out.append(
                {
                    "code": f.get("code"),
                    "channels": f["channels"],
                    "kind": "gdpo_unresolved",
                    "detail": "remedy proposes GDPO, gdpo_resolves is false",
                    "remedy": remedy,
                }
            )
        for channel in sorted(lowered_channels(f, weights if isinstance(weights, Mapping) else None)):
            state = states.get(channel)
            if state is not None and "floor" in state.split(","):
                out.append(
                    {
                        "code": f.get("code"),
                        "channels": f["channels"],
                        "kind": "lower_floor",
                        "detail": f"remedy lowers/drops `{channel}`, reported at its floor",
                        "remedy": remedy,
                    }
                )
    return out


def proposed_kinds(finding: Mapping[str, Any]) -> set[str]:
    """What a finding's remedy proposes, among ``weight`` (change channel weights) and ``aggregation`` (switch to
    GDPO or gdpo-dynamic): from its typed ``actions`` (``findings[].actions``) and from the remedy text; a proposal
    negated in its clause does not count.

    >>> sorted(proposed_kinds({"remedy": "switch to GDPO: collapse-doctor retrain --algo gdpo"}))
    ['aggregation']
    >>> sorted(proposed_kinds({"actions": [{"kind": "weight", "channel": "f", "weight": 0.2}]}))
    ['weight']
    >>> sorted(proposed_kinds({"remedy": "lower the learning rate; do not reweight the channels or switch to GDPO"}))
    []
    >>> sorted(proposed_kinds({"remedy": "all-fail: easier prompts; all-pass: harder prompts"}))
    ['harder_and_easier']

    ``harder_and_easier``: one remedy asking for harder prompts and for easier prompts (tasks, problems, ...).
    """
    kinds = set()
    if _affirmed(_HARDER, str(finding.get("remedy") or "")) and _affirmed(_EASIER, str(finding.get("remedy") or "")):
        kinds.add("harder_and_easier")
    for action in finding.get("actions") or []:
        if isinstance(action, Mapping) and action.get("kind") in ("weight", "aggregation"):
            if action["kind"] == "aggregation" and str(action.get("algorithm", "")).lower() == "grpo":
                continue
            kinds.add(str(action["kind"]))
    remedy = str(finding.get("remedy") or "")
    if _affirmed(GDPO_SWITCH, remedy) or _affirmed(GDPO_DYNAMIC, remedy):
        kinds.add("aggregation")
    if _affirmed(_REWEIGHT, remedy) or _affirmed(_NAMED_LOWER, remedy):
        kinds.add("weight")
    return kinds


def forbidden_remedies(expected: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Findings whose remedy proposes what the manifest's ``forbid_remedies`` rules out for their code.

    Each rule: ``{"codes": [...], "kinds": ["weight", "aggregation", "harder_and_easier"], "why": ...}`` (a code's
    aliases count; a rule without ``codes`` applies to every finding).

    >>> rules = {"forbid_remedies": [{"codes": ["CD105"], "kinds": ["aggregation", "weight"]}]}
    >>> scan = {"findings": [{"code": "CD105", "severity": "critical", "remedy": "switch to GDPO"}]}
    >>> [(r["code"], r["kind"]) for r in forbidden_remedies(rules, scan)]
    [('CD105', 'forbidden_remedy')]
    """
    rules = [r for r in expected.get("forbid_remedies") or [] if isinstance(r, Mapping)]
    out = []
    for f in _findings(diagnosis) if rules else []:
        if f.get("severity") == "error":
            continue
        for rule in rules:
            codes = {name for code in rule.get("codes") or [] for name in code_names(str(code))}
            if "codes" in rule and f.get("code") not in codes:
                continue
            hit = sorted(proposed_kinds(f) & {str(k) for k in rule.get("kinds") or []})
            if hit:
                why = (
                    "(no reward varies in its silent groups)"
                    if set(hit) <= {"weight", "aggregation"}
                    else "(see the rule's why in the manifest)"
                )
                out.append(
                    {
                        "code": f.get("code"),
                        "channels": f["channels"],
                        "kind": "forbidden_remedy",
                        "detail": f"remedy proposes {' and '.join(hit)} change(s), forbidden for this run {why}",
                        "remedy": str(f.get("remedy") or ""),
                    }
                )
                break
    return out


# ---------------------------------------------------------------------------------------------------
# one run


def score_run(entry: Mapping[str, Any], diagnosis: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every expectation of ``entry`` (a manifest run) checked against ``diagnosis`` (``Diagnosis.to_dict()``).

    ``diagnosis`` may be ``None`` or carry ``"error"`` (the scan failed): every expectation then fails.

    >>> entry = {"run": "r", "expected": {"verdict": ["HEALTHY"], "max_warning": 0,
    ...          "expect": [{"code": "CD101", "channels": ["f"], "min_severity": "info", "max_severity": "info"}],
    ...          "forbid": [{"code": "CD202", "min_severity": "warning"}]}}
    >>> scan = {"verdict": "at_risk", "findings": [{"code": "CD101", "severity": "warning", "channels": ["f"]}]}
    >>> score = score_run(entry, scan)
    >>> score["expect"][0]["status"], score["verdict"]["status"], score["warnings"]["status"]
    ('wrong_severity', 'fail', 'fail')
    >>> [line.split("]")[0] + "]" for line in score["failures"]]
    ['[verdict]', '[expect]', '[max_warning]']
    """
    diagnosis = dict(diagnosis or {"error": "no scan"})
    expected = entry.get("expected") or {}
    findings = _findings(diagnosis)

    want_verdict = expected.get("verdict")
    found_verdict = verdict_label(diagnosis.get("verdict"))
    if want_verdict is None:
        verdict_status = "skip"
    elif found_verdict is None:
        verdict_status = "n/a"
    else:
        verdict_status = "ok" if found_verdict in want_verdict else "fail"

    expect_rows, matched = _score_expect(expected.get("expect") or [], findings)
    alarms, warnings, unexpected = _score_false_alarms(expected, findings, matched)
    score: dict[str, Any] = {
        "run": entry.get("run"),
        "scenario": entry.get("scenario"),
        "algo": entry.get("algo"),
        "suite": entry.get("suite", "corpus"),
        "error": diagnosis.get("error"),
        "verdict": {"expected": want_verdict, "found": found_verdict, "status": verdict_status},
        "expect": expect_rows,
        "false_alarms": alarms,
        "warnings": warnings,
        "unexpected": unexpected,
        "crashes": [
            {"code": f.get("code"), "message": str(f.get("message") or "")}
            for f in findings
            if f.get("severity") == "error"
        ],
        "findings": [
            {
                "code": f.get("code"),
                "severity": f.get("severity"),
                "channels": f["channels"],
                "onset_step": f.get("onset_step"),
                "gdpo_resolves": f.get("gdpo_resolves"),
            }
            for f in findings
        ],
        "channel_states": _score_channel_states(expected, diagnosis),
        "channel_states_reported": any(v is not None for v in channel_states(diagnosis).values()),
        "signal_budget": _score_signal(expected, diagnosis),
        "gdpo_resolves": _score_gdpo(expected, findings, expect_rows),
        "weights": _score_weights(expected, diagnosis),
        "run_facts": _score_run_facts(expected, diagnosis),
        "remedy_contradictions": remedy_contradictions(diagnosis) + forbidden_remedies(expected, diagnosis),
    }
    score["failures"] = failures(score)
    return score


def _range(row: Mapping[str, Any]) -> str:
    low, high = row.get("min_severity"), row.get("max_severity")
    return str(low) if low == high else f"{low}..{high}"


def failures(score: Mapping[str, Any]) -> list[str]:
    """One line per failed expectation of a scored run, tagged with its category."""
    out: list[str] = []
    if score.get("error"):
        out.append(f"[scan] the scan failed: {score['error']}")
    verdict = score["verdict"]
    if verdict["status"] in ("fail", "n/a"):
        out.append(f"[verdict] expected {' / '.join(verdict['expected'])}, found {verdict['found']}")
    for row in score["expect"]:
        name = f"{row['code']}[{','.join(row['channels'])}]" if row["channels"] else row["code"]
        if row["status"] == "missing":
            out.append(f"[expect] {name} {_range(row)}: not reported")
        elif row["status"] == "wrong_channels":
            others = "; ".join(f"[{','.join(c)}]" if c else "no channel" for c in row["other_channels"])
            out.append(f"[expect] {name} {_range(row)}: reported only on {others}")
        elif row["status"] == "crashed":
            out.append(f"[expect] {name} {_range(row)}: the detector crashed ({row['crash']})")
        elif row["status"] == "wrong_severity":
            out.append(f"[expect] {name} {_range(row)}: found {row['found_severity']} on {row['found_channels']}")
        elif row["status"] == "wrong_detail":
            out.append(
                f"[expect] {name} {_range(row)}: found {row['found_severity']}, but "
                + "; ".join(row.get("detail_misses") or [])
            )
    for crash in score["crashes"]:
        out.append(f"[crash] detector {crash['code']} crashed: {crash['message']}")
    for alarm in score["false_alarms"]:
        if any(r.startswith("forbidden") for r in alarm["reasons"]):
            label = f"{alarm['code']}[{','.join(alarm['channels'])}]" if alarm["channels"] else alarm["code"]
            why = "; ".join(r for r in alarm["reasons"] if r.startswith("forbidden"))
            out.append(f"[forbid] {label} fired at {alarm['severity']} ({why})")
    warnings = score["warnings"]
    if warnings["status"] == "fail":
        fired = ", ".join(
            f"{_label(a)} {a['severity']}"
            for a in score["findings"]
            if severity_rank(a["severity"]) >= SEVERITY_RANK["warning"]
        )
        out.append(f"[max_warning] expected at most {warnings['max']} warning+, found {warnings['count']}: {fired}")
    for row in score["channel_states"]:
        if row["status"] in ("fail", "n/a"):
            found = row["reported"] if row["status"] == "fail" else "not reported"
            out.append(f"[channel_state] {row['channel']}: expected {row['expected']}, found {found}")
    for row in score["signal_budget"]:
        if row["status"] in ("fail", "n/a"):
            found = row["found"] if row["status"] == "fail" else "not reported (run.signal)"
            out.append(f"[signal_budget] {row['key']}: expected in {row['range']}, found {found}")
    for row in score["gdpo_resolves"]:
        if row["status"] in ("fail", "n/a"):
            found = row["found"] if row["status"] == "fail" else "null"
            out.append(f"[gdpo_resolves] {row['code']}: expected {row['expected']}, found {found}")
    weights = score.get("weights")
    if weights and weights["status"] in ("fail", "n/a"):
        out.append(
            f"[weights] expected proportional to {weights['expected']}, found {weights['found']}"
            f" (weights_source: {weights.get('source')})"
        )
    for row in score["remedy_contradictions"]:
        label = f"{row['code']}[{','.join(row['channels'])}]" if row["channels"] else row["code"]
        out.append(f"[remedy] {label} {row['kind']}: {row['detail']}")
    for row in score.get("run_facts") or []:
        if row["status"] in ("fail", "n/a"):
            found = repr(row["found"]) if row["status"] == "fail" else "not reported"
            out.append(f"[run] run.{row['field']} {row['check']} {row['expected']!r}: found {found}")
    return out


# ---------------------------------------------------------------------------------------------------
# the simulator's ground truth as a manifest entry


def simulation_entry(truth: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """A manifest-like entry from a simulated run's ground truth (``collapse_doctor.ground_truth`` metadata).

    The ground truth names the expected codes, the affected channels and the onset, not severities or verdicts:
    a scenario without expected codes is HEALTHY with no warning; a pathology is expected at any severity, on any
    of its affected channels, and its verdict is not scored.

    >>> e = simulation_entry({"scenario": "collinear", "seed": 1, "expected_codes": ["CD401"], "onset_step": 0,
    ...                       "affected_channels": ["correct", "verifier"]})
    >>> e["run"], e["expected"]["expect"][0]["channels_match"], e["expected"]["verdict"]
    ('sim:collinear-s1', 'any', None)
    """
    codes = list(truth.get("expected_codes") or [])
    expected: dict[str, Any] = {
        "verdict": None if codes else ["HEALTHY"],
        "expect": [
            {
                "code": code,
                "channels": list(truth.get("affected_channels") or []),
                "channels_match": "any",
                "min_severity": "info",
                "max_severity": "critical",
                "onset_step": truth.get("onset_step"),
            }
            for code in codes
        ],
        "forbid": [],
    }
    if not codes:
        expected["max_warning"] = 0
    return {
        "run": name or f"sim:{truth.get('scenario')}-s{truth.get('seed')}",
        "scenario": truth.get("scenario"),
        "algo": "grpo",
        "suite": "simulator",
        "expected": expected,
    }


def scalar_entry(truth: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """A manifest-like entry from a simulated scalar log's ground truth (the run-health scenarios of the benchmark).

    ``truth["expect"]`` lists ``{"code", "min_severity", "max_severity", "onset_step"?}``; a scenario whose
    ``healthy`` is true is expected HEALTHY with no warning (an information finding it lists is still expected).

    >>> e = scalar_entry({"scenario": "regression", "seed": 0, "healthy": False,
    ...                   "expect": [{"code": "CD507", "min_severity": "warning", "max_severity": "warning"}]})
    >>> e["run"], e["suite"], e["expected"]["verdict"], "max_warning" in e["expected"]
    ('scalars:regression-s0', 'scalars', None, False)
    """
    healthy = bool(truth.get("healthy"))
    expected: dict[str, Any] = {
        "verdict": ["HEALTHY"] if healthy else None,
        "expect": [dict(item) for item in truth.get("expect") or []],
        "forbid": [dict(item) for item in truth.get("forbid") or []],
    }
    if healthy:
        expected["max_warning"] = 0
    return {
        "run": name or f"scalars:{truth.get('scenario')}-s{truth.get('seed')}",
        "scenario": truth.get("scenario"),
        "algo": "grpo",
        "suite": "scalars",
        "expected": expected,
    }


# ---------------------------------------------------------------------------------------------------
# totals and targets


def _count(rows: Iterable[Mapping[str, Any]], status: str) -> int:
    return sum(1 for r in rows if r.get("status") == status)


def totals(scores: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over scored runs (each a :func:`score_run` result)."""
    expect = [r for s in scores for r in s["expect"]]
    verdicts = [s["verdict"] for s in scores if s["verdict"]["status"] != "skip"]
    alarms = [a for s in scores for a in s["false_alarms"]]
    healthy = [s for s in scores if s["warnings"]["max"] == 0]
    healthy_warnings = sum(s["warnings"]["count"] for s in healthy)
    states = [r for s in scores for r in s["channel_states"]]
    budget = [r for s in scores for r in s["signal_budget"]]
    gdpo = [r for s in scores for r in s["gdpo_resolves"] if r["status"] != "skip"]
    weights = [s["weights"] for s in scores if s.get("weights")]
    contradictions = [c for s in scores for c in s["remedy_contradictions"]]
    facts = [r for s in scores for r in s.get("run_facts") or []]
    onsets = [r["onset_error"] for r in expect if r.get("onset_error") is not None]
    return {
        "runs": len(scores),
        "scan_errors": sum(1 for s in scores if s.get("error")),
        "detector_crashes": sum(len(s["crashes"]) for s in scores),
        "runs_passing": sum(1 for s in scores if not s["failures"]),
        "expected_findings": {
            "n": len(expect),
            "found": sum(1 for r in expect if r["found"]),
            "at_severity": _count(expect, "ok"),
            "wrong_severity": _count(expect, "wrong_severity"),
            "wrong_channels": _count(expect, "wrong_channels"),
            "missing": _count(expect, "missing"),
            "crashed": _count(expect, "crashed"),
            "wrong_detail": _count(expect, "wrong_detail"),
        },
        "verdicts": {"n": len(verdicts), "correct": _count(verdicts, "ok")},
        "false_alarms": {
            "findings": len(alarms),
            "forbidden": sum(1 for a in alarms if any(r.startswith("forbidden") for r in a["reasons"])),
            "healthy_runs": len(healthy),
            "healthy_runs_with_warnings": sum(1 for s in healthy if s["warnings"]["count"]),
            "warnings_on_healthy_runs": healthy_warnings,
            "runs_over_max_warning": sum(1 for s in scores if s["warnings"]["status"] == "fail"),
        },
        "unexpected_warnings": sum(len(s["unexpected"]) for s in scores),
        "remedy_contradictions": {
            "n": len(contradictions),
            "gdpo_unresolved": sum(1 for c in contradictions if c["kind"] == "gdpo_unresolved"),
            "lower_floor": sum(1 for c in contradictions if c["kind"] == "lower_floor"),
            "forbidden_remedy": sum(1 for c in contradictions if c["kind"] == "forbidden_remedy"),
            "runs_without_channel_states": sum(1 for s in scores if not s.get("channel_states_reported")),
        },
        "channel_states": {"n": len(states), "ok": _count(states, "ok"), "not_reported": _count(states, "n/a")},
        "signal_budget": {"n": len(budget), "ok": _count(budget, "ok"), "not_reported": _count(budget, "n/a")},
        "gdpo_resolves": {"n": len(gdpo), "ok": _count(gdpo, "ok"), "not_reported": _count(gdpo, "n/a")},
        "weights_inferred": {"n": len(weights), "ok": _count(weights, "ok")},
        "run_facts": {
            "n": len(facts),
            "ok": _count(facts, "ok"),
            "not_reported": _count(facts, "n/a"),
        },
        "onset": {
            "n": len(onsets),
            "mean_abs_error": (sum(abs(e) for e in onsets) / len(onsets)) if onsets else None,
            "max_abs_error": max((abs(e) for e in onsets), default=None),
        },
    }


def targets(total: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The benchmark's targets (``--strict`` fails when one is missed), from :func:`totals`.

    A scan that fails reports nothing, so it would pass "no warning"; every scan completing is a target too.
    """
    found = total["expected_findings"]
    return {
        "every scan completes": {
            "value": f"{total['scan_errors']} scan errors in {total['runs']} runs",
            "pass": total["scan_errors"] == 0,
        },
        "expected findings at the expected severity": {
            "value": f"{found['at_severity']} of {found['n']}",
            "pass": found["at_severity"] == found["n"],
        },
        "zero warnings on healthy runs": {
            "value": f"{total['false_alarms']['warnings_on_healthy_runs']} warning+ on "
            f"{total['false_alarms']['healthy_runs_with_warnings']} of {total['false_alarms']['healthy_runs']} runs",
            "pass": total["false_alarms"]["warnings_on_healthy_runs"] == 0,
        },
        "zero remedy contradictions": {
            "value": str(total["remedy_contradictions"]["n"]),
            "pass": total["remedy_contradictions"]["n"] == 0,
        },
        "run facts as expected": {
            "value": f"{total['run_facts']['ok']} of {total['run_facts']['n']}",
            "pass": total["run_facts"]["ok"] == total["run_facts"]["n"],
        },
    }
