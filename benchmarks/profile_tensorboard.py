"""Where a scan of a large TensorBoard log spends its time, part by part (the TensorBoard table of docs/benchmarks.md).

Run:  .venv/bin/python benchmarks/profile_tensorboard.py [--points 2000000] [--repeats 3]
      PYTHONPATH=/path/to/an/older/checkout .venv/bin/python benchmarks/profile_tensorboard.py   # its numbers
      .venv/bin/python benchmarks/profile_tensorboard.py --memory   # and each main part's allocation peak

The log is the one `bench_tensorboard.py` writes (TRL tags, one `simple_value` per event). Each part is timed
inside one in-process scan (medians over ``--repeats`` scans after a warm-up): walking the record headers
(`tensorboard._walk`, summed over the blocks the file is read in), the CRC checks (`_check_crcs`; on a second
thread beside the decoding in newer code, so the parts can overlap), decoding the `simple_value` records
(`decode_simple_values`), the whole read (`read_scalar_log`), the detectors (`pipeline.detect`) and the JSON
document (`Diagnosis.to_json`). Start with PYTHONPATH pointing at another checkout to time that code with the same
script.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tensorboard import make_log  # noqa: E402

PARTS = ("walk", "CRC checks", "decode simple values", "read scalar log (all)", "detectors", "JSON")


MEMORY_PARTS = ("read scalar log (all)", "detectors", "JSON")
"""Parts whose traced allocation peak (tracemalloc: numpy's buffers included) is reported too."""


def _timed(spent: dict[str, float], part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        traced = part in MEMORY_PARTS and tracemalloc.is_tracing()
        if traced:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start
            if traced:
                spent[f"{part} peak MB"] = (tracemalloc.get_traced_memory()[1] - before) / 1e6

    return wrapper


def profile_once(path: Path) -> dict[str, float]:
    import collapse_doctor.io.logs.tensorboard as tensorboard
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline import scan as pipeline

    spent: dict[str, float] = defaultdict(float)
    patches = {
        (tensorboard, "_walk"): "walk",
        (tensorboard, "_check_crcs"): "CRC checks",
        (tensorboard, "decode_simple_values"): "decode simple values",
        (pipeline, "read_scalar_log"): "read scalar log (all)",
        (pipeline, "detect"): "detectors",
    }
    originals = {key: getattr(*key) for key in patches}
    for (module, name), part in patches.items():
        setattr(module, name, _timed(spent, part, originals[(module, name)]))
    try:
        start = time.perf_counter()
        plan = pipeline.plan_scan([path], ScanOptions.of(device="cpu"))
        diagnosis = pipeline.scan_run(plan, plan.runs[0]).diagnosis
        json_start = time.perf_counter()
        _timed(spent, "JSON", diagnosis.to_json)()
        spent["JSON"] = time.perf_counter() - json_start
        spent["whole scan (in process)"] = time.perf_counter() - start
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)
    return dict(spent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also the traced allocation peak of each main part")
    args = parser.parse_args()
    path = make_log(args.points)
    import collapse_doctor

    if args.memory:
        tracemalloc.start()  # slows the allocating parts a little

    print(f"# {os.cpu_count()} cores, load {os.getloadavg()}, code from {Path(collapse_doctor.__file__).parent}")
    profile_once(path)  # warm-up
    runs = [profile_once(path) for _ in range(args.repeats)]
    print("| part | seconds (median) |")
    print("|---|---:|")
    for part in (*PARTS, "whole scan (in process)"):
        print(f"| {part} | {statistics.median(r.get(part, 0.0) for r in runs):.2f} |")
    if args.memory:
        print("\n| part | traced peak above its start (MB, median) |")
        print("|---|---:|")
        for part in MEMORY_PARTS:
            print(f"| {part} | {statistics.median(r.get(f'{part} peak MB', 0.0) for r in runs):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
