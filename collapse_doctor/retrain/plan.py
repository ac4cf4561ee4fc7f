"""What a retrain will do, resolved before anything trains: options -> :class:`RetrainPlan` -> GRPOConfig.

``--dry-run`` prints the plan and the TRL ``GRPOConfig`` it resolves to (the values that differ from
TRL's defaults) and stops there.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.retrain.from_scan import scan_advice
from collapse_doctor.retrain.rewards import RewardSpec, parse_rewards
from collapse_doctor.retrain.schedule import RecipeSchedule, check_schedule
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
    from_scan_run: str | None = None
    """With a scan of several runs: the run whose findings ``--from-scan`` applies."""
    max_steps: int | None = None
    resume: bool = False
    demo: bool = False
    demo_task: str = "copy"
    """``--demo-task``: ``copy`` (digit copying, where the recipes matter) or ``sums`` (the earlier demo)."""
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
    schedule: RecipeSchedule | None = None
    """The recipes over the steps (``schedule.scheduled`` False: none, TRL's own advantages or gdpo-dynamic's)."""
    output_note: str = ""

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
        from collapse_doctor.retrain.demo import DEMO_TASKS

        dataset = DEMO_TASKS[o.demo_task][0] if o.demo else str(o.dataset)
        s = self.settings
        lines = [
            f"algorithm        {self.algo} (TRL multi_objective_aggregation={AGGREGATION[self.algo]}"
            + (f", scale_rewards={o.scale})" if self.algo == "grpo" else ")"),
            f"model            {model}",
            f"dataset          {dataset}",
            "rewards          " + ", ".join(f"{r.name}={r.target} (w={self.weights[r.name]:g})" for r in self.rewards),
            f"steps            {self.max_steps} x {s.batch_size_prompts} prompts x {s.group_size} completions",
            f"output           {o.output_dir} (rollouts/, tensorboard/, checkpoint-*/)"
            + (f": {self.output_note}" if self.output_note else ""),
        ]
        if self.algo == "gdpo-dynamic":
            temperature = s.reward_weight_temperature
            lines.append(
                f"dynamic weights  EMA alpha {s.reward_weights_ema_alpha:g} of each channel's advantage std, "
                + (f"softmax at T={temperature:g}, " if not isinstance(temperature, tuple) else "scheduled T, ")
                + f"bounds [{s.reward_weight_min:g}, {s.reward_weight_max:g}], clip +-{s.advantage_clip:g}"
                + (" (where the spread exceeds the threshold)" if s.advantage_clip_when_std_above is not None else "")
            )
        if self.schedule is not None and self.schedule.scheduled:
            lines.extend(f"schedule         {line}" for line in self.schedule.describe())
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


def apply_scan(
    path: str | Path, rewards: list[RewardSpec], weights: dict[str, float], run_name: str | None = None
) -> tuple[list[RewardSpec], dict[str, float], list[str], bool]:
    """A scan's channel and weight changes (:func:`collapse_doctor.retrain.from_scan.scan_advice`).

    Returns the rewards, the weights, what changed (one line each), and whether a finding recommends GDPO.
    """
    advice = scan_advice(path, rewards, dict(weights), run_name)
    return advice.rewards, advice.weights, advice.changes, advice.wants_gdpo


def check_output_dir(path: Path) -> str:
    """Refuse an ``--output-dir`` that is a file or cannot be created or written; say which it will be."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output-dir {path} is a file", hint="choose a directory")
    if path.is_dir():
        reason = _cannot_create_in(path)
        if reason is not None:
            raise UsageError(f"--output-dir {path} is not writable ({reason})", hint="choose a directory you can write")
        return "exists, writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--output-dir {path}: {parent} is a file", hint="choose a directory")
    reason = _cannot_create_in(parent)
    if reason is not None:
        raise UsageError(
            f"--output-dir {path} cannot be created: {parent} is not writable ({reason})", hint="choose another"
        )
    return "will be created (writable)"


def _cannot_create_in(directory: Path) -> str | None:
    """Why a directory cannot be made in ``directory``, or None when one can. Permissions alone do not say (root
    passes every check; /proc, a read-only mount): a real attempt, removed at once."""
    import tempfile

    if not os.access(directory, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".collapse-doctor-check-", dir=directory))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


CACHED_OFFLINE = "cached, Hub unreachable: loaded from the cache only"


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the Hub (or the HTTPS proxy) within ``timeout``: the seconds a retry loop would waste."""
    from urllib.parse import urlparse

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy if proxy else hub_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_hub_model(model: str) -> str:
    """A hub id must be in the local Hugging Face cache or the Hub reachable; one full line otherwise.

    Returns how the model will be found: "cached", :data:`CACHED_OFFLINE` (load with ``local_files_only``) or
    "download". ``retrain`` checks this before loading the model (``--dry-run`` loads none and does not).
    """
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers brings huggingface_hub
        return "download"
    cached = try_to_load_from_cache(model, "config.json")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if isinstance(cached, str):
        return "cached" if offline or _hub_reachable() else CACHED_OFFLINE
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE is set" if offline else f"{hub_endpoint()} is unreachable"
        raise UsageError(
            f"--model {model}: not a local directory and not in the Hugging Face cache, and {why}",
            hint="pass a local model directory, or run where the Hub is reachable",
        )
    return "download"


def build_plan(options: RetrainOptions) -> RetrainPlan:
    """Resolve options, ``--config`` and ``--from-scan`` into a plan (no model is loaded)."""
    from collapse_doctor.retrain.demo import DEMO_COMPLETION_TOKENS, DEMO_LEARNING_RATE, DEMO_MAX_STEPS, DEMO_TASKS

    # --demo's own settings are the defaults under its --config: a config adds recipes without resetting the demo
    demo_defaults = RetrainSettings(group_size=8, batch_size_prompts=8, learning_rate=DEMO_LEARNING_RATE)
    settings = load_settings(options.config, demo_defaults if options.demo else None)
    if options.scale not in SCALES:
        raise UsageError(f"--scale {options.scale!r} is not one of {', '.join(SCALES)}")
    if options.demo:
        if options.model or options.dataset:
            raise UsageError("--demo trains the built-in model and task", hint="drop --model/--dataset, or --demo")
        if options.demo_task not in DEMO_TASKS:
            raise UsageError(f"--demo-task {options.demo_task!r} is not one of {', '.join(DEMO_TASKS)}")
        specs = list(parse_rewards(options.rewards or DEMO_TASKS[options.demo_task][1]))
    else:
        if options.demo_task != "copy":
            raise UsageError(f"--demo-task {options.demo_task} needs --demo", hint="add --demo, or drop --demo-task")
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
    check_training_weights(weights, source="--weights")
    changes: list[str] = []
    if options.from_scan is not None:
        advice = scan_advice(options.from_scan, specs, weights, options.from_scan_run)
        specs, weights, changes = advice.rewards, advice.weights, advice.changes
        check_training_weights(weights, source=f"--from-scan {options.from_scan}")
        settings, recipe_changes = _scan_recipes(settings, advice, {r.name for r in specs})
        changes.extend(recipe_changes)
        wants_gdpo = advice.wants_gdpo or settings.hybrid_switch is not None
        if (wants_gdpo or advice.algorithm) and algo_flag is None and settings.reward_mode is None:
            algo_flag = advice.algorithm or "gdpo"
            changes.append(f"algorithm {algo_flag} (the scan recommends {algo_flag.upper()})")
    algo = resolve_algorithm(algo_flag, settings)
    max_steps = options.max_steps or (DEMO_MAX_STEPS if options.demo else 500)
    completion = options.max_completion_length or (DEMO_COMPLETION_TOKENS if options.demo else 256)
    schedule = RecipeSchedule(
        algo=algo,
        channels=tuple(r.name for r in specs),
        temperature=settings.reward_weight_temperature,
        hybrid=settings.hybrid_switch,
        channel_start=dict(settings.channel_start),
        conditions=settings.condition,
        clip=settings.advantage_clip,
        clip_when_std_above=settings.advantage_clip_when_std_above,
    )
    check_schedule(schedule, str(options.config or "--config"))
    output_note = check_output_dir(Path(options.output_dir))
    return RetrainPlan(
        options=options,
        algo=algo,
        rewards=tuple(specs),
        weights=weights,
        settings=settings,
        max_steps=max_steps,
        max_completion_length=completion,
        changes=tuple(changes),
        schedule=schedule,
        output_note=output_note,
    )


def _scan_recipes(settings: RetrainSettings, advice: Any, channels: set[str]) -> tuple[RetrainSettings, list[str]]:
    """The scan's recipes joined to ``--config``'s: a key the config sets wins (and the line says so)."""
    lines: list[str] = []
    conditions = [c for c in advice.conditions if c.channel in channels and c.on in channels]
    if conditions:
        if settings.condition:
            lines.append("kept --config's condition (the scan's conditions are not applied)")
        else:
            settings = dataclasses.replace(settings, condition=tuple(conditions))
    if advice.hybrid is not None:
        if settings.hybrid_switch is not None:
            lines.append(f"kept --config's hybrid_switch ({settings.hybrid_switch})")
        else:
            settings = dataclasses.replace(settings, hybrid_switch=advice.hybrid)
    starts = {c: s for c, s in advice.channel_start.items() if c in channels}
    if starts:
        if settings.channel_start:
            lines.append("kept --config's channel_start (the scan's is not applied)")
        else:
            settings = dataclasses.replace(settings, channel_start=starts)
    return settings, lines


def check_training_weights(weights: dict[str, float], *, source: str) -> None:
    """The weights a run trains with: each finite and >= 0, not all 0 (TRL would train on nothing, or with inf
    for real); the same rule for ``--weights`` and for the weights a ``--from-scan`` JSON carries."""
    for channel, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise UsageError(
                f"{source}: the weight of `{channel}` is {weight!r}; a training weight is a finite number >= 0",
                hint="give it a weight such as 1 or 0.5 (0 turns the channel off)",
            )
    if weights and not any(weights.values()):
        raise UsageError(
            f"{source}: every weight is 0 ({', '.join(weights)}): the run would train on no reward",
            hint="give at least one channel a weight above 0",
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
