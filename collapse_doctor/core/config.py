"""Scan configuration: thresholds, severities, ignores, and where they come from.

Sources, later ones winning: the detectors' defaults; the first ``collapse-doctor.toml`` or
``pyproject.toml`` with a ``[tool.collapse-doctor]`` table found by walking up from the first input;
``--config FILE``; command-line options. Layout (``collapse-doctor.toml`` holds the same keys at top
level)::

    [tool.collapse-doctor]
    fail_on = "warning"            # never | info | warning | critical
    only = ["CD1", "CD301"]        # codes or code prefixes
    ignore = ["CD402"]
    persistence = 0.05             # share of the run a condition must hold (at least min_persistence steps)
    min_persistence = 3

    [tool.collapse-doctor.severity]
    CD402 = "info"                 # report this detector's findings at this severity

    [tool.collapse-doctor.thresholds.CD101]
    warn_ratio = 0.3

    [tool.collapse-doctor.gate]        # scan --baseline / compare --gate
    zero_advantage_margin = 0.05   # absolute growth of the zero-advantage share allowed
    rel_gain_margin = 0.25         # relative drop of a channel's rel_gain (now) allowed

Unknown keys, codes and threshold names are errors that name the key. The known codes and their
default thresholds are handed in by the caller (the pipeline passes the detector registry's
:func:`~collapse_doctor.judge.detectors.base.threshold_defaults`), so this value module imports no detector.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import FAIL_ON_LEVELS, Severity, check_fail_on

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "CONFIG_FILE",
    "FAIL_ON_LEVELS",
    "Config",
    "ThresholdRange",
    "check_fail_on",
    "check_thresholds",
    "find_config",
    "load_config",
    "parse_config",
]
ThresholdDefaults = Mapping[str, Mapping[str, float]]
"""``{code: {threshold name: default}}`` for every known detector code (codes without thresholds map to {})."""


@dataclass(frozen=True)
class ThresholdRange:
    """The values a threshold may take: finite, from ``low`` to ``high`` (inclusive), whole numbers if
    ``whole``. A value outside it would silently switch its detector off (a share of 80 meant as a percent)."""

    low: float
    high: float = math.inf
    whole: bool = False

    def check(self, value: float) -> bool:
        if not math.isfinite(value) or not self.low <= value <= self.high:
            return False
        return not self.whole or float(value).is_integer()

    def __str__(self) -> str:
        if self.whole:
            return f"a whole number >= {self.low:g}"
        if math.isinf(self.high):
            return f"a finite number >= {self.low:g}"
        return f"a number from {self.low:g} to {self.high:g}"


ThresholdRanges = Mapping[str, Mapping[str, ThresholdRange]]
"""``{code: {threshold name: range}}``, handed in beside the defaults (the detectors state them)."""
CONFIG_FILE = "collapse-doctor.toml"
_TOP_KEYS = {"fail_on", "only", "ignore", "persistence", "min_persistence", "severity", "thresholds", "gate"}
GATE_KEYS = {"zero_advantage_margin": 0.05, "rel_gain_margin": 0.25}
"""The ``[tool.collapse-doctor.gate]`` keys (``scan --baseline``, ``compare --gate``) and their defaults."""


@dataclass(frozen=True)
class Config:
    """Resolved scan settings."""

    fail_on: str = "warning"
    only: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    persistence: float = 0.05
    min_persistence: int = 3
    severity: Mapping[str, str] = field(default_factory=dict)
    thresholds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Thresholds set by a config file: ``{code: {name: value}}``."""
    gate: Mapping[str, float] = field(default_factory=dict)
    """Margins of the regression gate set by a config file (keys of :data:`GATE_KEYS`)."""
    defaults: ThresholdDefaults = field(default_factory=dict, repr=False)
    """The detectors' own thresholds, filled in by :func:`load_config`."""
    ranges: ThresholdRanges = field(default_factory=dict, repr=False)
    """The values each threshold may take (:class:`ThresholdRange`), filled in by :func:`load_config`."""

    def threshold(self, code: str, name: str) -> Any:
        """A detector's threshold: the configured value, else the detector's default.

        >>> Config(thresholds={"CD101": {"warn_ratio": 0.2}}, defaults={"CD101": {"warn_ratio": 0.3}}).threshold(
        ...     "CD101", "warn_ratio")
        0.2
        """
        override = self.thresholds.get(code, {})
        if name in override:
            return override[name]
        return self.defaults[code][name]

    def persistence_steps(self, num_steps: int) -> int:
        """How many consecutive steps a condition must hold in a run of ``num_steps``."""
        return max(1, min(num_steps, max(self.min_persistence, math.ceil(self.persistence * num_steps))))


def parse_toml(data: bytes) -> dict[str, Any]:
    """A TOML document; text that is not UTF-8 (a binary file) or nested too deeply for the parser is a
    ``TOMLDecodeError`` as any other bad TOML.

    >>> parse_toml(b"a = 1")
    {'a': 1}
    >>> try:
    ...     parse_toml(bytes([0xFF, 0xFE]))
    ... except ValueError as exc:
    ...     print(exc)
    not UTF-8 text (byte 0xff at offset 0): not a text file
    """
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        where = f"byte 0x{byte:02x} at offset {exc.start}"
        raise tomllib.TOMLDecodeError(f"not UTF-8 text ({where}): not a text file") from None
    except RecursionError:
        raise tomllib.TOMLDecodeError("nested too deeply to be read") from None


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read config file ({exc.strerror or exc})") from exc
    try:
        return parse_toml(data)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from exc


def _table_of(path: Path, data: dict[str, Any]) -> dict[str, Any] | None:
    """Our table: ``[tool.collapse-doctor]`` wherever it is (pyproject.toml or any file given with --config),
    else, in a file that is not pyproject.toml, the whole file (``collapse-doctor.toml`` style)."""
    tool = data.get("tool")
    if isinstance(tool, dict) and "collapse-doctor" in tool:
        table = tool["collapse-doctor"]
        return table if isinstance(table, dict) else None
    if path.name == "pyproject.toml":
        return None
    return data


def find_config(start: Path) -> Path | None:
    """The nearest ``collapse-doctor.toml`` or ``pyproject.toml`` with our table, walking up from ``start`` (in
    object storage, up to the prefix that was listed)."""
    directory = start if start.is_dir() else start.parent
    for folder in [directory.resolve(), *directory.resolve().parents]:
        if getattr(folder, "listed", True) is False:
            break  # object storage: only the prefixes the run's listing covered (no request per probe above them)
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and _ours(pyproject):
            return pyproject
    return None


def _ours(pyproject: Path) -> bool:
    """Whether a ``pyproject.toml`` met on the walk up holds our table. One that is not valid TOML is an error only
    when it names our table (a broken config of ours); another project's broken file is not ours to judge."""
    try:
        return _table_of(pyproject, _load_toml(pyproject)) is not None
    except UsageError:
        try:
            mentions = "tool.collapse-doctor" in pyproject.read_text(encoding="utf-8", errors="replace")
        except OSError:
            mentions = False
        if mentions:
            raise
        return False


def _string_list(value: Any, key: str, source: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{source}: '{key}' must be a list of detector codes")
    return tuple(v.strip().upper() for v in value)


def parse_config(table: Mapping[str, Any], *, source: str, base: Config) -> Config:
    """Validate a configuration table against ``base.defaults`` (the known codes) and merge it over ``base``."""
    config = base
    table = {k.replace("-", "_"): v for k, v in table.items()}
    unknown = sorted(set(table) - _TOP_KEYS)
    if unknown:
        raise UsageError(
            f"{source}: unknown key(s) {unknown} in the collapse-doctor config",
            hint=f"known keys: {', '.join(sorted(_TOP_KEYS))}",
        )
    changes: dict[str, Any] = {}
    if "fail_on" in table:
        changes["fail_on"] = check_fail_on(str(table["fail_on"]), option=f"{source}: fail_on")
    for key in ("only", "ignore"):
        if key in table:
            changes[key] = _string_list(table[key], key, source)
    if "persistence" in table:
        value = table["persistence"]
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise UsageError(f"{source}: 'persistence' must be a number between 0 and 1, got {value!r}")
        changes["persistence"] = float(value)
    if "min_persistence" in table:
        value = table["min_persistence"]
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{source}: 'min_persistence' must be a whole number >= 1, got {value!r}")
        changes["min_persistence"] = value
    if "severity" in table:
        severity = dict(config.severity)
        for code, level in _mapping(table["severity"], "severity", source).items():
            _known_code(code, source, "severity", config.defaults)
            Severity.parse(str(level), option=f"{source}: severity.{code}")
            severity[code.upper()] = str(level).lower()
        changes["severity"] = severity
    if "gate" in table:
        gate = dict(config.gate)
        for name, value in _mapping(table["gate"], "gate", source).items():
            name = name.replace("-", "_")
            if name not in GATE_KEYS:
                raise UsageError(
                    f"{source}: unknown key 'gate.{name}'", hint=f"known gate keys: {', '.join(sorted(GATE_KEYS))}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise UsageError(f"{source}: 'gate.{name}' must be a number between 0 and 1, got {value!r}")
            gate[name] = float(value)
        changes["gate"] = gate
    if "thresholds" in table:
        thresholds = {code: dict(values) for code, values in config.thresholds.items()}
        for code, values in _mapping(table["thresholds"], "thresholds", source).items():
            code = _known_code(code, source, "thresholds", config.defaults)
            known = config.defaults[code]
            for name, value in _mapping(values, f"thresholds.{code}", source).items():
                if name not in known:
                    raise UsageError(
                        f"{source}: unknown threshold 'thresholds.{code}.{name}'",
                        hint=f"{code} has: {', '.join(sorted(known)) or 'no thresholds'}",
                    )
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise UsageError(f"{source}: 'thresholds.{code}.{name}' must be a number, got {value!r}")
                check_thresholds(replace(config, thresholds={code: {name: value}}), source=source)
                thresholds.setdefault(code, {})[name] = float(value)
        changes["thresholds"] = thresholds
    return replace(config, **changes)


def check_thresholds(config: Config, *, source: str) -> None:
    """Every threshold ``config`` sets is within its range (:attr:`Config.ranges`), or a UsageError naming it."""
    for code, values in config.thresholds.items():
        for name, value in values.items():
            allowed = config.ranges.get(code, {}).get(name)
            if allowed is not None and not allowed.check(float(value)):
                default = config.defaults.get(code, {}).get(name)
                raise UsageError(
                    f"{source}: 'thresholds.{code}.{name}' must be {allowed}, got {value!r}",
                    hint=f"its default is {default:g} (docs/detectors.md, {code}, Thresholds)"
                    if default is not None
                    else f"docs/detectors.md, {code}, Thresholds",
                )


def _mapping(value: Any, key: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{source}: '{key}' must be a table")
    return value


def _known_code(code: str, source: str, key: str, known: ThresholdDefaults) -> str:
    upper = code.upper()
    if upper not in known:
        raise UsageError(
            f"{source}: unknown detector code '{key}.{code}'",
            hint=f"known codes: {', '.join(sorted(known))}",
        )
    return upper


def load_config(
    inputs: list[Path],
    explicit: str | Path | None = None,
    *,
    defaults: ThresholdDefaults,
    ranges: ThresholdRanges | None = None,
) -> Config:
    """Defaults, then the discovered file (walking up from the first input), then ``--config``; every threshold a
    file sets is checked against its range."""
    config = Config(defaults=defaults, ranges=ranges or {})
    found = find_config(inputs[0]) if inputs else None
    if found is not None:
        table = _table_of(found, _load_toml(found)) or {}
        config = parse_config(table, source=str(found), base=config)
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"--config {path}: no such file")
        explicit_table = _table_of(path, _load_toml(path))
        if explicit_table is None:
            raise UsageError(f"--config {path}: has no [tool.collapse-doctor] table")
        config = parse_config(explicit_table, source=str(path), base=config)
    return config
