"""Overhead of collapse-doctor's retrain (monitoring + gdpo-dynamic) over plain TRL GRPO.

Both variants train the built-in demo model (``collapse_doctor.retrain.demo``) on the demo task with
the same seed, batch (8 prompts x 8 completions), completion length (8 tokens) and a learning rate of
0, so both generate exactly the same completions and do the same model work; what differs is only
what collapse-doctor adds:

``trl-grpo``   ``trl.GRPOTrainer``, ``multi_objective_aggregation="sum_then_normalize"``, no monitoring
``cd-dynamic`` ``MonitoredGRPOTrainer`` with gdpo-dynamic advantages, the rollout Parquet parts
               (every 10 steps) and TensorBoard scalars, and the collapse-doctor callback

Step time is measured by the same callback in both (``on_step_begin`` -> ``on_step_end``: generation,
rewards, advantages, monitoring, loss and optimizer). The first ``--warmup`` steps of each run are
dropped. Runs alternate (trl, ours, trl, ours, ...) so machine load hits both alike, and torch runs
one intra-op thread (``--threads``), which keeps a shared machine's load from multiplying step times.
The target: the median step time of ``cd-dynamic`` is at most 1.10x that of ``trl-grpo``, judged on
the median over repeats of the paired ratio (each repeat's ours / trl medians, runs back to back),
which load drifts between repeats do not skew; the ratio of the pooled medians is reported too.

Wall-clock ratios on a busy machine are noisy, so the script also times collapse-doctor's own code
inside the ``cd-dynamic`` runs (the dynamic-weight step, ``RolloutMonitor.record`` with its Parquet and
TensorBoard writes, the callback) and reports it per step, next to the median step time.

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


def run_variant(variant: str, steps: int, out: Path, seed: int) -> tuple[list[float], float]:
    from trl import GRPOConfig, GRPOTrainer

    from collapse_doctor.retrain.callbacks import CollapseDoctorCallback, InterruptFlag, StopState
    from collapse_doctor.retrain.data import to_dataset
    from collapse_doctor.retrain.demo import DEMO_REWARDS, build_char_tokenizer, build_tiny_model, demo_rows
    from collapse_doctor.retrain.dynamic import DynamicWeighting
    from collapse_doctor.retrain.monitor import RolloutMonitor
    from collapse_doctor.retrain.rewards import named_reward, parse_rewards
    from collapse_doctor.retrain.trainer import MonitoredGRPOTrainer

    specs = parse_rewards(DEMO_REWARDS)
    channels = tuple(s.name for s in specs)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=8,
        learning_rate=0.0,
        multi_objective_aggregation="sum_then_normalize" if variant == "trl-grpo" else "normalize_then_sum",
        logging_steps=10_000,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    timer = StepTimer()
    common: dict[str, Any] = {
        "model": model,
        "reward_funcs": [named_reward(s) for s in specs],
        "args": args,
        "train_dataset": to_dataset(demo_rows()),
        "processing_class": tokenizer,
    }
    if variant == "trl-grpo":
        trainer = GRPOTrainer(**common, callbacks=[timer.callback])
    else:
        monitor = RolloutMonitor(out, channels, dict.fromkeys(channels, 1.0), "gdpo-dynamic", write_every=10)
        dynamic = DynamicWeighting(channels, base_weights=(1.0,) * len(channels))
        doctor = CollapseDoctorCallback(monitor=monitor, stop=StopState(), interrupt=InterruptFlag(), dynamic=dynamic)
        trainer = MonitoredGRPOTrainer(**common, callbacks=[timer.callback, doctor], monitor=monitor, dynamic=dynamic)
        doctor.trainer = trainer
        own = OwnTime()
        own.wrap(dynamic, "step")
        own.wrap(monitor, "record")
        for hook in ("on_step_begin", "on_step_end", "on_save"):
            own.wrap(doctor, hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    if variant == "trl-grpo":
        return timer.seconds, 0.0
    monitor.close()
    return timer.seconds, own.seconds / max(1, len(timer.seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the Markdown report here.")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    own_per_step: list[float] = []
    per_repeat: dict[str, list[float]] = {"trl-grpo": [], "cd-dynamic": []}

    times: dict[str, list[float]] = {"trl-grpo": [], "cd-dynamic": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(options.repeats):
            for variant in times:
                seconds, own = run_variant(variant, options.steps, Path(tmp) / f"{variant}-{repeat}", options.seed)
                times[variant].extend(seconds[options.warmup :])
                if variant == "cd-dynamic":
                    own_per_step.append(own)
                median_ms = statistics.median(seconds[options.warmup :]) * 1e3
                per_repeat[variant].append(median_ms)
                print(f"repeat {repeat} {variant:10s} median step {median_ms:.1f} ms", file=sys.stderr)
    base = statistics.median(times["trl-grpo"])
    ours = statistics.median(times["cd-dynamic"])
    pooled = ours / base
    paired = [o / b for o, b in zip(per_repeat["cd-dynamic"], per_repeat["trl-grpo"], strict=True)]
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
        f"cd-dynamic / trl-grpo step time, median of the paired per-repeat ratios: **{ratio:.3f}** "
        f"(target <= 1.10: {verdict}); ratios {', '.join(f'{r:.2f}' for r in paired)}; pooled medians {pooled:.3f}",
        "",
        f"collapse-doctor's own code in cd-dynamic runs: {own_ms:.2f} ms per step (median over runs), "
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
