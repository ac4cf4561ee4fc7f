"""Retrain settings: the ``--config`` file (JSON or TOML) and its defaults.

Keys (unknown keys are an error that names the key)::

    group_size = 8                      # completions per prompt (TRL num_generations)
    reward_mode = "decompose"           # sum (grpo) | decompose (gdpo) | decompose_and_dynamic_weight
    reward_weights_ema_alpha = 0.05     # gdpo-dynamic: EMA of each channel's advantage std
    reward_weight_temperature = 0.5     # gdpo-dynamic: softmax temperature
    reward_weight_min = 0.1             # gdpo-dynamic: bounds of each weight
    reward_weight_max = 0.5
    advantage_clip = 2.0                # gdpo-dynamic: per-channel advantage clip before fusion
    # recipes (collapse_doctor.retrain.schedule): a temperature schedule [[step, T], ...] above, and
    hybrid_switch = 100                 # or "on-finding:CD402@warning": GRPO first, then --algo
    channel_start = {style = 50}        # progressive channels: weight 0 before the step
    condition = {length = "correct >= 1"}   # a channel counts only where another passes (else 0)
    advantage_clip_when_std_above = 0.9 # clip a channel's z-scores only where their spread (<= 1) exceeds this
    policy_clip_epsilon = 0.2           # PPO clip range (TRL epsilon)
    kl_target = 0.02                    # adaptive KL coefficient aiming at this KL (off when absent)
    learning_rate = 1e-6
    warmup_steps = 0
    batch_size_prompts = 8              # prompts per step (each sampled group_size times)

A TOML file may hold them at top level or under ``[tool.collapse-doctor.retrain]``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from collapse_doctor.core.config import parse_toml
from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.json_text import loads
from collapse_doctor.engine.advantages import (
    ADVANTAGE_CLIP,
    DYNAMIC_EMA_ALPHA,
    DYNAMIC_TEMPERATURE,
    DYNAMIC_WEIGHT_MAX,
    DYNAMIC_WEIGHT_MIN,
)
from collapse_doctor.retrain.schedule import (
    Condition,
    HybridSwitch,
    TemperatureSchedule,
    parse_channel_start,
    parse_clip_threshold,
    parse_conditions,
    parse_hybrid_switch,
    parse_temperature,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ALGORITHMS: tuple[str, ...] = ("grpo", "gdpo", "gdpo-dynamic")
REWARD_MODES: dict[str, str] = {"sum": "grpo", "decompose": "gdpo", "decompose_and_dynamic_weight": "gdpo-dynamic"}
"""``reward_mode`` values of the config file and the ``--algo`` each one means."""
SCALES: tuple[str, ...] = ("group", "batch", "none")


@dataclass(frozen=True)
class RetrainSettings:
    """Training knobs from ``--config`` (every field is optional there)."""

    group_size: int = 8
    reward_mode: str | None = None
    reward_weights_ema_alpha: float = DYNAMIC_EMA_ALPHA
    reward_weight_temperature: float | TemperatureSchedule = DYNAMIC_TEMPERATURE
    reward_weight_min: float = DYNAMIC_WEIGHT_MIN
    reward_weight_max: float = DYNAMIC_WEIGHT_MAX
    advantage_clip: float = ADVANTAGE_CLIP
    policy_clip_epsilon: float = 0.2
    kl_target: float | None = None
    learning_rate: float = 1e-6
    warmup_steps: int = 0
    batch_size_prompts: int = 8
    hybrid_switch: HybridSwitch | None = None
    channel_start: dict[str, int] = field(default_factory=dict)
    condition: tuple[Condition, ...] = ()
    advantage_clip_when_std_above: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_INT_KEYS = {"group_size", "warmup_steps", "batch_size_prompts"}
_POSITIVE = {
    "group_size",
    "batch_size_prompts",
    "reward_weight_temperature",
    "advantage_clip",
    "learning_rate",
    "policy_clip_epsilon",
    "kl_target",
}


_CONFIG_HINT = "docs/retrain.md lists the --config keys (JSON object or TOML table)"


_RECIPE_PARSERS: dict[str, Any] = {
    "reward_weight_temperature": parse_temperature,
    "hybrid_switch": parse_hybrid_switch,
    "channel_start": parse_channel_start,
    "condition": parse_conditions,
    "advantage_clip_when_std_above": parse_clip_threshold,
}


def _check_value(key: str, value: Any, source: str) -> Any:
    if key in _RECIPE_PARSERS:
        return _RECIPE_PARSERS[key](value, source)
    if key == "reward_mode":
        if value not in REWARD_MODES:
            raise UsageError(f"{source}: reward_mode {value!r} is not one of {', '.join(REWARD_MODES)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{source}: {key} must be a number, got {value!r}", hint="write the number without quotes")
    if key in _INT_KEYS:
        if float(value) != int(value):
            raise UsageError(f"{source}: {key} must be an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if not math.isfinite(value):
        raise UsageError(f"{source}: {key} must be finite, got {value!r}")
    if key in _POSITIVE and value <= 0:
        raise UsageError(f"{source}: {key} must be > 0, got {value!r}")
    if value < 0:
        raise UsageError(f"{source}: {key} must be >= 0, got {value!r}")
    if key == "reward_weights_ema_alpha" and value > 1:
        raise UsageError(f"{source}: reward_weights_ema_alpha must be in (0, 1], got {value!r}")
    if key == "group_size" and value < 2:
        raise UsageError(f"{source}: group_size must be >= 2 (a group of one carries no ranking signal)")
    return value


def settings_from_mapping(
    data: dict[str, Any], source: str = "--config", defaults: RetrainSettings | None = None
) -> RetrainSettings:
    """Validate a mapping of config keys into :class:`RetrainSettings`.

    >>> settings_from_mapping({"group_size": 4, "reward_mode": "sum"}).group_size
    4
    >>> settings_from_mapping({"groupsize": 4})
    Traceback (most recent call last):
    ...
    collapse_doctor.core.errors.UsageError: --config: unknown key 'groupsize'. Hint: did you mean 'group_size'?
    """
    known = [f.name for f in fields(RetrainSettings)]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            close = [k for k in known if k.replace("_", "") == str(key).replace("_", "").replace("-", "")]
            hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)
            raise UsageError(f"{source}: unknown key {key!r}", hint=hint)
        values[key] = _check_value(key, value, source)
    settings = replace(defaults, **values) if defaults is not None else RetrainSettings(**values)
    if settings.reward_weight_min > settings.reward_weight_max:
        raise UsageError(f"{source}: reward_weight_min must not exceed reward_weight_max")
    return settings


def load_settings(path: str | Path | None, defaults: RetrainSettings | None = None) -> RetrainSettings:
    """Read ``--config`` (``.json`` or ``.toml``) over ``defaults``; ``None`` gives the defaults."""
    if path is None:
        return defaults if defaults is not None else RetrainSettings()
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read config file ({exc.strerror or exc})", hint=_CONFIG_HINT) from exc
    data: Any
    if path.suffix.lower() == ".json":
        try:
            data = loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{path}: not UTF-8 text (offset {exc.start}): not a text file", hint=_CONFIG_HINT
            ) from exc
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})", hint=_CONFIG_HINT) from exc
    elif path.suffix.lower() == ".toml":
        try:
            data = parse_toml(raw)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML ({exc})", hint=_CONFIG_HINT) from exc
        nested = data.get("tool")
        for part in ("collapse-doctor", "retrain"):
            nested = nested.get(part) if isinstance(nested, dict) else None
        if nested is not None:
            data = nested
    else:
        raise UsageError(f"{path}: config must be a .json or .toml file", hint=_CONFIG_HINT)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: config must be a table/object of keys", hint=_CONFIG_HINT)
    return settings_from_mapping(data, str(path), defaults)


def resolve_algorithm(algo: str | None, settings: RetrainSettings) -> str:
    """``--algo`` and the config's ``reward_mode`` must agree; either alone decides; default ``gdpo``."""
    from_config = REWARD_MODES[settings.reward_mode] if settings.reward_mode else None
    if algo is not None and algo not in ALGORITHMS:
        raise UsageError(f"--algo {algo!r} is not one of {', '.join(ALGORITHMS)}")
    if algo and from_config and algo != from_config:
        raise UsageError(
            f"--algo {algo} contradicts reward_mode = {settings.reward_mode!r} ({from_config}) in --config",
            hint="drop one of them",
        )
    return algo or from_config or "gdpo"
