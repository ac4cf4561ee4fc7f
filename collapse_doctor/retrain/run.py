"""``run_retrain(options)``: build the plan, train on TRL's GRPOTrainer, monitor, scan the result."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_doctor.errors import UsageError
from collapse_doctor.retrain.plan import RetrainOptions, RetrainPlan, build_plan

if TYPE_CHECKING:
    from collapse_doctor.result import Diagnosis

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
        from collapse_doctor.retrain.monitor import ROLLOUTS_DIR

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


def _load_model(plan: RetrainPlan) -> tuple[Any, Any, Any]:
    """Model, tokenizer and dataset for the plan."""
    from collapse_doctor.retrain.data import read_prompt_rows, to_dataset

    options = plan.options
    if options.demo:
        from collapse_doctor.retrain.demo import build_char_tokenizer, build_tiny_model, demo_rows

        tokenizer = build_char_tokenizer()
        return build_tiny_model(tokenizer, seed=options.seed), tokenizer, to_dataset(demo_rows())
    from transformers import AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-untyped,unused-ignore]

    rows = read_prompt_rows(options.dataset or "")
    name = str(options.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"--model {options.model}: cannot load ({' '.join(str(exc).split())[:200]})",
            hint="pass a local model directory or a hub id with a tokenizer",
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, to_dataset(rows)


def run_retrain(options: RetrainOptions, *, final_scan: bool = True) -> RetrainResult:
    """Train with TRL's GRPOTrainer under the plan, monitored; scan the run at the end."""
    require_train_extra()
    from transformers import set_seed  # type: ignore[import-untyped,unused-ignore]
    from trl import GRPOConfig  # type: ignore[import-untyped,unused-ignore]

    from collapse_doctor.retrain.callbacks import CollapseDoctorCallback, InterruptFlag, StopState
    from collapse_doctor.retrain.dynamic import DynamicWeighting
    from collapse_doctor.retrain.monitor import RolloutMonitor
    from collapse_doctor.retrain.rewards import named_reward
    from collapse_doctor.retrain.trainer import MonitoredGRPOTrainer, check_trl_seam

    started = time.perf_counter()
    check_trl_seam()
    plan = build_plan(options)
    output_dir = Path(options.output_dir)
    checkpoint = _last_checkpoint(output_dir) if options.resume else None
    if options.resume and checkpoint is None:
        raise UsageError(f"--resume: no checkpoint-* directory in {output_dir}", hint="run without --resume first")
    if not options.resume and (output_dir / "rollouts").is_dir() and any((output_dir / "rollouts").iterdir()):
        raise UsageError(
            f"--output-dir {output_dir} already holds a run",
            hint="pass --resume to continue it, or choose another --output-dir",
        )
    set_seed(options.seed)
    model, tokenizer, dataset = _load_model(plan)
    with quiet_transformers():
        args = GRPOConfig(**plan.grpo_config_kwargs(_num_processes()))
    s = plan.settings
    dynamic = None
    if plan.algo == "gdpo-dynamic":
        dynamic = DynamicWeighting(
            plan.channels,
            base_weights=tuple(plan.weights[c] for c in plan.channels),
            alpha=s.reward_weights_ema_alpha,
            temperature=s.reward_weight_temperature,
            lower=s.reward_weight_min,
            upper=s.reward_weight_max,
            clip=s.advantage_clip,
        )
    monitor = RolloutMonitor(
        output_dir=output_dir,
        channels=plan.channels,
        weights=dict(plan.weights),
        algo=plan.algo,
        write_every=options.write_every,
        enabled=_is_main_process(),
    )
    resumed_step = 0
    if checkpoint is not None:
        resumed_step = _checkpoint_step(checkpoint)
        monitor.truncate_from(resumed_step)
        if dynamic is not None:
            dynamic.load(checkpoint)
    stop = StopState()
    interrupt = InterruptFlag()
    callback = CollapseDoctorCallback(
        monitor=monitor,
        stop=stop,
        interrupt=interrupt,
        dynamic=dynamic,
        fail_on=options.fail_on,
        algo=plan.algo,
        kl_target=s.kl_target,
    )
    trainer = MonitoredGRPOTrainer(
        model=model,
        reward_funcs=[named_reward(r) for r in plan.rewards],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[callback],
        monitor=monitor,
        dynamic=dynamic,
    )
    callback.trainer = trainer
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
        monitor.close()
    result = RetrainResult(
        plan=plan,
        output_dir=output_dir,
        steps=int(trainer.state.global_step),
        stop_reason=stop.reason,
        interrupted=stop.interrupted,
        fail_on_findings=stop.fail_on_findings,
        step_seconds=callback.step_seconds,
        resumed_from=str(checkpoint) if checkpoint else None,
    )
    if final_scan and monitor.enabled and result.rollouts_dir.is_dir():
        from collapse_doctor.options import ScanOptions
        from collapse_doctor.pipeline import diagnose

        result.diagnosis = diagnose(
            [result.rollouts_dir],
            ScanOptions(fail_on=options.fail_on or "never", algo="grpo" if plan.algo == "grpo" else "gdpo"),
        )
    result.seconds = time.perf_counter() - started
    return result


def _checkpoint_step(checkpoint: Path) -> int:
    try:
        return int(checkpoint.name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def _num_processes() -> int:
    from accelerate import PartialState  # type: ignore[import-untyped,unused-ignore]

    return int(PartialState().num_processes)


def _is_main_process() -> bool:
    from accelerate import PartialState  # type: ignore[import-untyped,unused-ignore]

    return bool(PartialState().is_main_process)
