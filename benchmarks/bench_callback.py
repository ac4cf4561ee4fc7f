"""Cost of ``CollapseDoctorCallback`` on a plain ``trl.GRPOTrainer``: a training step with and without it.

Both variants train the built-in demo model (``collapse_doctor.retrain.demo``) on the demo task with plain
``trl.GRPOTrainer`` (``sum_then_normalize``), the same seed, batch (8 prompts x 8 completions), completion
length (8 tokens) and a learning rate of 0, so both generate exactly the same completions and do the same
model work; what differs is only the callback:

``trl``        ``GRPOTrainer(...)``
``callback``   ``GRPOTrainer(..., callbacks=[CollapseDoctorCallback()])`` with its defaults: rollout parts and
               per-step TensorBoard scalars every 20 steps, ``collapse_doctor/*`` scalars into the trainer's logs,
               the detectors after each part within their 1% time budget (``--write-every`` changes the part size)

Step time is measured by the same timing callback in both (``on_step_begin`` -> ``on_step_end``: generation,
rewards, advantages, loss, optimizer, and the callback's step-end work: writing a part, the detectors). The
first ``--warmup`` steps of each run are dropped. Runs alternate (trl, callback, trl, ...) so machine load hits
both alike, and torch runs one intra-op thread (``--threads``). The callback's work comes every
``write_every`` steps, so a median step hides it: each run is summarised by its mean step, and the runs of a
repeat by the paired ratio (callback / trl, back to back); the median over repeats is reported.

Wall-clock ratios on a busy machine are noisy (a few percent between identical runs), so the target is judged
on the callback's own code, timed inside the ``callback`` runs (recording each scored batch, the step-end part
writes and detector checks, the scalars added to each log), per step: at most 3% of the plain TRL median step.
What it does once, before the first step and after the last (imports, the final check), is left out.

    .venv/bin/python benchmarks/bench_callback.py                  # 8 repeats x 80 steps per variant
    .venv/bin/python benchmarks/bench_callback.py --repeats 20 --steps 60 --out report.md
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_retrain import OwnTime, StepTimer, demo_trainer_kwargs

TARGET = 0.03
"""The callback's own time per step, as a share of a plain TRL step."""
VARIANTS = ("trl", "callback")


def run_variant(variant: str, steps: int, out: Path, seed: int, write_every: int) -> tuple[list[float], float]:
    from trl import GRPOTrainer

    from collapse_doctor.integrations.trl import CollapseDoctorCallback

    timer = StepTimer()
    callbacks: list[Any] = [timer.callback]
    own = OwnTime()
    if variant == "callback":
        doctor = CollapseDoctorCallback(write_every=write_every, print_finding=None)
        for hook in ("_scored", "_add_scalars", "on_step_end", "on_save"):  # what runs inside the steps
            own.wrap(doctor, hook)
        callbacks.append(doctor)
    # TRL's default logging_steps, so the callback's scalars ride on real log calls
    common = demo_trainer_kwargs(out, steps, seed, "sum_then_normalize", logging_steps=10)
    trainer = GRPOTrainer(**common, callbacks=callbacks)
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    if variant == "callback" and doctor.error is not None:
        raise SystemExit(f"the callback switched itself off: {doctor.error}")
    return timer.seconds, own.seconds / max(1, len(timer.seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-every", type=int, default=None, help="CollapseDoctorCallback(write_every=...).")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the Markdown report here.")
    options = parser.parse_args()
    if options.write_every is None:
        from collapse_doctor.integrations.trl import DEFAULT_WRITE_EVERY

        options.write_every = DEFAULT_WRITE_EVERY
    torch.set_num_threads(options.threads)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_repeat: dict[str, list[float]] = {v: [] for v in VARIANTS}
    own_per_step: list[float] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(options.repeats):
            for variant in VARIANTS:
                out = Path(tmp) / f"{variant}-{repeat}"
                seconds, own = run_variant(variant, options.steps, out, options.seed, options.write_every)
                kept = seconds[options.warmup :]
                times[variant].extend(kept)
                if variant == "callback":
                    own_per_step.append(own)
                mean_ms = statistics.fmean(kept) * 1e3
                per_repeat[variant].append(mean_ms)
                print(f"repeat {repeat} {variant:8s} mean step {mean_ms:.1f} ms", file=sys.stderr)
    base = statistics.median(times["trl"])
    paired = [c / b for c, b in zip(per_repeat["callback"], per_repeat["trl"], strict=True)]
    ratio = statistics.median(paired)
    own_ms = statistics.median(own_per_step) * 1e3
    share = own_ms / (base * 1e3)
    verdict = "PASS" if share <= TARGET else "FAIL"
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
        f"the callback's own code: **{own_ms:.2f} ms per step** (median over runs), **{share:.1%}** of the trl "
        f"median step (target <= {TARGET:.0%}: {verdict})",
        "",
        f"callback / trl mean step, median of the paired per-repeat ratios: {ratio:.3f}; "
        f"ratios {', '.join(f'{r:.2f}' for r in paired)}",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"trl {trl.__version__}, transformers {transformers.__version__}, python {platform.python_version()}; "
        f"{options.repeats} repeats x {options.steps} steps per variant, first {options.warmup} dropped, "
        f"write_every {options.write_every}; {time.perf_counter() - started:.0f} s in all.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if options.out is not None:
        options.out.write_text(report, encoding="utf-8")
    return 0 if share <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
