"""Benchmark a sweep scan: the runs of one `scan` on one thread per core against one after another.

Run:  .venv/bin/python benchmarks/bench_sweep.py [--runs 6] [--steps 400] [--groups 128] [--repeats 5]

In one process (the start-up is not what is measured): `pipeline.run_scan` over a sweep directory of canonical
Parquet runs (2 channels, groups of 8) with `available_cores` forced to 1 (sequential) and left as it is
(parallel), after one warm-up scan; medians of ``--repeats``. The runs are generated once under benchmarks/data/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collapse_doctor import pipeline  # noqa: E402
from collapse_doctor.core.options import ScanOptions  # noqa: E402
from collapse_doctor.engine.parallel import available_cores  # noqa: E402
from tests.helpers.tables import make_table  # noqa: E402


def sweep(runs: int, steps: int, groups: int) -> Path:
    root = ROOT / "benchmarks" / "data" / f"sweep-{runs}x{steps}x{groups}"
    for i in range(runs):
        path = root / f"run{i:02d}" / "rollouts.parquet"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(make_table(steps=steps, groups=groups, seed=i, text=False), path)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = sweep(args.runs, args.steps, args.groups)
    plan = pipeline.plan_scan([root], ScanOptions.of(device="cpu"))
    cores = available_cores()
    print(f"{len(plan.runs)} runs x {args.steps * args.groups * 8:,} rows, {cores} cores, load {os.getloadavg()}")
    pipeline.run_scan(plan)  # warm-up: imports, first allocations
    medians = {}
    for label, workers in (("sequential", 1), ("parallel", cores)):
        pipeline.available_cores = lambda w=workers: w  # type: ignore[assignment]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            pipeline.run_scan(plan)
            times.append(time.perf_counter() - start)
        medians[label] = statistics.median(times)
        print(f"  {label:10s} median {medians[label]:.2f} s {[round(t, 2) for t in times]}")
    print(f"  speed-up {medians['sequential'] / medians['parallel']:.2f}x; load at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
