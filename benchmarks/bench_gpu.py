"""`advantages` and `scan` of one large run on the GPU against the same commands on the same machine's CPU.

Run (on a machine with CUDA, from the repository root; ``benchmarks/gpu_check.sh`` runs it with the CUDA tests):

    python3 benchmarks/bench_gpu.py [--rows 20000000] [--repeats 3]

The file is `bench_scan.py`'s (3 reward channels, 512 groups of 8 per step). Each command is a fresh subprocess
(interpreter start and imports included, as a user runs it), the devices alternating so both see the same load;
medians of ``--repeats``. On CPU `scan` runs the dense layout on NumPy and `advantages` runs torch; on CUDA both
run torch on the GPU. The two scans' verdicts and finding codes are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scan import make_file  # noqa: E402


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: a finding at the default --fail-on
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare")
        return 2
    gpu = torch.cuda.get_device_name(0)
    print(f"# {gpu}, torch {torch.__version__}, {os.cpu_count()} CPU cores, load {os.getloadavg()}")
    path = make_file(args.rows)
    cli = [sys.executable, "-m", "collapse_doctor"]
    with tempfile.TemporaryDirectory() as tmp:

        def advantages(device: str) -> list[str]:
            return [*cli, "advantages", str(path), "-o", f"{tmp}/{device}.parquet", "--device", device]

        def scan(device: str) -> list[str]:
            return [*cli, "scan", str(path), "--format", "json", "--fail-on", "never", "--device", device]

        commands = {"advantages": advantages, "scan": scan}
        verdicts = {}
        for name, command in commands.items():
            times: dict[str, list[float]] = {"cpu": [], "cuda": []}
            for _ in range(args.repeats):
                for device in ("cpu", "cuda"):
                    wall, stdout = timed(command(device))
                    times[device].append(wall)
                    if name == "scan":
                        doc = json.loads(stdout)
                        verdicts[device] = (doc["verdict"], [f["code"] for f in doc["findings"]])
            cpu, gpu = statistics.median(times["cpu"]), statistics.median(times["cuda"])
            print(
                f"{name:>10} {args.rows:,} rows: cpu {cpu:.2f} s {[round(t, 2) for t in times['cpu']]}, "
                f"cuda {gpu:.2f} s {[round(t, 2) for t in times['cuda']]}, cpu / cuda {cpu / gpu:.2f}x",
                flush=True,
            )
    same = verdicts["cpu"] == verdicts["cuda"]
    print(f"scan verdict and findings cpu {verdicts['cpu']}, cuda {verdicts['cuda']}: {'same' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
