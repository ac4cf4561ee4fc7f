"""Benchmark reading TensorBoard scalars: `collapse-doctor scan` against tensorboard's EventAccumulator (issue 28).

Run:  .venv/bin/python benchmarks/bench_tensorboard.py [--points 2000000] [--large 20000000] [--repeats 3]

The event files hold ``--points`` (and ``--large``) scalars under 20 TRL tag names, one scalar per event as
PyTorch's ``SummaryWriter.add_scalar`` writes them (``simple_value``). They are generated once under
benchmarks/data/ (git-ignored; the 20M-point file is about 1.2 GB). Each measurement is a fresh subprocess, the
variants alternating within each repeat; wall time, and peak RSS from the child's own ``wait4`` rusage:

- ``collapse-doctor scan FILE --json OUT --device cpu`` (interpreter start, imports, reading every point, tag
  mapping, the CD5xx detectors, the JSON document written), on both files;
- ``EventAccumulator(FILE, size_guidance={"scalars": 0}).Reload()`` (keeps every point) and fetching every
  tag's points with ``Scalars(tag)``, on the ``--points`` file only (on the large one it takes many minutes).

Prints Markdown tables of the medians and every run, and each target of issue 28: the scan at least 10x faster
than EventAccumulator, its peak RSS at most a third of EventAccumulator's, and its peak RSS on the large file
within 1.3x of that on the small one. Exit status 1 when a target is not met.
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
from typing import Any

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
"""Speed-up over EventAccumulator, end to end."""
RSS_TARGET = 1 / 3
"""The scan's peak RSS as a share of EventAccumulator's at most."""
FLAT_TARGET = 1.3
"""The scan's peak RSS on the large file over that on the small one, at most."""

ACCUMULATOR = """
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]))
"""


WRITE_STEPS = 10_000
"""Steps framed and written at a time (the 20M-point file is written without holding it)."""


def write_event_file(path: Path, points: int, seed: int = 0) -> None:
    """``points`` simple_value events (file_version first), framed with vectorised CRCs, written block by block."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from collapse_doctor.io.logs.crc32c import masked_crc32c_many

    rng = np.random.default_rng(seed)
    steps = points // len(TAGS)
    first = [event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()]
    with path.open("wb") as out:
        for lo in range(0, steps, WRITE_STEPS):
            payloads = first
            first = []
            values = rng.random((min(steps, lo + WRITE_STEPS) - lo) * len(TAGS)).astype(np.float32).tolist()
            i = 0
            for step in range(lo, min(steps, lo + WRITE_STEPS)):
                wall = 1.7e9 + step
                for tag in TAGS:
                    value = summary_pb2.Summary.Value(tag=tag, simple_value=values[i])
                    payloads.append(
                        event_pb2.Event(
                            wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value])
                        ).SerializeToString()
                    )
                    i += 1
            out.write(_framed(payloads, masked_crc32c_many))


def _framed(payloads: list[bytes], masked_crc32c_many: Any) -> bytes:
    """TFRecords of the payloads: ``length | masked crc32c(length) | payload | masked crc32c(payload)``."""
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    headers = np.frombuffer(lengths.astype("<u8").tobytes(), dtype=np.uint8)
    length_crcs = masked_crc32c_many(headers, np.arange(len(payloads)) * 8, np.full(len(payloads), 8))
    blob = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    data_crcs = masked_crc32c_many(blob, offsets, lengths)
    parts = []
    for k, payload in enumerate(payloads):
        parts += [
            int(lengths[k]).to_bytes(8, "little"),
            int(length_crcs[k]).to_bytes(4, "little"),
            payload,
            int(data_crcs[k]).to_bytes(4, "little"),
        ]
    return b"".join(parts)


def measured(command: list[str]) -> tuple[float, float]:
    """Run ``command`` in a fresh process: (wall seconds, peak RSS in MiB, from the child's own rusage)."""
    env = os.environ | {"NO_COLOR": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the package is compiled first; children read the .pyc files
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    stderr = child.stderr.read().decode() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{command[:4]} failed ({code}): {stderr.strip()}")
    return elapsed, usage.ru_maxrss / 1024  # KiB on Linux


def make_log(points: int) -> Path:
    """The benchmark's event file of ``points`` scalars under benchmarks/data/ (written once)."""
    directory = DATA / f"tensorboard_{points}"
    path = directory / "events.out.tfevents.1700000000.bench"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        partial = path.with_name(path.name + ".partial")
        write_event_file(partial, points)
        partial.rename(path)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return path


def _runs(values: list[float], digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2_000_000)
    parser.add_argument("--large", type=int, default=20_000_000, help="points of the scan-only file (0: skip)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    small = make_log(args.points)
    large = make_log(args.large) if args.large else None
    python = sys.executable
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "collapse_doctor")], check=True)
    out = Path(tempfile.mkdtemp(prefix="bench-tensorboard-")) / "scan.json"

    def scan(path: Path) -> list[str]:
        return [python, "-m", "collapse_doctor", "scan", str(path), "--json", str(out), "--device", "cpu"]

    variants: dict[str, list[str]] = {f"scan {args.points:,}": scan(small)}
    variants[f"EventAccumulator {args.points:,}"] = [python, "-c", ACCUMULATOR, str(small)]
    if large is not None:
        variants[f"scan {args.large:,}"] = scan(large)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    rss: dict[str, list[float]] = {name: [] for name in variants}
    points: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, command in variants.items():  # alternating: one run of each variant per repeat
            wall, peak = measured(command)
            seconds[name].append(wall)
            rss[name].append(peak)
            if name.startswith("scan"):
                points[name] = json.loads(out.read_text())["run"]["scalar_points"]
            print(f"  {name}: {wall:.2f} s, {peak:.0f} MiB", file=sys.stderr)
    load_after = os.getloadavg()
    median_s = {name: statistics.median(v) for name, v in seconds.items()}
    median_rss = {name: statistics.median(v) for name, v in rss.items()}
    scan_small, acc = f"scan {args.points:,}", f"EventAccumulator {args.points:,}"
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average "
        f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} before, "
        f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} after"
    )
    print("points read: " + ", ".join(f"{name} {n:,}" for name, n in points.items()) + "\n")
    print(f"| variant | wall (s), median of {args.repeats} | peak RSS (MiB), median | all runs (s) | all runs (MiB) |")
    print("|---|---:|---:|---|---|")
    for name in variants:
        print(
            f"| {name} | {median_s[name]:.2f} | {median_rss[name]:.0f} | {_runs(seconds[name], 2)} "
            f"| {_runs(rss[name], 0)} |"
        )
    speedup = median_s[acc] / median_s[scan_small]
    share = median_rss[scan_small] / median_rss[acc]
    targets = [
        (f"speed-up over EventAccumulator, {args.points:,} points", f"{speedup:.1f}x", f">= {TARGET:g}x",
         speedup >= TARGET),
        (f"peak RSS / EventAccumulator's, {args.points:,} points", f"{share:.2f}", f"<= {RSS_TARGET:.2f}",
         share <= RSS_TARGET),
    ]  # fmt: skip
    if large is not None:
        growth = median_rss[f"scan {args.large:,}"] / median_rss[scan_small]
        targets.append(
            (f"peak RSS {args.large:,} / {args.points:,} points", f"{growth:.2f}x", f"<= {FLAT_TARGET:g}x",
             growth <= FLAT_TARGET)
        )  # fmt: skip
    print("\n| target | measured | required | status |")
    print("|---|---:|---|---|")
    for what, value, required, met in targets:
        print(f"| {what} | {value} | {required} | {'met' if met else 'NOT MET'} |")
    return 0 if all(met for *_, met in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
