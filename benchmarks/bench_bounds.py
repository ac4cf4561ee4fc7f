"""Benchmark the resource bounds of `collapse-doctor scan` on the inputs of issue 26's sweep: long completion text,
many reward channels, an event file of many reward tags.

Run:  .venv/bin/python benchmarks/bench_bounds.py [--repeats 3] [--strict]

Each measurement is `collapse-doctor scan INPUT --json OUT --fail-on never --device cpu` in a fresh process: wall
time, the child's peak RSS (``ru_maxrss``) and the JSON's size, medians over the repeats. Inputs are generated once
under benchmarks/data/ (git-ignored). The targets (``--strict`` exits 1 when one is missed):

- long text: completions of 16 kB (random letters) in row groups of 8,192 rows. Memory does not grow with the text:
  the peak at 400 steps (820 MB of text) is within 1.3x the peak at 100 steps (205 MB), and the 100-step run stays
  under 1 GB.
- channels: cost linear in the channel count: 1,000 channels take at most 2.5x the time of 500, their JSON at most
  2.2x the size, and 1,000 channels peak under 1 GB.
- tags: an event file of 20,000 per-channel reward tags (5 steps) scans under 500 MB peak.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
sys.path.insert(0, str(ROOT))

MEASURE = """
import resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wall = time.perf_counter() - start
print(done.returncode, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
GROUPS, SIZE = 16, 8


def _text_run(steps: int, text_bytes: int, column: str) -> Path:
    path = DATA / f"bounds-text-{steps}-{column}.parquet"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    n = steps * GROUPS * SIZE
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    writer = None
    for lo in range(0, n, 8192):  # 8,192 rows per row group, written piece by piece (bounded memory here too)
        rows = np.arange(lo, min(n, lo + 8192))
        blob = alphabet[rng.integers(0, len(alphabet), len(rows) * text_bytes)].tobytes().decode()
        table = pa.table(
            {
                "step": rows // (GROUPS * SIZE),
                "group_id": (rows // SIZE) % GROUPS,
                "reward/a": (rng.random(len(rows)) < 0.5).astype(np.float32),
                "reward/b": rng.random(len(rows)).astype(np.float32),
                column: [blob[i * text_bytes : (i + 1) * text_bytes] for i in range(len(rows))],
            }
        )
        writer = writer or pq.ParquetWriter(path.with_suffix(".tmp"), table.schema)
        writer.write_table(table, row_group_size=8192)
    assert writer is not None
    writer.close()
    path.with_suffix(".tmp").rename(path)
    return path


def _wide_run(channels: int, steps: int = 100) -> Path:
    path = DATA / f"bounds-channels-{channels}.parquet"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    n = steps * GROUPS * SIZE
    columns: dict[str, np.ndarray] = {
        "step": np.repeat(np.arange(steps), GROUPS * SIZE),
        "group_id": np.tile(np.repeat(np.arange(GROUPS), SIZE), steps),
    }
    for k in range(channels):
        columns[f"reward/c{k}"] = (rng.random(n) < 0.5).astype(np.float32)
    pq.write_table(pa.table(columns), path)
    return path


def _tags_run(tags: int = 20_000, steps: int = 5) -> Path:
    from tests.helpers.scalar_runs import record, scalar_event

    directory = DATA / f"bounds-tags-{tags}"
    path = directory / "events.out.tfevents.1700000000.bench"
    if path.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with path.open("wb") as handle:
        for step in range(steps):
            handle.write(record(scalar_event("train/reward", float(rng.random()), step, 1.7e9 + step)))
            for k in range(tags):
                value = float(rng.random())
                handle.write(record(scalar_event(f"train/rewards/r{k}/mean", value, step, 1.7e9 + step)))
    return directory


def _measure(source: Path, repeats: int) -> dict[str, float]:
    walls, peaks, sizes = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "scan.json"
            command = [sys.executable, "-m", "collapse_doctor", "scan", str(source), "--json", str(out)]
            command += ["--fail-on", "never", "--device", "cpu"]
            done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True)
            code, wall, peak = done.stdout.split()
            assert code == "0", f"scan of {source} exited {code}"
            walls.append(float(wall))
            peaks.append(int(peak) / 1024)
            sizes.append(out.stat().st_size / 1e6)
    return {"wall": statistics.median(walls), "peak": statistics.median(peaks), "json": statistics.median(sizes)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, medians of {args.repeats}")
    results: dict[str, dict[str, float]] = {}
    inputs = {
        "text 100 steps (205 MB)": _text_run(100, 16_000, "completion"),
        "text 400 steps (820 MB)": _text_run(400, 16_000, "completion"),
        "same bytes, unread column": _text_run(100, 16_000, "notes"),
        "500 channels": _wide_run(500),
        "1,000 channels": _wide_run(1000),
        "20,000 reward tags": _tags_run(),
    }
    print(f"{'input':28} {'wall s':>8} {'peak MB':>9} {'JSON MB':>8}")
    for label, source in inputs.items():
        results[label] = _measure(source, args.repeats)
        r = results[label]
        print(f"{label:28} {r['wall']:8.2f} {r['peak']:9.0f} {r['json']:8.2f}")
    text100, text400 = results["text 100 steps (205 MB)"], results["text 400 steps (820 MB)"]
    c500, c1000 = results["500 channels"], results["1,000 channels"]
    targets = [
        ("text: peak 400 / 100 steps <= 1.3x", text400["peak"] / text100["peak"], 1.3),
        ("text: peak at 100 steps <= 1,024 MB", text100["peak"], 1024),
        ("channels: time 1,000 / 500 <= 2.5x", c1000["wall"] / c500["wall"], 2.5),
        ("channels: JSON 1,000 / 500 <= 2.2x", c1000["json"] / c500["json"], 2.2),
        ("channels: peak at 1,000 <= 1,024 MB", c1000["peak"], 1024),
        ("tags: peak at 20,000 <= 500 MB", results["20,000 reward tags"]["peak"], 500),
    ]
    missed = 0
    for name, value, limit in targets:
        ok = value <= limit
        missed += not ok
        print(f"{'met    ' if ok else 'MISSED '} {name}: {value:.2f}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
