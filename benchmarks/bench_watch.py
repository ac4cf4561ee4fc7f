"""Benchmark `watch`: how long a new training step takes to be reflected in the diagnosis of a 1,000-step run.

Run:  .venv/bin/python benchmarks/bench_watch.py [--steps 1000] [--groups 16] [--repeats 5]

A TRL output directory (``completions/completions_<step>.parquet``, one file per step: prompt, completion, two
reward columns and the logged advantage; groups of 8) is written with ``--steps`` steps, and
`IncrementalScan.diagnose_runs` (what each poll of `watch` runs) diagnoses it once. Then, ``--repeats`` times, one
more step's file is written and the poll timed: from the file on disk to the new Diagnosis (listing, the one new
file reduced, the series merged, every detector). The first full diagnosis is timed too, for scale.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collapse_doctor.pipeline.incremental import IncrementalScan  # noqa: E402

SIZE = 8


def write_step(directory: Path, step: int, groups: int, rng: np.random.Generator) -> None:
    n = groups * SIZE
    fmt = (rng.random(n) < 0.6).astype(float)
    correct = rng.random(n)
    total = (fmt + correct).reshape(groups, SIZE)
    adv = (total - total.mean(1, keepdims=True)) / (total.std(1, ddof=1, keepdims=True) + 1e-4)
    table = pa.table(
        {
            "step": np.full(n, step),
            "prompt": [f"question {step}-{g}" for g in range(groups) for _ in range(SIZE)],
            "completion": [f"answer {i}" for i in range(n)],
            "format_reward": fmt,
            "accuracy_reward": correct,
            "advantage": adv.reshape(-1),
        }
    )
    tmp = directory / f".completions_{step:05d}.tmp"
    pq.write_table(table, tmp)
    tmp.rename(directory / f"completions_{step:05d}.parquet")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = ROOT / "benchmarks" / "data" / f"watch-{args.steps}x{args.groups}"
    shutil.rmtree(root, ignore_errors=True)
    completions = root / "completions"
    completions.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for step in range(1, args.steps + 1):
        write_step(completions, step, args.groups, rng)
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()}, {args.steps} steps x {args.groups * SIZE} rollouts")
    scan = IncrementalScan()
    start = time.perf_counter()
    (first,) = scan.diagnose_runs([root])
    print(f"first diagnosis: {time.perf_counter() - start:.2f} s ({first.run.steps} steps, verdict {first.verdict})")
    times = []
    for k in range(args.repeats):
        step = args.steps + 1 + k
        write_step(completions, step, args.groups, rng)
        start = time.perf_counter()
        (diagnosis,) = scan.diagnose_runs([root])
        times.append(time.perf_counter() - start)
        assert diagnosis.run.last_step == step, (diagnosis.run.last_step, step)
    print(f"one new step reflected: median {statistics.median(times):.3f} s of {[round(t, 3) for t in times]}")
    print(f"files reduced: {scan.files_reduced} (the {args.steps} first, then one per new step)")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
