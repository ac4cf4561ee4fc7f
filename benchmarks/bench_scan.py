"""Benchmark `collapse-doctor scan`: speed against a bare pyarrow read, and memory against the run's size.

Run:  .venv/bin/python benchmarks/bench_scan.py [--rows 2000000,8000000,20000000] [--repeats 3]

Each measurement is a fresh subprocess (wall time includes interpreter start and imports); peak RSS is
the child's ``ru_maxrss`` (its median over the runs, and the largest: the peak varies from run to run with how the
reading and the two computing threads overlap). Files (3 reward channels, 512 groups of 8 per
step, zstd, 1M-row row groups) are generated once under benchmarks/data/ (git-ignored).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
GROUPS, GROUP_SIZE = 512, 8
CHANNELS = ("format", "correct", "length")

BASELINE = """
import sys, pyarrow.parquet as pq
table = pq.read_table(sys.argv[1])
arrays = [table.column(name).to_numpy() for name in table.column_names]
print(sum(len(a) for a in arrays))
"""

MEASURE = """
import resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - start
if done.returncode not in (0, 1):
    sys.exit(done.stderr)
print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def make_file(rows: int) -> Path:
    path = DATA / f"scan_{rows}x{len(CHANNELS)}.parquet"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    per_step = GROUPS * GROUP_SIZE
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp")
    schema = pa.schema(
        [("step", pa.int64()), ("group_id", pa.int64())] + [(f"reward/{c}", pa.float32()) for c in CHANNELS]
    )
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for start in range(0, rows, 1 << 20):
            n = min(1 << 20, rows - start)
            index = np.arange(start, start + n)
            step = index // per_step
            columns = {
                "step": step,
                "group_id": (index % per_step) // GROUP_SIZE,
                "reward/format": (rng.random(n) < 0.9).astype(np.float32),
                "reward/correct": rng.random(n).astype(np.float32),
                "reward/length": rng.normal(0.5, 0.1, n).astype(np.float32),
            }
            writer.write_table(pa.table(columns, schema=schema))
    tmp.rename(path)
    return path


def measure(command: list[str]) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True)
    wall, rss = out.stdout.split()
    return float(wall), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="2000000,8000000,20000000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(r) for r in args.rows.split(",")]
    scan = [str(Path(sys.executable).with_name("collapse-doctor")), "scan", "--fail-on", "never", "--device", "cpu"]
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"load average at start: {os.getloadavg()}")
    results = {}
    for rows in sizes:
        path = make_file(rows)
        runs: dict[str, list[tuple[float, float]]] = {"read": [], "scan": []}
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            runs["read"].append(measure([sys.executable, "-c", BASELINE, str(path)]))
            runs["scan"].append(measure([*scan, str(path)]))
        results[rows] = {
            name: (
                statistics.median(w for w, _ in r),
                statistics.median(m for _, m in r),
                max(m for _, m in r),
                [round(w, 2) for w, _ in r],
            )
            for name, r in runs.items()
        }
        read, ours = results[rows]["read"], results[rows]["scan"]
        print(
            f"{rows:>11,} rows  read_table+to_numpy {read[0]:6.2f} s {read[3]}  scan {ours[0]:6.2f} s {ours[3]}  "
            f"ratio {ours[0] / read[0]:.2f}x  peak RSS (median / max of the runs) read {read[1]:,.0f} / "
            f"{read[2]:,.0f} MiB, scan {ours[1]:,.0f} / {ours[2]:,.0f} MiB",
            flush=True,
        )
    if len(sizes) > 1:
        small, large = results[sizes[0]]["scan"], results[sizes[-1]]["scan"]
        print(
            f"scan peak RSS {sizes[-1]:,} rows / {sizes[0]:,} rows: {large[1] / small[1]:.2f}x (medians), "
            f"{large[2] / small[2]:.2f}x (maxima)"
        )
    print(f"load average at end: {os.getloadavg()}")
    print(f"finished {time.strftime('%Y-%m-%d %H:%M:%S')}")


if __name__ == "__main__":
    main()
