"""Overhead of collapse-doctor's retrain (monitoring + gdpo-dynamic) over plain TRL GRPO.

Both variants train the built-in demo model (``collapse_doctor.retrain.demo``) on the demo task with
the same seed, batch (8 prompts x 8 completions), completion length (8 tokens) and a learning rate of
0, so both generate exactly the same completions and do the same model work; what differs is only
what collapse-doctor adds:

``trl-grpo``   ``trl.GRPOTrainer``, ``multi_objective_aggregation="sum_then_normalize"``, no monitoring
``cd-dynamic`` ``trl.GRPOTrainer`` with retrain's callbacks: ``CollapseDoctorCallback`` (gdpo-dynamic
               advantages, the rollout Parquet parts every 10 steps, TensorBoard scalars, the detectors) and
               ``RetrainCallback``

Step time is measured by the same callback in both (``on_step_begin`` -> ``on_step_end``: generation,
rewards, advantages, monitoring, loss and optimizer). The first ``--warmup`` steps of each run are
dropped. Runs alternate (trl, ours, trl, ours, ...) so machine load hits both alike, and torch runs
one intra-op thread (``--threads``), which keeps a shared machine's load from multiplying step times.
The target: the median step time of ``cd-dynamic`` is at most 1.10x that of ``trl-grpo``, judged on
the median over repeats of the paired ratio (each repeat's ours / trl medians, runs back to back),
which load drifts between repeats do not skew; the ratio of the pooled medians is reported too.

Wall-clock ratios on a busy machine are noisy, so the script also times collapse-doctor's own code
inside the ``cd-dynamic`` runs (the dynamic-weight step and the recording of each batch, the parts with their
Parquet and TensorBoard writes, the detectors, both callbacks) and reports it per step, next to the median step
time.

    .venv/bin/python benchmarks/bench_retrain.py                   # 10 repeats x 40 steps per variant
    .venv/bin/python benchmarks/bench_retrain.py --repeats 20 --steps 60 --out report.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch


class StepTimer:
    """A TrainerCallback recording each step's wall time."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):  # type: ignore[misc]
            def __init__(self, sink: list[float]) -> None:
                self.sink = sink
                self.started = 0.0

            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                self.started = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                self.sink.append(time.perf_counter() - self.started)

        self.seconds: list[float] = []
        self.callback = _Timer(self.seconds)


class OwnTime:
    """Wall time spent inside collapse-doctor's additions (wrapped methods), summed over a run."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - started

        setattr(owner, name, timed)


def demo_trainer_kwargs(out: Path, steps: int, seed: int, aggregation: str, logging_steps: int) -> dict[str, Any]:
    """``GRPOTrainer`` keywords for the demo model and task: 8 prompts x 8 completions, 8 tokens, learning rate 0."""
    from trl import GRPOConfig

    from collapse_doctor.retrain.data import to_dataset
    from collapse_doctor.retrain.demo import DEMO_REWARDS, build_char_tokenizer, build_tiny_model, demo_rows
    from collapse_doctor.retrain.rewards import named_reward, parse_rewards

    tokenizer = build_char_tokenizer()
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=8,
        learning_rate=0.0,
        multi_objective_aggregation=aggregation,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return {
        "model": build_tiny_model(tokenizer, seed=seed),
        "reward_funcs": [named_reward(s) for s in parse_rewards(DEMO_REWARDS)],
        "args": args,
        "train_dataset": to_dataset(demo_rows()),
        "processing_class": tokenizer,
    }


def recipes_transform(channels: tuple[str, ...]) -> Any:
    """``--recipes``: every recipe at once (GRPO to step 10, then gdpo-dynamic with a temperature schedule, the last
    channel from step 5, conditioned on the second, std-triggered clipping): the most per-step work they add."""
    from collapse_doctor.retrain.recipes import ScheduledAdvantages
    from collapse_doctor.retrain.schedule import Condition, HybridSwitch, RecipeSchedule

    schedule = RecipeSchedule(
        "gdpo-dynamic",
        channels,
        ((0, 0.7), (20, 0.4)),
        hybrid=HybridSwitch(step=10),
        channel_start={channels[-1]: 5},
        conditions=(Condition(channels[-1], channels[1], ">=", 1.0),),
        clip_when_std_above=0.9,
    )
    return ScheduledAdvantages(schedule, base_weights=(1.0,) * len(channels), step_of=lambda: 0, upper=0.8)


def run_variant(variant: str, steps: int, out: Path, seed: int) -> tuple[list[float], float]:
    from trl import GRPOTrainer

    from collapse_doctor.integrations.trl import CollapseDoctorCallback
    from collapse_doctor.retrain.callbacks import InterruptFlag, RetrainCallback
    from collapse_doctor.retrain.demo import DEMO_REWARDS
    from collapse_doctor.retrain.dynamic import DynamicWeighting
    from collapse_doctor.retrain.rewards import parse_rewards

    channels = tuple(s.name for s in parse_rewards(DEMO_REWARDS))
    aggregation = "sum_then_normalize" if variant == "trl-grpo" else "normalize_then_sum"
    common = demo_trainer_kwargs(out, steps, seed, aggregation, logging_steps=10_000)
    timer = StepTimer()
    if variant == "trl-grpo":
        trainer = GRPOTrainer(**common, callbacks=[timer.callback])
    else:
        dynamic = DynamicWeighting(channels, base_weights=(1.0,) * len(channels))
        transform: Any = dynamic.step
        if variant == "cd-recipes":
            transform = recipes_transform(channels)
        doctor = CollapseDoctorCallback(
            write_every=10,
            channels=channels,
            algo="gdpo-dynamic",
            advantage_transform=transform,
            print_finding=None,
        )
        control = RetrainCallback(interrupt=InterruptFlag(), dynamic=dynamic)
        trainer = GRPOTrainer(**common, callbacks=[timer.callback, doctor, control])
        doctor.attach(trainer)
        control.trainer = trainer
        if variant == "cd-recipes":
            transform.step_of = lambda: int(trainer.state.global_step)
        own = OwnTime()
        # _scored holds the dynamic-weight step and the recording; on_step_end the parts and the checks
        for hook in ("_scored", "_add_scalars", "on_step_end", "on_save"):
            own.wrap(doctor, hook)
        for hook in ("on_step_begin", "on_step_end", "on_save"):
            own.wrap(control, hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    if variant == "trl-grpo":
        return timer.seconds, 0.0
    return timer.seconds, own.seconds / max(1, len(timer.seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the Markdown report here.")
    parser.add_argument("--recipes", action="store_true", help="Ours trains every retrain recipe (cd-recipes).")
    options = parser.parse_args()
    ours = "cd-recipes" if options.recipes else "cd-dynamic"
    torch.set_num_threads(options.threads)
    own_per_step: list[float] = []
    per_repeat: dict[str, list[float]] = {"trl-grpo": [], ours: []}

    times: dict[str, list[float]] = {"trl-grpo": [], ours: []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(options.repeats):
            for variant in times:
                seconds, own = run_variant(variant, options.steps, Path(tmp) / f"{variant}-{repeat}", options.seed)
                times[variant].extend(seconds[options.warmup :])
                if variant == ours:
                    own_per_step.append(own)
                median_ms = statistics.median(seconds[options.warmup :]) * 1e3
                per_repeat[variant].append(median_ms)
                print(f"repeat {repeat} {variant:10s} median step {median_ms:.1f} ms", file=sys.stderr)
    base = statistics.median(times["trl-grpo"])
    pooled = statistics.median(times[ours]) / base
    paired = [o / b for o, b in zip(per_repeat[ours], per_repeat["trl-grpo"], strict=True)]
    ratio = statistics.median(paired)
    own_ms = statistics.median(own_per_step) * 1e3
    verdict = "PASS" if ratio <= 1.10 else "FAIL"
    import transformers
    import trl

    lines = [
        "| variant | median step (ms) | mean step (ms) | steps timed |",
        "|---|---|---|---|",
        *(
            f"| {name} | {statistics.median(v) * 1e3:.1f} | {statistics.fmean(v) * 1e3:.1f} | {len(v)} |"
            for name, v in times.items()
        ),
        "",
        f"{ours} / trl-grpo step time, median of the paired per-repeat ratios: **{ratio:.3f}** "
        f"(target <= 1.10: {verdict}); ratios {', '.join(f'{r:.2f}' for r in paired)}; pooled medians {pooled:.3f}",
        "",
        f"collapse-doctor's own code in {ours} runs: {own_ms:.2f} ms per step (median over runs), "
        f"{own_ms / (base * 1e3):.1%} of the trl-grpo median step.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), trl {trl.__version__}, transformers {transformers.__version__}, "
        f"python {platform.python_version()}; {options.repeats} repeats x {options.steps} steps per variant, first "
        f"{options.warmup} dropped; {time.perf_counter() - started:.0f} s in all.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if options.out is not None:
        options.out.write_text(report, encoding="utf-8")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
