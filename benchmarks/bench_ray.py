"""Benchmark `scan --ray`: efficiency per added worker on one large run, and a sweep of many TRL output dirs.

Run:  .venv/bin/python benchmarks/bench_ray.py [--rows 20000000] [--runs 200] [--repeats 3] [--sweep-repeats 3]
                                             [--workers 1,2,4]

Every measurement is a fresh `collapse-doctor scan ... --format json` subprocess, as a user runs it (start-up and
imports included). "Ray W" is the command with `--ray auto` (the cluster of this machine) against a cluster of
W CPUs started on this machine by this script (`ray start --head --block --num-cpus W`, stopped by its process id:
no `ray stop`, which would end every Ray process of the machine). The rounds alternate the order of the cluster
sizes; each size's median is over the rounds. Efficiency per worker is ``T1 / (W * TW)`` (T1: Ray with one
worker). The cost model: ``TW = S + P / min(W, cores)``, where ``P`` is the shards' work measured in this process
(one shard reduced as a task reduces it, one thread, scaled to the run's rows) and ``S = T1 - P`` the measured serial
overhead (interpreter, imports, connecting, the workers' start, planning, merging, detectors, output); it predicts
the efficiency ``T1 / (W * TW)`` beside the measurement, so a W beyond the cores is judged by what the cores allow.
The sweep: ``--runs`` TRL output dirs (``completions/completions_<step>.parquet`` without group ids, an event file, a
trainer_state.json; generated in code, 960 rollouts each), `scan ROOT --summary-only` in one process (no Ray:
threads) against the same command on the Ray cluster of 2 CPUs. Data are generated once under benchmarks/data/
(git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scan import DATA, make_file  # noqa: E402

CLI = [str(ROOT / ".venv" / "bin" / "collapse-doctor")]
RAY = str(ROOT / ".venv" / "bin" / "ray")
PORT = 6391


RAY_ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
"""``--ray auto`` then finds the cluster started on this machine (and its token)."""


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, done.stdout


def verdicts(stdout: str) -> list[str]:
    document = json.loads(stdout)
    return [r["verdict"] for r in document.get("runs", [document])]


CURRENT_CLUSTER = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"


class Cluster:
    """``ray start --head --block`` with ``workers`` CPUs, as a child process of this script: started and ready
    (it logged that it started) on entry, ended by its process id on exit (its own processes end with it)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.seconds = 0.0

    def __enter__(self) -> Cluster:
        began = time.perf_counter()
        log = DATA / f"ray-start-{self.workers}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("w")
        command = [RAY, "start", "--head", "--block", f"--num-cpus={self.workers}", f"--port={PORT}"]
        command += ["--include-dashboard=false", "--disable-usage-stats"]
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        while "Ray runtime started" not in log.read_text():  # `ray status` times out on this machine
            if self._process.poll() is not None or time.perf_counter() - began > 120:
                self.__exit__()
                sys.exit(f"ray start failed: see {log}")
            time.sleep(0.5)
        self.seconds = time.perf_counter() - began
        return self

    def __exit__(self, *_: object) -> None:
        self._process.terminate()
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
        # `ray start` records its address in /tmp/ray/ray_current_cluster and, ended by its process id, leaves it:
        # a later `ray.init()` without an address would then try to join the cluster that is gone
        CURRENT_CLUSTER.unlink(missing_ok=True)


def shard_cost(path: Path, workers: int) -> dict[str, float]:
    """One shard reduced the way a Ray task does it (its own pass 1, one thread), the bytes its row groups hold,
    and what the driver does before the tasks start: open the run and plan the shards from the footers."""
    import pyarrow.parquet as pq

    from collapse_doctor.engine import reduce
    from collapse_doctor.engine.parallel import limit_cores
    from collapse_doctor.io.rollouts.parquet import ParquetRun, steps_read_in_tasks

    began = time.perf_counter()
    with steps_read_in_tasks():
        run = ParquetRun([path], check_rewards_first=False)  # the footers only
    shards = reduce.planned_shards(run, workers)
    plan = time.perf_counter() - began
    start, end = shards[len(shards) // 2]
    limit_cores(1)
    reduce.reduce_shard(run.step_shard(*shards[0]), device="cpu")  # warm-up: first allocations
    began = time.perf_counter()
    reduce.reduce_shard(run.step_shard(start, end), device="cpu")
    seconds = time.perf_counter() - began
    limit_cores(None)
    meta = pq.ParquetFile(path).metadata
    read, at = 0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if at < end and at + group.num_rows > start:
            read += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        at += group.num_rows
    return {
        "shards": len(shards),
        "rows": end - start,
        "seconds": seconds,
        "bytes": read,
        "plan": plan,
        "run_rows": run.num_rows,
    }


def print_cost(cost: dict[str, float]) -> None:
    print(
        f"shard: {cost['shards']:.0f} shards for 2 workers, one of {cost['rows']:,.0f} rows: "
        f"{cost['seconds']:.2f} s on one core ({cost['seconds'] / cost['rows'] * 1e9:.0f} ns/row, its pass 1 in), "
        f"{cost['bytes'] / 1e6:.1f} MB of Parquet ({cost['bytes'] / cost['rows']:.2f} B/row); "
        f"in the driver, opening the run and planning the shards from the footers: {cost['plan'] * 1e3:.1f} ms"
    )


def write_trl_dir(root: Path, seed: int, steps: int = 30, groups: int = 4, size: int = 8) -> None:
    """One small TRL output dir as ``GRPOTrainer(log_completions=True)`` leaves it (tests/helpers/trl.py, seeded)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.helpers.scalar_runs import trl_series, write_events

    rng = np.random.default_rng(seed)
    (root / "completions").mkdir(parents=True)
    n = groups * size
    for step in range(1, steps + 1):
        fmt = (rng.random(n) < 0.6).astype(float)
        correct = rng.random(n)
        total = (fmt + correct).reshape(groups, size)
        adv = (total - total.mean(1, keepdims=True)) / (total.std(1, ddof=1, keepdims=True) + 1e-4)
        table = pa.table(
            {
                "step": np.full(n, step),
                "prompt": [f"question {seed}-{step}-{g}" for g in range(groups) for _ in range(size)],
                "completion": [f"answer {i}" for i in range(n)],
                "format_reward": fmt,
                "accuracy_reward": correct,
                "advantage": adv.reshape(-1),
            }
        )
        pq.write_table(table, root / "completions" / f"completions_{step:05d}.parquet")
    write_events(root / "runs" / "Nov30_10-00-00_host", trl_series(seed=seed))
    (root / f"checkpoint-{steps}").mkdir()
    state = {"log_history": [{"step": 1, "loss": 0.1}]}
    (root / f"checkpoint-{steps}" / "trainer_state.json").write_text(json.dumps(state))


def trl_sweep(runs: int) -> Path:
    root = DATA / f"trl-sweep-{runs}"
    for i in range(runs):
        if not (root / f"run{i:03d}" / "checkpoint-30" / "trainer_state.json").exists():
            import shutil

            shutil.rmtree(root / f"run{i:03d}", ignore_errors=True)
            write_trl_dir(root / f"run{i:03d}", seed=i)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep-repeats", type=int, default=3, help="rounds that also time the sweep (<= --repeats)")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--cost-only", action="store_true", help="only the cost model's inputs (in this process)")
    args = parser.parse_args()
    big = make_file(args.rows)
    if args.cost_only:
        print_cost(shard_cost(big, 2))
        return 0
    sweep = trl_sweep(args.runs)
    cores = os.cpu_count() or 1
    sizes = [int(w) for w in args.workers.split(",")]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# {platform.node()} {cores} cores, load {os.getloadavg()}, commit {commit.stdout.strip()} + working tree")
    print(f"big run: {args.rows:,} rows x 3 channels ({big.stat().st_size / 1e6:.0f} MB); sweep: {args.runs} TRL dirs")
    scan_big = [*CLI, "scan", str(big), "--format", "json"]
    scan_sweep = [*CLI, "scan", str(sweep), "--summary-only", "--format", "json"]
    times: dict[str, list[float]] = {}
    starts: dict[int, list[float]] = {w: [] for w in sizes}
    expected: dict[str, list[str]] = {}
    loads = []

    def measure(label: str, command: list[str], env: dict[str, str] | None = None) -> None:
        wall, out = timed(command, env)
        times.setdefault(label, []).append(wall)
        found = verdicts(out)
        kind = label.split()[0]
        assert expected.setdefault(kind, found) == found, f"{label}: other verdicts than before"
        print(f"  {label}: {wall:.2f} s", flush=True)

    for round_ in range(args.repeats):
        loads.append(os.getloadavg()[0])
        print(f"round {round_ + 1} (load {loads[-1]:.2f})", flush=True)
        measure("big local", scan_big)
        if round_ < args.sweep_repeats:
            measure("sweep local", scan_sweep)
        for workers in sizes if round_ % 2 == 0 else sizes[::-1]:
            with Cluster(workers) as cluster:
                starts[workers].append(cluster.seconds)
                measure(f"big ray {workers}", [*scan_big, "--ray", "auto"], RAY_ENV)
                if workers == 2 and round_ < args.sweep_repeats:
                    measure("sweep ray 2", [*scan_sweep, "--ray", "auto"], RAY_ENV)
    loads.append(os.getloadavg()[0])
    cost = shard_cost(big, 2)
    median = {label: statistics.median(values) for label, values in times.items()}
    t1 = median["big ray 1"]
    work = cost["seconds"] / cost["rows"] * cost["run_rows"]  # P: the shards' work on one core
    serial = t1 - work  # S
    print()
    print(f"load average during the rounds: {', '.join(f'{x:.2f}' for x in loads)}")
    print("all runs (s): " + "; ".join(f"{k} {', '.join(f'{v:.2f}' for v in vs)}" for k, vs in times.items()))
    print_cost(cost)
    print(f"cost model: P = {work:.2f} s of shard work on one core, S = T1 - P = {serial:.2f} s serial overhead")
    print()
    print(
        "| Ray workers | median | speed-up over 1 | efficiency T1/(n Tn), measured | cost model: what "
        f"{cores} cores allow | target >= 0.8 |"
    )
    print("|---|---|---|---|---|---|")
    for workers in sizes:
        tn = median[f"big ray {workers}"]
        measured = t1 / (workers * tn)
        predicted = t1 / (workers * (serial + work / min(workers, cores)))
        bound = min(workers, cores) / workers
        if workers == 1:
            verdict = "-"
        elif workers <= cores:
            verdict = "met" if measured >= 0.8 else "not met"
        else:
            verdict = f"beyond the cores: prediction {predicted:.2f} (<= {bound:.2f})"
        print(
            f"| {workers} | {tn:.2f} s | {t1 / tn:.2f}x | {measured:.2f} | {predicted:.2f} "
            f"(min(n, cores)/n = {bound:.2f}) | {verdict} |"
        )
    print(f"\nthe same run without Ray (one process, threads): {median['big local']:.2f} s")
    print("`ray start` (ready): " + ", ".join(f"{w} CPU(s) {statistics.median(s):.1f} s" for w, s in starts.items()))
    if "sweep local" not in median:  # --sweep-repeats 0
        return 0
    local, on_ray = median["sweep local"], median["sweep ray 2"]
    print(
        f"sweep of {args.runs} TRL dirs: one process {local:.2f} s ({local / args.runs * 1e3:.0f} ms a run), "
        f"Ray 2 workers {on_ray:.2f} s ({on_ray / args.runs * 1e3:.0f} ms a run): "
        f"Ray / one process {on_ray / local:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
