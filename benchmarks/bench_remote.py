"""Benchmark object storage: requests and time of a scan of TRL's one-file-per-step layout on S3 against the disk.

Run:  .venv/bin/python benchmarks/bench_remote.py [--steps 200] [--repeats 3] [--strict]

The run is a real TRL output dir of the corpus (``tests/data/trl_corpus/mode-collapse-grpo-s0``: 100 steps of
``completions/completions_<step>.parquet``, about 5 kB each, and TRL's event file), extended to ``--steps``
files by repeating its steps with new step numbers (the content does not matter here, the layout does). It is
scanned from the local disk and from a real S3-protocol server on 127.0.0.1 (moto's server mode, the one the
tests use), each scan a fresh ``collapse-doctor scan RUN --json OUT`` process; medians of ``--repeats``. Every
request the server answers is counted from its access log, by kind: LIST (a bucket listing), HEAD, GET of a whole
object, ranged GET (status 206).

Targets (issue 25): at most 2 requests per object, and the S3 scan within 2x the local scan's time. With
``--strict`` the exit status is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.s3 import ENVIRONMENT  # noqa: E402  (dummy credentials, nothing from the machine: the tests' own)

SOURCE = ROOT / "tests" / "data" / "trl_corpus" / "mode-collapse-grpo-s0"
CLI = [sys.executable, "-m", "collapse_doctor"]
REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""werkzeug colours some lines of its access log (a 206 among them)."""


class RequestLog(logging.Handler):
    """Counts the requests of werkzeug's access log (moto's server runs in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        found = REQUEST.search(ANSI.sub("", record.getMessage()))
        if found is None:
            return
        method, target, status = found["method"], found["target"], found["status"]
        path, _, query = target.partition("?")
        if method == "GET" and ("list-type" in query or path.rstrip("/").count("/") <= 1):
            kind = "LIST"
        elif method == "GET":
            kind = "ranged GET" if status == "206" else "GET"
        else:
            kind = method
        self.kinds[kind] += 1
        if kind != "ranged GET" and os.environ.get("BENCH_REMOTE_TRACE"):
            print(f"  {kind}: {method} {target} {status}", file=sys.stderr)


def build_run(out: Path, steps: int) -> Path:
    """The corpus run with ``steps`` completions files (its 100 repeated under new step numbers)."""
    run = out / "trl-run"
    shutil.copytree(SOURCE / "runs", run / "runs")
    originals = sorted((SOURCE / "completions").glob("completions_*.parquet"))
    (run / "completions").mkdir(parents=True)
    for step in range(1, steps + 1):
        table = pq.read_table(originals[(step - 1) % len(originals)])
        table = table.set_column(table.schema.get_field_index("step"), "step", pa.array([step] * table.num_rows))
        pq.write_table(table, run / "completions" / f"completions_{step:05d}.parquet")
    return run


def scan_seconds(target: str, out: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    command = [*CLI, "scan", target, "--json", str(out), "--fail-on", "never"]
    done = subprocess.run(command, env=env, capture_output=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"scan {target} failed ({done.returncode}): {done.stderr.decode()[-600:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    log = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.INFO)
    werkzeug.addHandler(log)
    werkzeug.propagate = False
    os.environ.update(ENVIRONMENT)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, NO_COLOR="1")
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            run = build_run(work, args.steps)
            files = sorted(p for p in run.rglob("*") if p.is_file())
            size = sum(p.stat().st_size for p in files)
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket="bench")
            for path in files:
                client.upload_file(str(path), "bench", f"trl-run/{path.relative_to(run).as_posix()}")
            url = "s3://bench/trl-run"
            local_times, remote_times, per_scan = [], [], []
            for _ in range(args.repeats):
                local_times.append(scan_seconds(str(run), work / "local.json", env))
                log.kinds.clear()
                remote_times.append(scan_seconds(url, work / "remote.json", env))
                per_scan.append(Counter(log.kinds))
            local_verdict = (work / "local.json").read_text().split('"verdict": ')[1][:20]
            remote_verdict = (work / "remote.json").read_text().split('"verdict": ')[1][:20]
    finally:
        server.stop()
    requests = per_scan[-1]
    total = sum(requests.values())
    local, remote = statistics.median(local_times), statistics.median(remote_times)
    per_object = total / len(files)
    ratio = remote / local
    print(f"# bench_remote: {len(files)} objects ({size / 1e6:.2f} MB: {args.steps} completions files + TRL's events)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print()
    print("| measure | value | target | result |")
    print("|---|---:|---:|---|")
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(requests.items(), key=lambda item: -item[1]))
    ok_requests = per_object <= 2.0
    ok_time = ratio <= 2.0
    met = {True: "met", False: "NOT met"}
    print(f"| requests per object | {per_object:.2f} ({total:,}: {kinds}) | <= 2 | {met[ok_requests]} |")
    print(
        f"| S3 scan / local scan (medians of {args.repeats}) | {ratio:.2f}x ({remote:.2f} s / {local:.2f} s) | <= 2x | "
        f"{met[ok_time]} |"
    )
    verdicts = local_verdict.split(",")[0], remote_verdict.split(",")[0]
    same = verdicts[0] == verdicts[1]
    print(f"| same verdict from both | {verdicts[0]} / {verdicts[1]} | equal | {'yes' if same else 'NO'} |")
    print()
    shown = [", ".join(f"{t:.2f}" for t in times) for times in (local_times, remote_times)]
    print(f"local times: {shown[0]} s; S3: {shown[1]} s")
    if args.strict and not (ok_requests and ok_time and same):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
