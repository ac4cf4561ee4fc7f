"""Benchmark reading TensorBoard scalars: `collapse-doctor scan` against tensorboard's EventAccumulator.

Run:  .venv/bin/python benchmarks/bench_tensorboard.py [--points 2000000] [--repeats 3]

The event file holds ``--points`` scalars under TRL tag names, one scalar per event as PyTorch's
``SummaryWriter.add_scalar`` writes them (``simple_value``). It is generated once under benchmarks/data/
(git-ignored). Each measurement is a fresh subprocess, alternating the two:

- ``collapse-doctor scan FILE --format json --device cpu`` (interpreter start, imports, reading every point,
  tag mapping, CD5xx detectors, JSON with every canonical series on stdout, discarded);
- ``EventAccumulator(FILE, size_guidance={"scalars": 0}).Reload()`` (keeps every point) and fetching every
  tag's points with ``Scalars(tag)``.

Prints a Markdown table with medians and the ratio; exit status 0 when scan is at least 10x faster (issue 15).
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
TAGS = (
    "train/reward",
    "train/reward_std",
    "train/frac_reward_zero_std",
    "train/kl",
    "train/entropy",
    "train/rewards/format_reward/mean",
    "train/rewards/format_reward/std",
    "train/rewards/correct_reward/mean",
    "train/rewards/correct_reward/std",
    "train/loss",
    "train/grad_norm",
    "train/learning_rate",
    "train/clip_ratio/region_mean",
    "train/completions/mean_length",
    "train/completions/max_length",
    "train/completions/min_length",
    "train/num_tokens",
    "train/epoch",
    "train/clip_ratio/low_mean",
    "train/clip_ratio/high_mean",
)
TARGET = 10.0

ACCUMULATOR = """
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]))
"""


def write_event_file(path: Path, points: int, seed: int = 0) -> None:
    """``points`` simple_value events (file_version first), framed with vectorised CRCs."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from collapse_doctor.io.logs.crc32c import masked_crc32c_many

    rng = np.random.default_rng(seed)
    steps = points // len(TAGS)
    payloads = [event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()]
    values = rng.random(points).astype(np.float32).tolist()
    i = 0
    for step in range(steps):
        wall = 1.7e9 + step
        for tag in TAGS:
            value = summary_pb2.Summary.Value(tag=tag, simple_value=values[i])
            payloads.append(
                event_pb2.Event(
                    wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value])
                ).SerializeToString()
            )
            i += 1
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    headers = np.frombuffer(lengths.astype("<u8").tobytes(), dtype=np.uint8)
    length_crcs = masked_crc32c_many(headers, np.arange(len(payloads)) * 8, np.full(len(payloads), 8))
    blob = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    data_crcs = masked_crc32c_many(blob, offsets, lengths)
    with path.open("wb") as out:
        for k, payload in enumerate(payloads):
            out.write(int(lengths[k]).to_bytes(8, "little"))
            out.write(int(length_crcs[k]).to_bytes(4, "little"))
            out.write(payload)
            out.write(int(data_crcs[k]).to_bytes(4, "little"))


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"NO_COLOR": "1"})
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{command[:3]} failed: {done.stderr.strip()}")
    return elapsed, done.stdout


def make_log(points: int) -> Path:
    """The benchmark's event file of ``points`` scalars under benchmarks/data/ (written once)."""
    directory = DATA / f"tensorboard_{points}"
    path = directory / "events.out.tfevents.1700000000.bench"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        write_event_file(path, points)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = make_log(args.points)
    python = sys.executable
    scan_cmd = [python, "-m", "collapse_doctor", "scan", str(path), "--format", "json", "--device", "cpu"]
    acc_cmd = [python, "-c", ACCUMULATOR, str(path)]
    scan_times, acc_times = [], []
    points = None
    for _ in range(args.repeats):
        seconds, out = timed(scan_cmd)
        scan_times.append(seconds)
        points = json.loads(out)["run"]["scalar_points"]
        seconds, out = timed(acc_cmd)
        acc_times.append(seconds)
        acc_points = int(out.strip())
    scan_s, acc_s = statistics.median(scan_times), statistics.median(acc_times)
    ratio = acc_s / scan_s
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(f"points read: scan {points:,}, EventAccumulator {acc_points:,}\n")
    print("| Points | EventAccumulator (s) | scan (s) | speed-up | Target |")
    print("|---:|---:|---:|---:|---|")
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(f"| {args.points:,} | {acc_s:.2f} | {scan_s:.2f} | {ratio:.1f}x | >= {TARGET:g}x {verdict} |")
    print(
        f"\nall runs (s): scan {[round(t, 2) for t in scan_times]}, EventAccumulator {[round(t, 2) for t in acc_times]}"
    )
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
