"""``run_retrain(options)``: build the plan, train on TRL's GRPOTrainer, monitor, scan the result."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.engine.advantages import DYNAMIC_TEMPERATURE
from collapse_doctor.retrain.plan import RetrainOptions, RetrainPlan, build_plan

if TYPE_CHECKING:
    from collapse_doctor.core.result import Diagnosis

TRAIN_EXTRA_HINT = "pip install 'collapse-doctor[train]'"


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers 5's deprecation notices raised from inside TRL: nothing the user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
        yield


def require_train_extra() -> None:
    """Import the training stack, or say in one line how to install it."""
    missing = []
    for module in ("trl", "transformers", "datasets", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UsageError(f"retrain needs the train extra ({', '.join(missing)} not installed)", hint=TRAIN_EXTRA_HINT)


@dataclass
class RetrainResult:
    """What a retrain did: where it wrote, how far it got, why it stopped, and the final scan."""

    plan: RetrainPlan
    output_dir: Path
    steps: int = 0
    stop_reason: str | None = None
    interrupted: bool = False
    fail_on_findings: list[str] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    step_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0
    resumed_from: str | None = None

    @property
    def rollouts_dir(self) -> Path:
        from collapse_doctor.integrations.rollouts import ROLLOUTS_DIR

        return self.output_dir / ROLLOUTS_DIR

    def exit_code(self) -> int:
        """0 done, 1 stopped by --fail-on (or the final scan fails it), 130 interrupted."""
        if self.interrupted:
            return 130
        if self.fail_on_findings:
            return 1
        if self.diagnosis is not None and self.plan.options.fail_on:
            return self.diagnosis.exit_code(self.plan.options.fail_on)
        return 0


def plan_retrain(options: RetrainOptions) -> tuple[RetrainPlan, dict[str, Any]]:
    """The plan and the GRPOConfig differences from TRL's defaults (``--dry-run``); trains nothing."""
    require_train_extra()
    from trl import GRPOConfig  # type: ignore[import-untyped,unused-ignore]

    from collapse_doctor.retrain.plan import config_differences

    plan = build_plan(options)
    if not options.demo:
        from collapse_doctor.retrain.data import read_prompt_rows

        read_prompt_rows(options.dataset or "")
    kwargs = plan.grpo_config_kwargs()
    with quiet_transformers():
        config = GRPOConfig(**kwargs)
    return plan, config_differences(config, always=kwargs)


def _last_checkpoint(output_dir: Path) -> Path | None:
    from transformers.trainer_utils import get_last_checkpoint  # type: ignore[import-untyped,unused-ignore]

    if not output_dir.is_dir():
        return None
    found = get_last_checkpoint(str(output_dir))
    return Path(found) if found else None


@dataclass(frozen=True)
class Preflight:
    """What :func:`check_before_training` found: the checkpoint ``--resume`` continues from, and whether a hub
    model is loaded from the cache alone (the Hub unreachable)."""

    checkpoint: Path | None = None
    local_only: bool = False


def check_before_training(options: RetrainOptions) -> Preflight:
    """The checks that fail a retrain before anything is loaded, each in one line: the TRL seam, ``--resume``
    without a checkpoint, an ``--output-dir`` that already holds a run, a hub model neither cached nor reachable.
    ``retrain`` runs them before it prints its plan, so a run that cannot start says only why."""
    require_train_extra()
    from collapse_doctor.integrations.rollouts import ROLLOUTS_DIR
    from collapse_doctor.integrations.trl import check_trl_seam
    from collapse_doctor.retrain.plan import CACHED_OFFLINE, check_hub_model

    check_trl_seam()
    output_dir = Path(options.output_dir)
    checkpoint = _last_checkpoint(output_dir) if options.resume else None
    if options.resume and checkpoint is None:
        raise UsageError(f"--resume: no checkpoint-* directory in {output_dir}", hint="run without --resume first")
    rollouts = output_dir / ROLLOUTS_DIR
    if not options.resume and rollouts.is_dir() and any(rollouts.iterdir()):
        raise UsageError(
            f"--output-dir {output_dir} already holds a run",
            hint="pass --resume to continue it, or choose another --output-dir",
        )
    local_only = False
    if not options.demo and options.model and not Path(str(options.model)).exists():
        # Fail in one line instead of transformers' retry loop against an unreachable Hub.
        local_only = check_hub_model(str(options.model)) == CACHED_OFFLINE
    return Preflight(checkpoint=checkpoint, local_only=local_only)


def _load_model(plan: RetrainPlan, *, local_only: bool = False) -> tuple[Any, Any, Any]:
    """Model, tokenizer and dataset for the plan (``local_only``: a hub model from the cache alone)."""
    from collapse_doctor.retrain.data import read_prompt_rows, to_dataset

    options = plan.options
    if options.demo:
        from collapse_doctor.retrain.demo import build_char_tokenizer, build_tiny_model, demo_task_rows

        tokenizer = build_char_tokenizer()
        rows = demo_task_rows(options.demo_task)
        return build_tiny_model(tokenizer, seed=options.seed), tokenizer, to_dataset(rows)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-untyped,unused-ignore]

    rows = read_prompt_rows(options.dataset or "")
    name = str(options.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(name, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"--model {options.model}: cannot load ({' '.join(str(exc).split())})",
            hint="pass a local model directory or a hub id with a tokenizer",
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, to_dataset(rows)


def run_retrain(options: RetrainOptions, *, final_scan: bool = True, checked: Preflight | None = None) -> RetrainResult:
    """Train with TRL's GRPOTrainer under the plan, monitored; scan the run at the end (``checked``: what
    :func:`check_before_training` found for these options, when the caller ran it already)."""
    require_train_extra()
    from transformers import set_seed  # type: ignore[import-untyped,unused-ignore]
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[import-untyped,unused-ignore]

    from collapse_doctor.integrations.trl import CollapseDoctorCallback, trl_step
    from collapse_doctor.retrain.callbacks import InterruptFlag, RetrainCallback
    from collapse_doctor.retrain.dynamic import DynamicWeighting
    from collapse_doctor.retrain.rewards import named_reward

    started = time.perf_counter()
    plan = build_plan(options)
    checked = checked if checked is not None else check_before_training(options)
    checkpoint = checked.checkpoint
    output_dir = Path(options.output_dir)
    set_seed(options.seed)
    model, tokenizer, dataset = _load_model(plan, local_only=checked.local_only)
    with quiet_transformers():
        args = GRPOConfig(**plan.grpo_config_kwargs(_num_processes()))
    s = plan.settings
    dynamic = None
    scheduled = None
    if plan.schedule is not None and plan.schedule.scheduled:
        from collapse_doctor.retrain.recipes import scheduled_advantages

        scheduled = scheduled_advantages(plan, checkpoint)
    elif plan.algo == "gdpo-dynamic":
        dynamic = DynamicWeighting(
            plan.channels,
            base_weights=tuple(plan.weights[c] for c in plan.channels),
            alpha=s.reward_weights_ema_alpha,
            temperature=plan.schedule.temperature_at(0) if plan.schedule else DYNAMIC_TEMPERATURE,
            lower=s.reward_weight_min,
            upper=s.reward_weight_max,
            clip=s.advantage_clip,
        )
        if checkpoint is not None:
            dynamic.load(checkpoint)
    # The user-facing callback does the monitoring and --fail-on; retrain adds Ctrl-C, adaptive KL, the EMA.
    doctor = CollapseDoctorCallback(
        options.fail_on,
        output_dir=output_dir,
        write_every=options.write_every,
        channels=plan.channels,
        algo=plan.schedule.aggregation_at(1) if plan.schedule is not None else plan.algo,  # TRL's first step
        advantage_transform=scheduled if scheduled is not None else dynamic.step if dynamic is not None else None,
        summary=False,  # retrain prints the final scan itself
    )
    interrupt = InterruptFlag()
    control = RetrainCallback(interrupt=interrupt, dynamic=dynamic, kl_target=s.kl_target)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[named_reward(r) for r in plan.rewards],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[doctor, control],
    )
    doctor.attach(trainer)
    control.trainer = trainer
    if scheduled is not None:
        from collapse_doctor.retrain.recipe_callback import RecipeCallback

        scheduled.step_of = lambda: trl_step(trainer.state)  # the step the rollouts record for this batch
        recipes = RecipeCallback(scheduled, doctor)
        recipes.trainer = trainer
        trainer.add_callback(recipes)
    if args.disable_tqdm:
        # Without a progress bar transformers prints every log dict; keep stdout for the verdict.
        from transformers import PrinterCallback  # type: ignore[import-untyped,unused-ignore]

        trainer.remove_callback(PrinterCallback)
    interrupt.install()
    try:
        with quiet_transformers():
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    finally:
        interrupt.restore()
        if doctor.monitor is not None:
            doctor.monitor.close()
    steps = int(trainer.state.global_step)
    result = RetrainResult(
        plan=plan,
        output_dir=output_dir,
        steps=steps,
        interrupted=control.interrupted_at is not None,
        fail_on_findings=[f"{f.code} {f.title}" for f in doctor.stopped_by],
        step_seconds=control.step_seconds,
        resumed_from=str(checkpoint) if checkpoint else None,
    )
    if control.interrupted_at is not None:
        result.stop_reason = f"interrupted (Ctrl-C) at step {control.interrupted_at}"
    elif doctor.stopped_by:
        result.stop_reason = f"--fail-on {options.fail_on}: stopped at step {steps}"
    if final_scan and _is_main_process() and result.rollouts_dir.is_dir():
        from collapse_doctor.core.options import ScanOptions
        from collapse_doctor.pipeline.scan import diagnose

        # A recipe schedule writes the aggregation of each step into the rollouts (a hybrid switch: two phases,
        # each judged under its own), so the scan reads it there; otherwise the run had one aggregation.
        algo = "auto" if plan.schedule is not None else ("grpo" if plan.algo == "grpo" else "gdpo")
        result.diagnosis = diagnose([result.rollouts_dir], ScanOptions(fail_on=options.fail_on or "never", algo=algo))
    result.seconds = time.perf_counter() - started
    return result


def _process_state() -> Any:
    """accelerate's process state, created as the trainer will create it.

    The state is made once per process. On CPU it must be made with ``cpu=True`` (as ``GRPOConfig(use_cpu=True)``
    makes it): without, processes started by ``torchrun`` each see a world of one.
    """
    import torch
    from accelerate import PartialState  # type: ignore[import-untyped,unused-ignore]

    return PartialState(cpu=not torch.cuda.is_available())


def _num_processes() -> int:
    return int(_process_state().num_processes)


def _is_main_process() -> bool:
    return bool(_process_state().is_main_process)
