"""Findings and verdicts: the values every layer shares (detectors make them, renderers read them).

Nothing here imports anything above it: a finding is a frozen value with its numbers, its remedy and the typed
actions the remedy proposes (:class:`Action`: what `retrain --from-scan` applies, so nothing parses the English).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from collapse_doctor.core.errors import InputError, UsageError

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


ACTION_KINDS: tuple[str, ...] = (
    "weight",
    "aggregation",
    "drop",
    "condition",
    "recipe",
    "trainer_setting",
)
"""The closed set of remedy actions: what a finding proposes as data (``findings[].actions`` in the JSON), so that
``retrain --from-scan`` applies it and no one parses the English of ``remedy``."""
AGGREGATIONS: Mapping[str, Mapping[str, str]] = {
    "grpo": {"multi_objective_aggregation": "sum_then_normalize"},
    "gdpo": {"multi_objective_aggregation": "normalize_then_sum"},
    "gdpo-dynamic": {},
}
"""Each ``--algo`` an action may switch to, with the TRL ``GRPOConfig`` setting that gives it (gdpo-dynamic, per-step
channel weights, is collapse-doctor's own: no TRL setting)."""
TRAINER_SETTINGS: Mapping[str, tuple[str | None, str | None]] = {
    "num_generations": ("num_generations", "actor_rollout_ref.rollout.n"),
    "learning_rate": ("learning_rate", "actor_rollout_ref.actor.optim.lr"),
    "kl_coef": ("beta", "actor_rollout_ref.actor.kl_loss_coef"),
    "max_completion_length": ("max_completion_length", "data.max_response_length"),
    "temperature": ("temperature", "actor_rollout_ref.rollout.temperature"),
    "clip_epsilon": ("epsilon", "actor_rollout_ref.actor.clip_ratio"),
    "clip_epsilon_high": ("epsilon_high", "actor_rollout_ref.actor.clip_ratio_high"),
    "num_iterations": ("num_iterations", "actor_rollout_ref.actor.ppo_epochs"),
    "max_grad_norm": ("max_grad_norm", "actor_rollout_ref.actor.grad_clip"),
    "entropy_coef": ("entropy_coef", "actor_rollout_ref.actor.entropy_coeff"),
    "scale_rewards": ("scale_rewards", None),
    "mask_truncated_completions": ("mask_truncated_completions", None),
    "overlong_penalty": (None, "reward_model.overlong_buffer.enable"),
    "adv_estimator": (None, "algorithm.adv_estimator"),
}
"""Trainer settings an action may name: ``{setting: (TRL GRPOConfig field, verl key)}``, None where the framework
has none."""
SETTING_CHANGES: tuple[str, ...] = ("raise", "lower", "set")
CONDITION_OPS: tuple[str, ...] = (">=", ">", "<=", "<", "==")
_HINT = "re-run collapse-doctor scan RUN --json scan.json with this version"


@dataclass(frozen=True)
class Action:
    """One typed change a finding proposes (like a ruff ``Fix`` edit); subclasses set ``kind``.

    >>> Action.from_dict(SetWeight("format", 0.44).to_dict())
    SetWeight(channel='format', weight=0.44)
    """

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **{f.name: plain(getattr(self, f.name)) for f in fields(self)}}

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def from_dict(data: Any) -> Action:
        """The action a ``to_dict()`` wrote; an unknown ``kind`` or a missing or mistyped field is an InputError."""
        kind = data.get("kind") if isinstance(data, Mapping) else None
        cls = _ACTION_TYPES.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise InputError(
                f"unknown remedy action kind {kind!r} (known: {', '.join(ACTION_KINDS)})",
                hint="a newer collapse-doctor wrote it? " + _HINT,
            )
        values = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is not MISSING:
                    continue
                raise InputError(f"remedy action {kind!r} lacks {f.name!r}", hint=_HINT)
            values[f.name] = data[f.name]
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise InputError(f"remedy action {kind!r}: {exc}", hint=_HINT) from None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _require_name(value: Any, field_name: str) -> None:
    _require(isinstance(value, str) and bool(value), f"{field_name} {value!r} must be a name")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SetWeight(Action):
    """Set a channel's weight (``retrain --weights channel=w``, TRL ``reward_weights``).

    >>> SetWeight("format", 0.44).flag
    '--weights format=0.44'
    """

    kind: ClassVar[str] = "weight"
    channel: str
    weight: float

    def __post_init__(self) -> None:
        _require_name(self.channel, "channel")
        _require(_is_number(self.weight) and self.weight >= 0, f"weight {self.weight!r} must be a number >= 0")

    @property
    def flag(self) -> str:
        return f"--weights {self.channel}={self.weight:g}"

    def describe(self) -> str:
        return f"set the weight of `{self.channel}` to {self.weight:g}"


@dataclass(frozen=True)
class SetAggregation(Action):
    """Train with another aggregation (``retrain --algo``; TRL ``multi_objective_aggregation``).

    >>> SetAggregation("gdpo").trl_setting
    'multi_objective_aggregation="normalize_then_sum"'
    """

    kind: ClassVar[str] = "aggregation"
    algorithm: str

    def __post_init__(self) -> None:
        _require(
            self.algorithm in AGGREGATIONS, f"algorithm {self.algorithm!r} is not one of {', '.join(AGGREGATIONS)}"
        )

    @property
    def flag(self) -> str:
        return f"--algo {self.algorithm}"

    @property
    def trl_setting(self) -> str | None:
        """The TRL ``GRPOConfig`` setting that trains this aggregation, as one writes it (None: no TRL setting)."""
        return ", ".join(f'{k}="{v}"' for k, v in AGGREGATIONS[self.algorithm].items()) or None

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"trl": dict(AGGREGATIONS[self.algorithm])}

    def describe(self) -> str:
        if self.algorithm == "gdpo-dynamic":
            return "switch to gdpo-dynamic (GDPO with the channel weights adapted per step)"
        return f"switch to {self.algorithm.upper()} (TRL {self.trl_setting})"


@dataclass(frozen=True)
class DropChannel(Action):
    """Remove a reward channel (``retrain --from-scan`` never drops the last one)."""

    kind: ClassVar[str] = "drop"
    channel: str

    def __post_init__(self) -> None:
        _require_name(self.channel, "channel")

    def describe(self) -> str:
        return f"drop `{self.channel}`"


@dataclass(frozen=True)
class ConditionChannel(Action):
    """Count ``channel`` only where ``objective`` ``op`` ``threshold`` (the retrain recipe ``condition``).

    >>> ConditionChannel("format", "correct").setting
    'condition = {format = "correct >= 1"}'
    """

    kind: ClassVar[str] = "condition"
    channel: str
    objective: str
    op: str = ">="
    threshold: float = 1.0

    def __post_init__(self) -> None:
        _require_name(self.channel, "channel")
        _require(
            isinstance(self.objective, str) and self.objective not in ("", self.channel),
            "objective must be another channel",
        )
        _require(self.op in CONDITION_OPS, f"op {self.op!r} is not one of {' '.join(CONDITION_OPS)}")
        _require(_is_number(self.threshold), f"threshold {self.threshold!r} must be a number")

    @property
    def setting(self) -> str:
        return f'condition = {{{self.channel} = "{self.objective} {self.op} {self.threshold:g}"}}'

    def describe(self) -> str:
        return f"count `{self.channel}` only where `{self.objective}` {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class SetRecipe(Action):
    """A retrain recipe key and its value (``--config``: ``hybrid_switch = "on-finding:CD402@warning"``, ...).

    >>> SetRecipe("hybrid_switch", "on-finding:CD402@warning").setting
    'hybrid_switch = "on-finding:CD402@warning"'
    """

    kind: ClassVar[str] = "recipe"
    key: str
    value: Any

    def __post_init__(self) -> None:
        _require_name(self.key, "key")
        _require(_toml(self.value) is not None, f"value {self.value!r} must be a string, a number or a table of them")

    @property
    def setting(self) -> str:
        return f"{self.key} = {_toml(self.value)}"

    def describe(self) -> str:
        return f"set the retrain recipe {self.setting}"


def _toml(value: Any) -> str | None:
    """A recipe value written as in a TOML ``--config`` (None for one that is not a string, number or flat table)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if _is_number(value):
        return f"{value:g}"
    if isinstance(value, Mapping) and value:
        items = [(k, _toml(v)) for k, v in value.items() if not isinstance(v, Mapping)]
        if len(items) == len(value) and all(isinstance(k, str) and v is not None for k, v in items):
            return "{" + ", ".join(f"{k} = {v}" for k, v in items) + "}"
    return None


@dataclass(frozen=True)
class ChangeSetting(Action):
    """Change a trainer setting (``setting`` in :data:`TRAINER_SETTINGS`): ``raise`` or ``lower`` it (to at least /
    at most ``value`` when given), or ``set`` it to ``value``.

    >>> ChangeSetting("num_generations", "raise", 2).describe()
    'raise num_generations (verl actor_rollout_ref.rollout.n) to 2 or more'
    """

    kind: ClassVar[str] = "trainer_setting"
    setting: str
    change: str
    value: Any = None

    def __post_init__(self) -> None:
        _require(
            self.setting in TRAINER_SETTINGS, f"setting {self.setting!r} is not one of {', '.join(TRAINER_SETTINGS)}"
        )
        _require(self.change in SETTING_CHANGES, f"change {self.change!r} is not one of {', '.join(SETTING_CHANGES)}")
        _require(self.value is not None or self.change != "set", "a 'set' change needs a value")
        _require(self.value is None or isinstance(self.value, (str, bool, int, float)), "value must be a plain value")

    @property
    def trl(self) -> str | None:
        return TRAINER_SETTINGS[self.setting][0]

    @property
    def verl(self) -> str | None:
        return TRAINER_SETTINGS[self.setting][1]

    @property
    def names(self) -> str:
        """``num_generations (verl actor_rollout_ref.rollout.n)``: the TRL name, and verl's where it has one."""
        if self.trl is None:
            return f"verl {self.verl}"
        return self.trl + (f" (verl {self.verl})" if self.verl else "")

    @property
    def frameworks(self) -> str:
        """``TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr` ``: the names as remedies quote them.

        >>> ChangeSetting("learning_rate", "lower").frameworks
        'TRL `learning_rate`, verl `actor_rollout_ref.actor.optim.lr`'
        """
        return ", ".join(f"{who} `{name}`" for who, name in (("TRL", self.trl), ("verl", self.verl)) if name)

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"trl": self.trl, "verl": self.verl}

    @property
    def value_text(self) -> str:
        """The value as one writes it in Python (TRL's ``GRPOConfig``): ``True``, ``2``, ``1e-06``."""
        return f"{self.value:g}" if _is_number(self.value) else str(self.value)

    def describe(self) -> str:
        if self.change == "set":
            return f"set {self.names} = {self.value_text}"
        if self.value is None:
            return f"{self.change} {self.names}"
        return f"{self.change} {self.names} to {self.value_text} or {'more' if self.change == 'raise' else 'less'}"


_ACTION_TYPES: dict[str, type[Action]] = {
    cls.kind: cls for cls in (SetWeight, SetAggregation, DropChannel, ConditionChannel, SetRecipe, ChangeSetting)
}


@dataclass(frozen=True)
class Remedy:
    """A remedy's words and the actions they propose (a detector builds both together: one source of truth).

    >>> Remedy.join("make it harder", Remedy("lower it", (SetWeight("x", 0.5),)), None).text
    'make it harder; lower it'
    """

    text: str = ""
    actions: tuple[Action, ...] = ()

    @staticmethod
    def join(*parts: str | Remedy | None) -> Remedy:
        """Parts joined with "; " (empty ones left out), their actions in order, each once."""
        remedies = [p if isinstance(p, Remedy) else Remedy(p) for p in parts if p]
        actions: list[Action] = []
        for action in (a for r in remedies for a in r.actions):
            if action not in actions:  # by value (a recipe's table makes an action unhashable)
                actions.append(action)
        return Remedy("; ".join(r.text for r in remedies if r.text), tuple(actions))


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
    actions: tuple[Action, ...] = ()
    """What the remedy proposes, as data (``retrain --from-scan`` applies these; the text words them)."""
    recovered_step: int | None = None
    """The step the condition ended at, when it ended before the run's current window (then the finding is info)."""

    @property
    def condition(self) -> str:
        """The title without its "; recovered at step N" (what the condition is, whether it lasts or ended).

        >>> Finding("CD102", Severity.INFO, "silent; recovered at step 9", "m", recovered_step=9).condition
        'silent'
        """
        if self.recovered_step is None:
            return self.title
        return self.title.removesuffix(f"; recovered at step {self.recovered_step}")

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
            "actions": [a.to_dict() for a in self.actions],
            "gdpo_resolves": self.gdpo_resolves,
            "recovered_step": self.recovered_step,
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


FindingKey = tuple[str, str, tuple[str, ...], str]
"""What makes a finding the same one from one check to the next: run name, code, channels, condition (the title
without "; recovered at step N")."""


def news(reported: dict[FindingKey, Severity], findings: Iterable[Finding], run: str = "") -> list[Finding]:
    """The findings of a new check worth printing: each condition once, when it first appears, and again only when
    its severity rises (``reported`` records what was printed; ``watch`` and the TRL callback both print by it).

    >>> seen: dict = {}
    >>> first = Finding("CD102", Severity.WARNING, "silent", "m")
    >>> [f.code for f in news(seen, [first])], news(seen, [first])
    (['CD102'], [])
    >>> ended = Finding("CD102", Severity.INFO, "silent; recovered at step 9", "m", recovered_step=9)
    >>> worse = Finding("CD102", Severity.CRITICAL, "silent", "m")
    >>> news(seen, [ended]), [f.severity.label for f in news(seen, [worse])]
    ([], ['critical'])
    """
    out = []
    for finding in findings:
        key = (run, finding.code, finding.channels, finding.condition)
        seen = reported.get(key)
        if seen is not None and finding.severity <= seen:
            continue
        reported[key] = finding.severity
        out.append(finding)
    return out


def withdrawn(
    reported: dict[FindingKey, Severity], earlier: Iterable[Finding], findings: Iterable[Finding], run: str = ""
) -> list[Finding]:
    """The findings of the run's previous check (``earlier``) that were printed and that this check no longer has:
    they are dropped from ``reported`` (so one that comes back is printed again) and returned, to be said withdrawn.

    >>> seen: dict = {}
    >>> first = Finding("CD102", Severity.WARNING, "silent", "m")
    >>> _ = news(seen, [first])
    >>> [f.code for f in withdrawn(seen, [first], [])], seen
    (['CD102'], {})
    """
    now = {(run, f.code, f.channels, f.condition) for f in findings}
    out = []
    for finding in earlier:
        key = (run, finding.code, finding.channels, finding.condition)
        if key not in now and reported.pop(key, None) is not None:
            out.append(finding)
    return out


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
