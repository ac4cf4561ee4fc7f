"""Benchmark `scan --ray`: one large run cut into shards, and a sweep of many runs, local against Ray.

Run:  .venv/bin/python benchmarks/bench_ray.py [--rows 20000000] [--runs 50] [--repeats 3] [--workers 1,2]

Every measurement is a fresh `collapse-doctor scan ... --format json` subprocess, as a user runs it (start-up and
imports included). "local" is the scan without Ray. "ray W" is the same command with `--ray auto`
against a Ray cluster of W CPUs started beforehand on this machine with `ray start --head --num-cpus W` and
reached with `--ray auto` (its start-up is timed separately, as is `--ray` with no address, which starts and stops
a local instance inside the command).
Efficiency per worker is ``local / (ray W * W)``. The cost model's inputs are measured in this process: the
time one worker takes for one shard (``reduce.reduce_shard``) and the Parquet bytes that shard reads. Data
(3 channels, 512 groups of 8 per step, 1M-row row groups; the sweep's runs 2 channels, groups of 8) are generated
once under benchmarks/data/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scan import make_file  # noqa: E402
from benchmarks.bench_sweep import sweep  # noqa: E402

CLI = [str(ROOT / ".venv" / "bin" / "collapse-doctor")]
RAY = str(ROOT / ".venv" / "bin" / "ray")
PORT = 6391


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, done.stdout


def median_time(command: list[str], repeats: int) -> tuple[float, list[float], str]:
    times, out = [], ""
    for _ in range(repeats):
        wall, out = timed(command)
        times.append(wall)
    return statistics.median(times), times, out


def verdicts(stdout: str) -> list[str]:
    document = json.loads(stdout)
    return [r["verdict"] for r in document.get("runs", [document])]


def start_cluster(workers: int) -> float:
    subprocess.run([RAY, "stop", "--force"], capture_output=True)
    start = time.perf_counter()
    subprocess.run(
        [
            RAY,
            "start",
            "--head",
            f"--num-cpus={workers}",
            f"--port={PORT}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def shard_cost(path: Path, workers: int) -> dict[str, float]:
    """One shard, reduced the way a Ray task does it (one thread), and the bytes its row groups hold."""
    import pyarrow.parquet as pq
    import torch

    from collapse_doctor.engine import reduce
    from collapse_doctor.engine.parallel import limit_cores
    from collapse_doctor.io.rollouts.parquet import ParquetRun

    began = time.perf_counter()
    run = ParquetRun([path], check_rewards_first=False)  # pass 1, in the driver: the step column
    pass1 = time.perf_counter() - began
    shards = reduce.shard_ranges(run, workers)
    start, end = shards[len(shards) // 2]
    limit_cores(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a Ray task of one CPU (Ray sets OMP_NUM_THREADS to the task's CPUs)
    reduce.reduce_shard(run.shard(*shards[0]), device="cpu")  # warm-up: first allocations
    began = time.perf_counter()
    reduce.reduce_shard(run.shard(start, end), device="cpu")
    seconds = time.perf_counter() - began
    torch.set_num_threads(threads)
    limit_cores(None)
    meta = pq.ParquetFile(path).metadata
    read, at = 0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if at < end and at + group.num_rows > start:
            read += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        at += group.num_rows
    return {"shards": len(shards), "rows": end - start, "seconds": seconds, "bytes": read, "pass1": pass1}


def _imports(_: int) -> float:
    """A task that imports what a shard task needs, timed from inside the worker."""
    began = time.perf_counter()
    import collapse_doctor.engine.advantages
    import collapse_doctor.engine.stats  # noqa: F401

    return time.perf_counter() - began


def cluster_costs(path: Path, workers: int) -> dict[str, float]:
    """On a cluster of ``workers`` CPUs started on this machine: connecting to it, the first tasks of a command
    (fresh worker processes importing torch and collapse-doctor), and the run's shards with every worker busy."""
    import functools

    from collapse_doctor.engine import reduce
    from collapse_doctor.engine.cluster import ray_session
    from collapse_doctor.io.rollouts.parquet import ParquetRun

    start_cluster(workers)
    try:
        began = time.perf_counter()
        with ray_session("auto") as executor:
            connect = time.perf_counter() - began
            began = time.perf_counter()
            imports = list(executor.map(_imports, list(range(workers)), str))
            first_tasks = time.perf_counter() - began
            run = ParquetRun([path], check_rewards_first=False)
            shards = [run.shard(a, b) for a, b in reduce.shard_ranges(run, executor.workers)]
            began = time.perf_counter()
            list(executor.map(functools.partial(reduce.reduce_shard, device="cpu"), shards, str))
            busy = time.perf_counter() - began
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
    rounds = -(-len(shards) // workers)
    return {
        "connect": connect,
        "first_tasks": first_tasks,
        "worker_imports": max(float(t) for t in imports),  # type: ignore[arg-type]
        "shards": len(shards),
        "per_shard_busy": busy / rounds,
    }


def print_cluster_costs(costs: dict[str, float], workers: int) -> None:
    print(
        f"cluster of {workers} CPUs: connect {costs['connect']:.2f} s; first tasks {costs['first_tasks']:.2f} s "
        f"(imports in the worker {costs['worker_imports']:.2f} s); {costs['shards']:.0f} shards on warm workers: "
        f"{costs['per_shard_busy']:.2f} s per shard with every worker busy"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--cost-only", action="store_true", help="only the cost model's inputs (in this process)")
    args = parser.parse_args()
    big = make_file(args.rows)
    if args.cost_only:
        print_cost(shard_cost(big, 2))
        print_cluster_costs(cluster_costs(big, 2), 2)
        return 0
    runs = sweep(args.runs, args.steps, args.groups)
    rows_per_run = args.steps * args.groups * 8
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# {platform.node()} {os.cpu_count()} cores, load {os.getloadavg()}, commit {commit.stdout.strip()}")
    print(f"big run: {args.rows:,} rows x 3 channels ({big.stat().st_size / 1e6:.0f} MB); ", end="")
    print(f"sweep: {args.runs} runs x {rows_per_run:,} rows")
    inputs = {"big run": [str(big)], "sweep": [str(runs), "--summary-only"]}
    results: dict[str, dict[str, float]] = {name: {} for name in inputs}
    for name, paths in inputs.items():
        local, times, out = median_time([*CLI, "scan", *paths, "--format", "json"], args.repeats)
        results[name]["local"] = local
        expected = verdicts(out)
        print(f"{name} local: median {local:.2f} s of {[round(t, 2) for t in times]}")
        results[name]["expected"] = float(len(expected))
    startup = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        startup[workers] = start_cluster(workers)
        try:
            for name, paths in inputs.items():
                command = [*CLI, "scan", *paths, "--format", "json", "--ray", "auto"]
                seconds, times, out = median_time(command, args.repeats)
                results[name][f"ray {workers}"] = seconds
                print(f"{name} ray {workers}: median {seconds:.2f} s of {[round(t, 2) for t in times]}")
        finally:
            subprocess.run([RAY, "stop", "--force"], capture_output=True)
    own, _, _ = median_time([*CLI, "scan", str(big), "--format", "json", "--ray"], args.repeats)
    quick, _, _ = median_time([*CLI, "scan", str(runs / "run00"), "--format", "json"], args.repeats)
    quick_ray, _, _ = median_time([*CLI, "scan", str(runs / "run00"), "--format", "json", "--ray"], args.repeats)
    cost = shard_cost(big, 2)
    print()
    print("| input | local | " + " | ".join(f"Ray {w} worker(s) (efficiency per worker)" for w in startup) + " |")
    print("|---|---|" + "---|" * len(startup))
    for name in inputs:
        local = results[name]["local"]
        cells = [f"{results[name][f'ray {w}']:.2f} s ({local / (results[name][f'ray {w}'] * w):.2f})" for w in startup]
        print(f"| {name} | {local:.2f} s | " + " | ".join(cells) + " |")
    print()
    print("start-up: " + ", ".join(f"`ray start` with {w} CPU(s) {s:.1f} s" for w, s in startup.items()))
    print(f"`--ray` (no address: starts a local instance in the command) on the big run: median {own:.2f} s")
    print(f"one small run ({rows_per_run:,} rows): local {quick:.2f} s, `--ray` {quick_ray:.2f} s")
    print_cost(cost)
    print_cluster_costs(cluster_costs(big, 2), 2)
    return 0


def print_cost(cost: dict[str, float]) -> None:
    print(
        f"shard: {cost['shards']:.0f} shards, {cost['rows']:,.0f} rows, {cost['seconds']:.2f} s on one core "
        f"({cost['seconds'] / cost['rows'] * 1e9:.0f} ns/row), {cost['bytes'] / 1e6:.1f} MB of Parquet read "
        f"({cost['bytes'] / cost['rows']:.2f} B/row); pass 1 in the driver {cost['pass1']:.2f} s"
    )


if __name__ == "__main__":
    raise SystemExit(main())
