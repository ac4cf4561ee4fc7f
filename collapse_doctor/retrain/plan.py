"""What a retrain will do, resolved before anything trains: options -> :class:`RetrainPlan` -> GRPOConfig.

``--dry-run`` prints the plan and the TRL ``GRPOConfig`` it resolves to (the values that differ from
TRL's defaults) and stops there.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapse_doctor.errors import InputError, UsageError
from collapse_doctor.retrain.rewards import RewardSpec, parse_rewards
from collapse_doctor.retrain.settings import SCALES, RetrainSettings, load_settings, resolve_algorithm

AGGREGATION = {"grpo": "sum_then_normalize", "gdpo": "normalize_then_sum", "gdpo-dynamic": "normalize_then_sum"}
"""TRL's ``multi_objective_aggregation`` for each ``--algo`` (gdpo-dynamic replaces TRL's advantages)."""
KL_START_BETA = 0.04
"""Initial KL coefficient when ``kl_target`` is set (TRL loads a reference model only when beta > 0)."""


@dataclass(frozen=True)
class RetrainOptions:
    """Everything ``collapse-doctor retrain`` accepts, as a library call."""

    output_dir: Path
    algo: str | None = None
    model: str | None = None
    dataset: str | Path | None = None
    rewards: tuple[str, ...] = ()
    weights: dict[str, float] | None = None
    config: str | Path | None = None
    from_scan: str | Path | None = None
    max_steps: int | None = None
    resume: bool = False
    demo: bool = False
    fail_on: str | None = None
    scale: str = "group"
    max_completion_length: int | None = None
    save_steps: int = 50
    write_every: int = 10
    logging_steps: int = 10
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    """Extra ``GRPOConfig`` keyword arguments (library use only; applied last)."""


@dataclass(frozen=True)
class RetrainPlan:
    """The resolved run: algorithm, channels and weights, settings, what ``--from-scan`` changed."""

    options: RetrainOptions
    algo: str
    rewards: tuple[RewardSpec, ...]
    weights: dict[str, float]
    settings: RetrainSettings
    max_steps: int
    max_completion_length: int
    changes: tuple[str, ...] = ()

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rewards)

    def grpo_config_kwargs(self, num_processes: int = 1) -> dict[str, Any]:
        """Keyword arguments of TRL's ``GRPOConfig`` for this plan."""
        import torch

        s = self.settings
        completions = s.batch_size_prompts * s.group_size
        if completions % num_processes:
            raise UsageError(
                f"batch_size_prompts * group_size = {completions} completions do not split over {num_processes} "
                "processes",
                hint="make it a multiple of the number of processes",
            )
        cuda = torch.cuda.is_available()
        kwargs: dict[str, Any] = {
            "output_dir": str(self.options.output_dir),
            "max_steps": self.max_steps,
            "per_device_train_batch_size": completions // num_processes,
            "num_generations": s.group_size,
            "learning_rate": s.learning_rate,
            "warmup_steps": s.warmup_steps,
            "epsilon": s.policy_clip_epsilon,
            "beta": KL_START_BETA if s.kl_target is not None else 0.0,
            "multi_objective_aggregation": AGGREGATION[self.algo],
            "scale_rewards": self.options.scale,
            "reward_weights": [self.weights[c] for c in self.channels],
            "max_completion_length": self.max_completion_length,
            "logging_steps": self.options.logging_steps,
            "save_strategy": "steps",
            "save_steps": self.options.save_steps,
            "report_to": ["tensorboard"],
            "seed": self.options.seed,
            "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
            "use_cpu": not cuda,
            "dataloader_num_workers": 0,
            "disable_tqdm": not sys.stderr.isatty(),
        }
        kwargs.update(self.options.overrides)
        return kwargs

    def describe(self) -> list[str]:
        """The plan as lines for the terminal."""
        o = self.options
        model = "built-in tiny Llama (demo)" if o.demo else str(o.model)
        dataset = "built-in single-digit sums (demo)" if o.demo else str(o.dataset)
        s = self.settings
        lines = [
            f"algorithm        {self.algo} (TRL multi_objective_aggregation={AGGREGATION[self.algo]}"
            + (f", scale_rewards={o.scale})" if self.algo == "grpo" else ")"),
            f"model            {model}",
            f"dataset          {dataset}",
            "rewards          " + ", ".join(f"{r.name}={r.target} (w={self.weights[r.name]:g})" for r in self.rewards),
            f"steps            {self.max_steps} x {s.batch_size_prompts} prompts x {s.group_size} completions",
            f"output           {o.output_dir} (rollouts/, tensorboard/, checkpoint-*/)",
        ]
        if self.algo == "gdpo-dynamic":
            lines.append(
                f"dynamic weights  EMA alpha {s.reward_weights_ema_alpha:g} of each channel's advantage std, "
                f"softmax at T={s.reward_weight_temperature:g}, "
                f"bounds [{s.reward_weight_min:g}, {s.reward_weight_max:g}], clip +-{s.advantage_clip:g}"
            )
        if s.kl_target is not None:
            lines.append(f"KL               adaptive beta from {KL_START_BETA:g} toward KL {s.kl_target:g}")
        if o.fail_on:
            lines.append(f"fail-on          stop at the first scan finding at or above {o.fail_on}")
        if o.resume:
            lines.append("resume           from the last checkpoint in the output directory")
        lines.extend(f"from scan        {change}" for change in self.changes)
        return lines


_HUB_ID = re.compile(r"(?!.*(?:--|\.\.))\w[\w.-]*(?:/\w[\w.-]*)?")
"""What a Hugging Face hub id looks like (``name`` or ``org/name``); anything else must be a local path."""
_DROP = re.compile(r"drop `([^`]+)`")
_WEIGHT = re.compile(r"--weights ([A-Za-z_][\w.-]*)=([0-9.eE+-]+)")


def apply_scan(
    path: str | Path, rewards: list[RewardSpec], weights: dict[str, float]
) -> tuple[list[RewardSpec], dict[str, float], list[str], bool]:
    """Apply a scan's remedies (``scan --json`` output): drop collinear channels, set suggested weights.

    Returns the rewards, the weights, what changed (one line each), and whether a finding recommends GDPO.
    """
    path = Path(path)
    hint = "write one with collapse-doctor scan RUN --json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the scan result ({exc.strerror or exc})", hint=hint) from exc
    except ValueError as exc:
        raise InputError(f"{path}: not a scan result: not valid JSON ({exc})", hint=hint) from exc
    findings = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        raise InputError(f"{path}: not a scan result: no 'findings' list of objects", hint=hint)
    names = {r.name for r in rewards}
    changes: list[str] = []
    wants_gdpo = False
    for finding in findings:
        code = finding.get("code", "?")
        remedy = str(finding.get("remedy") or "")
        # Only where the scan's own counterfactual says GDPO's advantages would not show the problem.
        wants_gdpo = wants_gdpo or finding.get("gdpo_resolves") is True
        for channel in _DROP.findall(remedy):
            if channel not in names:
                changes.append(f"{code}: would drop `{channel}`, which is not among --reward; ignored")
            elif len(rewards) > 1:
                rewards = [r for r in rewards if r.name != channel]
                names.discard(channel)
                weights.pop(channel, None)
                changes.append(f"{code}: dropped channel `{channel}` ({finding.get('title', '')})")
        for channel, value in _WEIGHT.findall(remedy):
            if channel not in names:
                continue
            try:
                weight = float(value.rstrip("."))
            except ValueError:
                continue
            if weights.get(channel) != weight:
                changes.append(f"{code}: weight of `{channel}` {weights.get(channel, 1.0):g} -> {weight:g}")
                weights[channel] = weight
    if not changes:
        changes.append(f"{path.name}: no channel or weight change ({data.get('verdict', '?')})")
    return rewards, weights, changes, wants_gdpo


def build_plan(options: RetrainOptions) -> RetrainPlan:
    """Resolve options, ``--config`` and ``--from-scan`` into a plan (no model is loaded)."""
    from collapse_doctor.retrain.demo import DEMO_COMPLETION_TOKENS, DEMO_LEARNING_RATE, DEMO_MAX_STEPS, DEMO_REWARDS

    settings = load_settings(options.config)
    if options.scale not in SCALES:
        raise UsageError(f"--scale {options.scale!r} is not one of {', '.join(SCALES)}")
    if options.demo:
        if options.model or options.dataset:
            raise UsageError("--demo trains the built-in model and task", hint="drop --model/--dataset, or --demo")
        specs = list(parse_rewards(options.rewards or DEMO_REWARDS))
        if options.config is None:
            settings = RetrainSettings(group_size=8, batch_size_prompts=8, learning_rate=DEMO_LEARNING_RATE)
    else:
        if not options.model:
            raise UsageError("--model is required", hint="pass a local path or hub id, or use --demo")
        if not options.dataset:
            raise UsageError("--dataset is required", hint="pass a JSONL or Parquet file with a 'prompt' column")
        specs = list(parse_rewards(options.rewards))
        model_path = Path(options.model)
        if not model_path.exists() and not _HUB_ID.fullmatch(str(options.model)):
            raise UsageError(
                f"--model {options.model}: no such model directory (and not a hub id such as org/name)",
                hint="pass a local model directory or a hub id",
            )
        if model_path.exists() and _inside(options.output_dir, model_path):
            raise UsageError(
                f"--output-dir {options.output_dir} is inside the input model's directory {options.model}",
                hint="never write into the model's directory: choose another --output-dir",
            )
    algo_flag = options.algo
    weights = {r.name: 1.0 for r in specs}
    unknown = [name for name in (options.weights or {}) if name not in weights]
    if unknown:
        raise UsageError(f"--weights names unknown channel(s) {unknown}; the rewards are {list(weights)}")
    weights.update(options.weights or {})
    changes: list[str] = []
    if options.from_scan is not None:
        specs, weights, changes, wants_gdpo = apply_scan(options.from_scan, specs, weights)
        if wants_gdpo and algo_flag is None and settings.reward_mode is None:
            algo_flag = "gdpo"
            changes.append("algorithm gdpo (the scan recommends GDPO)")
    algo = resolve_algorithm(algo_flag, settings)
    max_steps = options.max_steps or (DEMO_MAX_STEPS if options.demo else 500)
    completion = options.max_completion_length or (DEMO_COMPLETION_TOKENS if options.demo else 256)
    return RetrainPlan(
        options=options,
        algo=algo,
        rewards=tuple(specs),
        weights=weights,
        settings=settings,
        max_steps=max_steps,
        max_completion_length=completion,
        changes=tuple(changes),
    )


def _inside(path: Path, parent: Path) -> bool:
    path, parent = path.resolve(), parent.resolve()
    return path == parent or parent in path.parents


def config_differences(config: Any, always: Iterable[str] = ()) -> dict[str, Any]:
    """The ``GRPOConfig`` fields in ``always`` and those that differ from their declared defaults.

    This is what ``--dry-run`` prints. Fields that TRL or transformers derive after construction (the
    generation batch size, the device flags...) show their resolved values.
    """
    import dataclasses

    resolved = config.to_dict()
    keep = set(always)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name not in resolved or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        value = resolved[f.name]
        same = value == default or (hasattr(default, "value") and default.value == value)
        if f.name in keep or not same:
            out[f.name] = value
    return out
