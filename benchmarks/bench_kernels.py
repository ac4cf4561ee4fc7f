"""Micro-benchmark of the torch CPU kernels behind the layout choices of the dense statistics path.

Run:  .venv/bin/python benchmarks/bench_kernels.py [--repeats 200] [--threads 1]

One 256k-row chunk of groups of 8 (32,768 groups, 3 channels), float32, torch single-threaded (as the scan
runs it). Prints the median time of each kernel in milliseconds: a reduction over a group in the row-major
``[G, g]`` layout against the member-major ``[g, G]`` layout, ``argmax`` over 3 channels against the
comparison passes that replace it (``stats.kernels.first_argmax``), and ``torch.where`` / ``masked_fill`` against a
multiply. docs/benchmarks.md quotes these numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from collapse_doctor.engine.stats.kernels import first_argmax

GROUPS, SIZE, CHANNELS = 32_768, 8, 3


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(GROUPS, SIZE, generator=gen)  # row-major: groups, then members
    members = rows.t().contiguous()  # member-major
    channels = torch.randn(CHANNELS, GROUPS, SIZE, generator=gen)
    mask = rows > 0
    other = torch.randn(GROUPS, SIZE, generator=gen)
    kernels: dict[str, Callable[[], object]] = {
        "sum over a group, [G, g] dim 1": lambda: rows.sum(dim=1),
        "sum over a group, [g, G] dim 0": lambda: members.sum(dim=0),
        "max over a group, [G, g] dim 1": lambda: rows.amax(dim=1),
        "max over a group, [g, G] dim 0": lambda: members.amax(dim=0),
        "argmax over 3 channels, torch.argmax(dim=0)": lambda: channels.abs().argmax(dim=0),
        "argmax over 3 channels, comparison passes": lambda: first_argmax(list(channels.abs())),
        "torch.where(mask, a, b)": lambda: torch.where(mask, rows, other),
        "a.masked_fill(mask, 0)": lambda: rows.masked_fill(mask, 0.0),
        "a * b (reference)": lambda: rows * other,
    }
    print(f"torch {torch.__version__}, {args.threads} thread(s), {GROUPS:,} groups x {SIZE}, median of {args.repeats}")
    for name, fn in kernels.items():
        print(f"{median_ms(fn, args.repeats):8.3f} ms  {name}")


if __name__ == "__main__":
    main()
