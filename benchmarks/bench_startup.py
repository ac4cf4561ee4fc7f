#!/usr/bin/env python
"""Start-up of ``collapse-doctor scan`` on a one-step run: fresh processes, wall time, medians (issue 28).

Three commands, each run ``--repeats`` times, alternating:

- ``scan``: the executable's path (``cli.app.run``: pyarrow's pandas probe made without pandas, cli/startup.py);
- ``scan, pyarrow probes pandas``: the same scan through ``cli.app.main``, which skips that step (what every scan
  did before it);
- ``python -c pass``: the interpreter alone (the floor).

Then the ``-X importtime`` top entries of one ``scan`` (the evidence of where the time goes). Byte code is compiled
first (a pip-installed package has it; a checkout run with PYTHONDONTWRITEBYTECODE=1 compiles every module on every
start, about 0.2 s more). Exit 1 when the scan's median is above ``--target`` seconds.

    .venv/bin/python benchmarks/bench_startup.py --repeats 7
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_step_run(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 32
    table = pa.table(
        {
            "step": [1] * rows,
            "group_id": [i // 4 for i in range(rows)],
            "reward/format": [float(i % 2) for i in range(rows)],
            "reward/correct": [i / 10 for i in range(rows)],
        }
    )
    pq.write_table(table, path)


def wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target", type=float, default=0.6)
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "collapse_doctor", quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "one-step.parquet"
        one_step_run(run)
        argv = ["scan", str(run), "--device", "cpu"]
        commands = {
            "scan": [sys.executable, "-c", f"from collapse_doctor.cli.app import run; run({argv!r})"],
            "scan, pyarrow probes pandas": [
                sys.executable,
                "-c",
                f"from collapse_doctor.cli.app import main; main({argv!r})",
            ],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for command in commands.values():
            wall(command, env)  # warm the page cache
        for _ in range(args.repeats):
            for name, command in commands.items():
                times[name].append(wall(command, env))
        importtime = subprocess.run(
            [sys.executable, "-X", "importtime", *commands["scan"][1:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        ).stderr
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"one-step scan start-up, medians of {args.repeats} fresh processes (load {os.getloadavg()[0]:.2f})")
    for name, value in medians.items():
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        print(f"  {name:30s} {value:.3f} s  ({spread})")
    print(f"  scan / probe-with-pandas: {medians['scan'] / medians['scan, pyarrow probes pandas']:.2f}")
    top = []
    for line in importtime.splitlines():
        if "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        if not name.startswith("  "):  # top-level imports only: their cumulative times add up
            top.append((int(cumulative), name.strip()))
    print(f"-X importtime, top-level imports of one scan ({sum(c for c, _ in top) / 1e6:.3f} s in all):")
    for cumulative, name in sorted(top, reverse=True)[:12]:
        print(f"  {cumulative / 1e6:.3f} s  {name}")
    met = medians["scan"] <= args.target
    print(f"target: scan <= {args.target} s: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
