"""Retrain recipes over the steps: what aggregation, temperature, channels and conditions hold from which step.

The ``--config`` keys (validated here, one line naming the key on a mistake)::

    reward_weight_temperature = [[0, 0.7], [200, 0.4]]   # gdpo-dynamic: a number or a piecewise-constant schedule
    hybrid_switch = 100                                   # GRPO (summed rewards) before step 100, then --algo
    hybrid_switch = "on-finding:CD402@warning"            # ... or from the step after the monitor first sees it
    channel_start = {style = 50, safety = 100}            # a channel counts from this step on (weight 0 before)
    condition = {length = "correct >= 1"}                 # `length` counts only where `correct` >= 1 (else 0)
    advantage_clip_when_std_above = 0.9                   # clip a channel's z-scores to +-advantage_clip only
                                                          # at steps where their spread exceeds this

:class:`RecipeSchedule` is the resolved plan (``--dry-run`` prints :meth:`RecipeSchedule.describe`);
:mod:`collapse_doctor.retrain.recipes` computes the advantages it implies, step by step.
No torch here: the dry run stays light.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import Severity

TemperatureSchedule = tuple[tuple[int, float], ...]
"""``((first step, temperature), ...)``, steps increasing; the first value also holds before its step."""

COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}
_CONDITION = re.compile(
    r"\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(>=|<=|==|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
)
_ON_FINDING = re.compile(r"on-finding:(CD\d{3})(?:@(info|warning|critical))?")
RECIPE_KEYS: tuple[str, ...] = ("hybrid_switch", "channel_start", "condition", "advantage_clip_when_std_above")
"""Config keys that switch on the scheduled advantages (with a temperature schedule)."""


@dataclass(frozen=True)
class Condition:
    """``channel`` counts only where ``on`` ``op`` ``threshold`` (GDPO paper, eq. 8); elsewhere it scores 0."""

    channel: str
    on: str
    op: str
    threshold: float

    def passes(self, value: float) -> bool:
        """Whether a reward of ``on`` meets the condition (NaN, "not applicable", does not).

        >>> Condition("length", "correct", ">=", 1.0).passes(1.0), Condition("l", "c", ">=", 1.0).passes(0.5)
        (True, False)
        """
        return not math.isnan(value) and COMPARISONS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.channel} only where {self.on} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class HybridSwitch:
    """Summed rewards (GRPO) until ``step``, or until the monitor first sees finding ``code`` at ``severity``+."""

    step: int | None = None
    code: str | None = None
    severity: Severity = Severity.WARNING

    def __str__(self) -> str:
        if self.step is not None:
            return f"step {self.step}"
        return f"the step after the monitor first sees {self.code} at {self.severity.label} or above"


def parse_temperature(value: Any, source: str) -> float | TemperatureSchedule:
    """A positive number, or ``[[step, value], ...]`` with integer steps >= 0, strictly increasing.

    >>> parse_temperature([[0, 0.7], [50, 0.4]], "--config")
    ((0, 0.7), (50, 0.4))
    >>> parse_temperature([[10, 0.7], [5, 0.4]], "--config")
    Traceback (most recent call last):
    ...
    collapse_doctor.core.errors.UsageError: --config: reward_weight_temperature steps must increase, got 10 then 5. \
Hint: write a number, or a schedule such as [[0, 0.7], [200, 0.4]] (step, temperature)
    """
    key = "reward_weight_temperature"
    if _is_number(value):
        return _positive(value, key, source)
    hint = "write a number, or a schedule such as [[0, 0.7], [200, 0.4]] (step, temperature)"
    if not isinstance(value, (list, tuple)) or not value:
        raise UsageError(f"{source}: {key} must be a number or a list of [step, value] pairs, got {value!r}", hint=hint)
    out: list[tuple[int, float]] = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(_is_number(x) for x in pair):
            raise UsageError(f"{source}: {key} entry {pair!r} is not a [step, value] pair", hint=hint)
        step = _step(pair[0], key, source)
        if out and step <= out[-1][0]:
            raise UsageError(f"{source}: {key} steps must increase, got {out[-1][0]} then {step}", hint=hint)
        out.append((step, _positive(pair[1], key, source)))
    return tuple(out)


def parse_hybrid_switch(value: Any, source: str) -> HybridSwitch:
    """A step (int >= 1) or ``"on-finding:CODE[@severity]"`` (severity default warning).

    >>> parse_hybrid_switch("on-finding:CD402@critical", "--config").severity.label
    'critical'
    """
    key = "hybrid_switch"
    if _is_number(value):
        step = _step(value, key, source)
        if step < 1:
            raise UsageError(f"{source}: {key} step must be >= 1 (step 0 would be plain --algo)")
        return HybridSwitch(step=step)
    match = _ON_FINDING.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise UsageError(
            f"{source}: {key} {value!r} is neither a step nor 'on-finding:CODE[@severity]'",
            hint='e.g. hybrid_switch = 100 or hybrid_switch = "on-finding:CD402@warning"',
        )
    return HybridSwitch(code=match.group(1), severity=Severity.parse(match.group(2) or "warning"))


def parse_channel_start(value: Any, source: str) -> dict[str, int]:
    """``{channel: first step}`` with integer steps >= 0."""
    if not isinstance(value, Mapping) or not value:
        raise UsageError(
            f"{source}: channel_start must be a table of channel = step, got {value!r}",
            hint="e.g. channel_start = {style = 50, safety = 100}",
        )
    return {str(name): _step(step, f"channel_start.{name}", source) for name, step in value.items()}


def parse_conditions(value: Any, source: str) -> tuple[Condition, ...]:
    """``{channel: "other >= threshold"}`` (operators ``>= > <= < ==``)."""
    hint = 'e.g. condition = {length = "correct >= 1"}'
    if not isinstance(value, Mapping) or not value:
        raise UsageError(f'{source}: condition must be a table of channel = "other >= threshold"', hint=hint)
    out = []
    for name, expression in value.items():
        match = _CONDITION.fullmatch(expression) if isinstance(expression, str) else None
        if match is None:
            raise UsageError(f"{source}: condition.{name} {expression!r} is not 'channel OP number'", hint=hint)
        on, op, threshold = match.groups()
        if on == name:
            raise UsageError(f"{source}: condition.{name} is conditioned on itself", hint="name another channel")
        out.append(Condition(str(name), on, op, float(threshold)))
    return tuple(out)


def parse_clip_threshold(value: Any, source: str) -> float:
    """A number in (0, 1): the spread of a channel's z-scores over a step above which they are clipped.

    Group z-scores (ddof=1) have mean 0 and std 1 in every group that varies, so their spread over a step's rows
    is at most 1 (about the square root of the share of rows in groups where the channel varies): a threshold of
    1 or more would never clip.
    """
    threshold = _positive(value, "advantage_clip_when_std_above", source)
    if threshold >= 1:
        raise UsageError(
            f"{source}: advantage_clip_when_std_above {value!r} never clips: the spread of group z-scores over a step "
            "is at most 1",
            hint="choose a value in (0, 1), e.g. 0.9",
        )
    return threshold


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value: Any, key: str, source: str) -> float:
    if not _is_number(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise UsageError(f"{source}: {key} must be a number > 0, got {value!r}")
    return float(value)


def _step(value: Any, key: str, source: str) -> int:
    if not _is_number(value) or not math.isfinite(float(value)) or float(value) != int(value) or value < 0:
        raise UsageError(f"{source}: {key} must be a step (an integer >= 0), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Phase:
    """What holds from ``start`` on (until the next phase): one line of the dry-run plan."""

    start: int | str
    aggregation: str
    temperature: float | None
    channels: tuple[str, ...]

    def line(self, conditions: Sequence[Condition], clip: str) -> str:
        start = f"from step {self.start:<4}" if isinstance(self.start, int) else f"{self.start:<14}"
        parts = [self.aggregation]
        if self.temperature is not None:
            parts.append(f"T={self.temperature:g}")
        parts.append("channels " + (", ".join(self.channels) or "as scheduled by step"))
        active = [str(c) for c in conditions if c.channel in self.channels]
        if active:
            parts.append("conditions: " + "; ".join(active))
        if clip and self.aggregation != "grpo":
            parts.append(clip)
        return f"{start} " + ", ".join(parts)


@dataclass(frozen=True)
class RecipeSchedule:
    """The resolved recipes of a retrain: the aggregation, temperature and channels of each step."""

    algo: str
    """The algorithm after the hybrid switch (or throughout)."""
    channels: tuple[str, ...]
    temperature: float | TemperatureSchedule
    hybrid: HybridSwitch | None = None
    channel_start: dict[str, int] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    clip: float = 2.0
    clip_when_std_above: float | None = None

    @property
    def scheduled(self) -> bool:
        """Whether any recipe is on (then collapse-doctor computes the advantages TRL's loss uses)."""
        return bool(
            self.hybrid
            or self.channel_start
            or self.conditions
            or self.clip_when_std_above is not None
            or isinstance(self.temperature, tuple)
        )

    def temperature_at(self, step: int) -> float:
        """The softmax temperature of gdpo-dynamic at ``step``.

        >>> RecipeSchedule("gdpo-dynamic", ("a",), ((0, 0.7), (10, 0.4))).temperature_at(12)
        0.4
        """
        if not isinstance(self.temperature, tuple):
            return self.temperature
        value = self.temperature[0][1]
        for start, temperature in self.temperature:
            if step >= start:
                value = temperature
        return value

    def aggregation_at(self, step: int, switched_at: int | None = None) -> str:
        """``grpo`` before the hybrid switch, else :attr:`algo`. ``switched_at``: when an on-finding switch fired."""
        if self.hybrid is None:
            return self.algo
        start = self.hybrid.step if self.hybrid.step is not None else switched_at
        return self.algo if start is not None and step >= start else "grpo"

    def active_at(self, step: int) -> tuple[str, ...]:
        """The channels that count at ``step`` (``channel_start``)."""
        return tuple(c for c in self.channels if step >= self.channel_start.get(c, 0))

    def phases(self) -> list[Phase]:
        """Every change point, in order (an on-finding switch shows as its own, step-less phase)."""
        starts = {0, *self.channel_start.values()}
        if isinstance(self.temperature, tuple):
            starts.update(s for s, _ in self.temperature)
        if self.hybrid is not None and self.hybrid.step is not None:
            starts.add(self.hybrid.step)
        phases: list[Phase] = []
        for start in sorted(starts):
            phases.append(self._phase(start, start, self.aggregation_at(start)))
        if self.hybrid is not None and self.hybrid.step is None:
            phases.append(self._phase(f"on {self.hybrid.code}", 0, self.algo, channels_from=None))
        merged: list[Phase] = []
        for phase in phases:
            if merged and (phase.aggregation, phase.temperature, phase.channels) == (
                merged[-1].aggregation,
                merged[-1].temperature,
                merged[-1].channels,
            ):
                continue
            merged.append(phase)
        return merged

    def _phase(self, label: int | str, step: int, aggregation: str, channels_from: int | None = -1) -> Phase:
        channels = self.active_at(step) if channels_from == -1 else ()
        temperature = None if aggregation != "gdpo-dynamic" or channels_from != -1 else self.temperature_at(step)
        return Phase(label, aggregation, temperature, channels)

    def describe(self) -> list[str]:
        """The plan's ``schedule`` lines: one per phase, then the on-finding rule."""
        clip = ""
        if self.clip_when_std_above is not None:
            clip = f"clip z +-{self.clip:g} where a channel's z spread > {self.clip_when_std_above:g}"
        lines = [phase.line(self.conditions, clip) for phase in self.phases()]
        if self.hybrid is not None and self.hybrid.step is None:
            lines.append(f"switch to {self.algo} at {self.hybrid} (checked after each rollout part)")
        return lines


def check_schedule(schedule: RecipeSchedule, source: str = "--config") -> None:
    """Channel names and algorithms the recipes need must exist; one line naming the key otherwise."""
    names = set(schedule.channels)
    known = ", ".join(schedule.channels)
    for name in schedule.channel_start:
        if name not in names:
            raise UsageError(f"{source}: channel_start names unknown channel {name!r}", hint=f"the rewards are {known}")
    if schedule.channel_start and not schedule.active_at(0):
        raise UsageError(f"{source}: channel_start leaves no channel active at step 0", hint="start the main one at 0")
    for condition in schedule.conditions:
        for name in (condition.channel, condition.on):
            if name not in names:
                raise UsageError(f"{source}: condition names unknown channel {name!r}", hint=f"the rewards are {known}")
    if schedule.hybrid is not None and schedule.algo == "grpo":
        raise UsageError(
            f"{source}: hybrid_switch goes from grpo to per-channel normalisation, but the algorithm is grpo",
            hint="use --algo gdpo or gdpo-dynamic (the algorithm after the switch)",
        )
    if isinstance(schedule.temperature, tuple) and schedule.algo != "gdpo-dynamic":
        raise UsageError(
            f"{source}: a reward_weight_temperature schedule needs gdpo-dynamic, the algorithm is {schedule.algo}",
            hint="use --algo gdpo-dynamic, or a single number",
        )
