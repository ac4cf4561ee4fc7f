"""Where `scan` spends its time, stage by stage, on one run (the profile table of docs/benchmarks.md).

Run:  .venv/bin/python benchmarks/profile_scan.py [--rows 8000000] [--repeats 3]

Stages, each the median over ``--repeats`` scans in this process after a warm-up scan (the first two are measured
in fresh subprocesses):

- start-up: `python -c "import collapse_doctor.cli.app"` and the same plus `import torch` (what a scan of rollouts
  loads), against a bare `python -c pass`;
- discover + open: `plan_scan` and opening the reader (pass 1 over the step column, the footers);
- read: pass 2, pulling the reader's chunks (Parquet decode, grouping, stacking; the NaN/inf checks);
- advantages: `compute_advantages` on each chunk (the general, torch path), or for a chunk in the dense layout
  (NumPy, `DenseChunk`) its z-scores, GRPO and GDPO advantages, asked for before the statistics;
- statistics: `step_statistics` on each chunk (without the dense path's advantages), and gathering the series;
- summary + detectors: algorithm detection, the run summary, the channel table, every detector;
- output: the text report rendered to a string.

Chunks are read and reduced on one thread here (``ChunkWorkers`` with one worker, no ``ReadAhead`` thread), so
the stage times add up to a one-core scan; the last line gives the whole scan as the CLI runs it (reading on its
own thread, chunks on one thread per core) for reference.
The file is the one `bench_scan.py` generates (3 channels, 512 groups of 8 per step).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scan import make_file  # noqa: E402


def startup(repeats: int) -> dict[str, float]:
    out = {}
    for name, code in (
        ("python", "pass"),
        ("import cli", "import collapse_doctor.cli.app"),
        ("import cli + torch", "import collapse_doctor.cli.app, torch"),
    ):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def profile_once(path: Path, workers: int | None) -> dict[str, float]:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.engine import advantages, reduce, stats
    from collapse_doctor.engine import workers as workers_module
    from collapse_doctor.io import open as io_open
    from collapse_doctor.pipeline import scan as pipeline
    from collapse_doctor.report.text import render_text

    spent: dict[str, float] = defaultdict(float)
    originals = {}

    def timed(module: object, name: str, stage: str) -> None:
        original = getattr(module, name)
        originals[(module, name)] = original

        def wrapper(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[stage] += time.perf_counter() - start

        setattr(module, name, wrapper)

    def timed_iter(cls: type, name: str, stage: str) -> None:
        original = getattr(cls, name)
        originals[(cls, name)] = original

        def wrapper(self: object, *args: object, **kwargs: object) -> object:
            iterator = original(self, *args, **kwargs)
            while True:
                start = time.perf_counter()
                try:
                    item = next(iterator)
                except StopIteration:
                    spent[stage] += time.perf_counter() - start
                    return
                spent[stage] += time.perf_counter() - start
                yield item

        setattr(cls, name, wrapper)

    from collapse_doctor.io.rollouts.parquet import ParquetRun

    timed(pipeline, "open_rollouts", "discover + open")
    timed(pipeline, "plan_scan", "discover + open")
    timed_iter(ParquetRun, "iter_chunks", "read")
    timed(advantages, "compute_advantages", "advantages")  # the general (torch) path
    timed(stats, "step_statistics", "statistics")
    dense_statistics = stats.step_statistics

    def dense_split(chunk: object, **kwargs: object) -> object:
        """The dense (NumPy) path computes the advantages inside the chunk, from the deviations the statistics
        read: they are timed as "advantages" by asking for them first (z-scores, GRPO, GDPO)."""
        if isinstance(chunk, stats.DenseChunk):
            start = time.perf_counter()
            chunk.advantages  # noqa: B018
            chunk.zscores  # noqa: B018
            spent["advantages"] += time.perf_counter() - start
        return dense_statistics(chunk, **kwargs)  # type: ignore[arg-type]

    stats.step_statistics = dense_split  # type: ignore[assignment]
    timed(pipeline, "detect", "summary + detectors")
    timed(pipeline, "rollout_summary", "summary + detectors")
    timed(pipeline, "detect_algorithm", "summary + detectors")

    class InLine:
        """The chunks read in the consuming thread (no ReadAhead thread), so each stage is timed alone."""

        def __init__(self, chunks: object) -> None:
            self._chunks = chunks

        def __iter__(self) -> object:
            return iter(self._chunks)  # type: ignore[call-overload]

        def close(self) -> None:
            pass

    if workers == 1:
        for module in (pipeline, reduce):
            originals[(module, "ReadAhead")] = module.ReadAhead
            module.ReadAhead = InLine  # type: ignore[assignment,misc]
    saved_workers = workers_module.MAX_WORKERS
    if workers is not None:
        workers_module.MAX_WORKERS = workers
    try:
        start = time.perf_counter()
        plan = pipeline.plan_scan([path], ScanOptions.of(device="cpu"))
        result = pipeline.scan_run(plan, plan.runs[0])
        out = time.perf_counter()
        render_text(result.diagnosis, io.StringIO(), color=False)
        spent["output"] += time.perf_counter() - out
        spent["whole scan"] = time.perf_counter() - start
    finally:
        workers_module.MAX_WORKERS = saved_workers
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
    del io_open
    return dict(spent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = make_file(args.rows)
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()}, {args.rows:,} rows x 3 channels")
    boot = startup(args.repeats)
    profile_once(path, 1)  # warm-up
    one = [profile_once(path, 1) for _ in range(args.repeats)]
    threads = [profile_once(path, None)["whole scan"] for _ in range(args.repeats)]
    stages = ["discover + open", "read", "advantages", "statistics", "summary + detectors", "output"]
    median = {s: statistics.median(p.get(s, 0.0) for p in one) for s in [*stages, "whole scan"]}
    print("| stage | seconds (one thread) | share |")
    print("|---|---:|---:|")
    print(f"| start-up: python | {boot['python']:.2f} | |")
    print(f"| start-up: import collapse_doctor.cli.app | {boot['import cli'] - boot['python']:.2f} | |")
    torch_import = boot["import cli + torch"] - boot["import cli"]
    print(f"| (not paid here) import torch: general layouts, CUDA | {torch_import:.2f} | |")
    for stage in stages:
        print(f"| {stage} | {median[stage]:.2f} | {median[stage] / median['whole scan']:.0%} |")
    rest = median["whole scan"] - sum(median[s] for s in stages)
    print(f"| other (gathering, trimming, glue) | {rest:.2f} | {rest / median['whole scan']:.0%} |")
    print(f"| whole scan, one thread (in process) | {median['whole scan']:.2f} | |")
    print(f"| whole scan, one thread per core (in process) | {statistics.median(threads):.2f} | |")
    print(f"# torch imported by the scans: {'torch' in sys.modules}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
