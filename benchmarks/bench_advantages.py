"""Benchmark the advantage engine against the implementations it replaces, all in one run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_advantages.py [--rows 10000000] [--repeats 3] [--out REPORT.md]

Every comparison is timed in the same process run, baseline and ours interleaved (B, O, B, O, ...)
so that load from other users of a shared machine hits both alike; the table reports medians.

1. ``compute_advantages`` (GRPO + GDPO + z-scores, TRL convention, ``scale="group"``, with a step
   index) vs a per-sample Python loop keyed by group id, written the way verl's
   ``compute_grpo_outcome_advantage`` works (dict of lists, per-group ``torch.mean``/``torch.std``,
   eps 1e-6, per-sample write-back), run for the summed reward (GRPO), for each channel and for
   the fused sum per step (GDPO). The loop is timed on a ``--loop-rows`` subset and scaled
   linearly to ``--rows``.
2. ``compute_advantages`` vs TRL ``GRPOTrainer``-style ``view(-1, G)`` reshape code, (a) on the same
   contiguous equal-size layout (numerically checked to agree within 1e-5) and (b) on ragged
   groups (sizes 4..12) with rows shuffled within each step and group ids permuted, which the
   reshape code cannot handle at all, so it is compared with the reshape time on (a).
3. End to end: ``collapse-doctor advantages`` on a Parquet file (a subprocess, wall time including
   interpreter start) vs a minimal pyarrow + torch reshape script (also a subprocess), with the
   peak RSS of each.

Generated Parquet files live in ``benchmarks/data/`` (git-ignored) and are reused when present.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
DATA_DIR = BENCH_DIR / "data"

CHANNELS = ("format", "correct", "length", "judge")
WEIGHTS = (1.0, 1.0, 0.5, 0.25)
TRL_EPS = 1e-4
VERL_EPS = 1e-6
ATOL = 1e-5
SEED = 1234

Tensors = Sequence[torch.Tensor]
Stats = dict[str, float | int]


# ---------------------------------------------------------------------------------------------------------
# Synthetic rollouts
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Layout:
    """One batch of rollouts as the engine takes it."""

    name: str
    rewards: torch.Tensor  # [N, C] float32
    group_index: torch.Tensor  # [N] int64, dense
    step_index: torch.Tensor  # [N] int64, dense
    group_sizes: str

    @property
    def rows(self) -> int:
        return int(self.rewards.shape[0])


def make_rewards(rng: np.random.Generator, n: int) -> np.ndarray:
    """Four channels: two binary (format, correct), one uniform (length), one normal with 5% NaN (judge).

    The continuous channels make tied groups practically impossible, so the float32 reshape code
    and the engine can be compared at 1e-5; the NaNs exercise the nan-aware paths of both.
    """
    rewards = np.empty((n, len(CHANNELS)), dtype=np.float32)
    rewards[:, 0] = rng.random(n) < 0.8
    rewards[:, 1] = rng.random(n) < 0.35
    rewards[:, 2] = rng.random(n, dtype=np.float32)
    judge = rng.standard_normal(n, dtype=np.float32)
    judge[rng.random(n) < 0.05] = np.nan
    rewards[:, 3] = judge
    return rewards


def contiguous_layout(n: int, group_size: int, rows_per_step: int, seed: int = SEED) -> Layout:
    """Equal groups of ``group_size`` consecutive rows, steps of ``rows_per_step`` consecutive rows."""
    rng = np.random.default_rng(seed)
    rows = torch.arange(n, dtype=torch.int64)
    return Layout(
        name="contiguous",
        rewards=torch.from_numpy(make_rewards(rng, n)),
        group_index=rows // group_size,
        step_index=rows // rows_per_step,
        group_sizes=f"all {group_size}",
    )


def ragged_layout(n: int, groups_per_step: int, low: int = 4, high: int = 12, seed: int = SEED + 1) -> Layout:
    """Group sizes drawn from ``low..high``, rows shuffled within each step, group ids permuted."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high + 1, size=n // low + 1)
    ends = np.cumsum(sizes)
    num_groups = int(np.searchsorted(ends, n)) + 1
    sizes = sizes[:num_groups]
    sizes[-1] -= int(ends[num_groups - 1]) - n  # the last group takes the remainder
    group_of_row = np.repeat(np.arange(num_groups, dtype=np.int64), sizes)
    step_of_group = np.arange(num_groups, dtype=np.int64) // groups_per_step
    step_of_row = step_of_group[group_of_row]
    order = np.lexsort((rng.random(n), step_of_row))  # by step, random within the step
    relabel = rng.permutation(num_groups).astype(np.int64)
    return Layout(
        name="ragged",
        rewards=torch.from_numpy(make_rewards(rng, n)),
        group_index=torch.from_numpy(relabel[group_of_row[order]]),
        step_index=torch.from_numpy(step_of_row[order]),
        group_sizes=f"{low}..{high} (mean {n / num_groups:.2f}), shuffled within steps",
    )


# ---------------------------------------------------------------------------------------------------------
# Implementations under test
# ---------------------------------------------------------------------------------------------------------


def engine(layout: Layout, weights: torch.Tensor, convention: str = "trl") -> tuple[torch.Tensor, ...]:
    """Ours: one ``compute_advantages`` call (GRPO, GDPO and per-channel z-scores)."""
    from collapse_doctor.engine.advantages import compute_advantages

    result = compute_advantages(
        layout.rewards,
        layout.group_index,
        weights=weights,
        step_index=layout.step_index,
        scale="group",
        convention=convention,  # type: ignore[arg-type]
    )
    return result.grpo, result.gdpo, result.zscores


def nanstd(tensor: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """TRL's ``trl.trainer.utils.nanstd`` (ddof=1, NaN ignored)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=keepdim)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=keepdim)
    variance *= count / (count - 1)
    return torch.sqrt(variance)


def reshape_advantages(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int, rows_per_step: int
) -> tuple[torch.Tensor, ...]:
    """TRL ``GRPOTrainer``-style code: valid only for contiguous equal-size groups and equal steps.

    ``sum_then_normalize`` (GRPO, ``scale_rewards="group"``) and ``normalize_then_sum`` (GDPO) as in
    TRL, the batch statistics of GDPO taken per step through ``view(-1, rows_per_step)``.
    """
    channels = rewards.shape[1]
    # sum_then_normalize
    total = (rewards * weights.unsqueeze(0)).nansum(dim=1)
    grouped = total.view(-1, group_size)
    mean_grouped = grouped.mean(dim=1).repeat_interleave(group_size, dim=0)
    std_grouped = grouped.std(dim=1).repeat_interleave(group_size, dim=0)
    grpo = (total - mean_grouped) / (std_grouped + TRL_EPS)
    # normalize_then_sum
    grouped_k = rewards.view(-1, group_size, channels)
    mean_k = torch.nanmean(grouped_k, dim=1, keepdim=True)
    std_k = nanstd(grouped_k, dim=1, keepdim=True)
    zscores = ((grouped_k - mean_k) / (std_k + TRL_EPS)).view(-1, channels)
    fused = (zscores * weights.unsqueeze(0)).nansum(dim=1).view(-1, rows_per_step)
    batch_mean = fused.mean(dim=1, keepdim=True)
    batch_std = fused.std(dim=1, keepdim=True)
    gdpo = ((fused - batch_mean) / (batch_std + TRL_EPS)).view(-1)
    return grpo, gdpo, zscores


def verl_style_normalize(
    scores: torch.Tensor, index: np.ndarray, valid: list[bool] | None = None, epsilon: float = VERL_EPS
) -> torch.Tensor:
    """verl's ``compute_grpo_outcome_advantage`` loop on one score per row (``valid`` skips NaN rows).

    A dict of lists per id built sample by sample, ``torch.mean``/``torch.std`` per id (an id with
    one score gets mean 0, std 1), then a per-sample write-back.
    """
    scores = scores.clone()
    id2score: defaultdict[Any, list[torch.Tensor]] = defaultdict(list)
    id2mean: dict[Any, torch.Tensor] = {}
    id2std: dict[Any, torch.Tensor] = {}
    bsz = scores.shape[0]
    for i in range(bsz):
        if valid is None or valid[i]:
            id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0)
            id2std[idx] = torch.tensor(1.0)
        else:
            id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
    for i in range(bsz):
        if valid is None or valid[i]:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return scores


def _weighted_nansum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights.unsqueeze(0)).nansum(dim=1)


def loop_advantages(layout: Layout, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same work as the engine, with the verl-style loop: GRPO, 4 channel z-scores, GDPO per step."""
    groups = layout.group_index.numpy()
    grpo = verl_style_normalize(_weighted_nansum(layout.rewards, weights), groups)
    columns = []
    for k in range(layout.rewards.shape[1]):
        column = layout.rewards[:, k].contiguous()
        valid = (~torch.isnan(column)).tolist()
        columns.append(verl_style_normalize(column, groups, valid))
    zscores = torch.stack(columns, dim=1)
    gdpo = verl_style_normalize(_weighted_nansum(zscores, weights), layout.step_index.numpy())
    return grpo, gdpo, zscores


def subset(layout: Layout, rows: int) -> Layout:
    return Layout(
        name=f"{layout.name}[:{rows}]",
        rewards=layout.rewards[:rows],
        group_index=layout.group_index[:rows],
        step_index=layout.step_index[:rows],
        group_sizes=layout.group_sizes,
    )


# ---------------------------------------------------------------------------------------------------------
# Numerical agreement
# ---------------------------------------------------------------------------------------------------------


def max_abs_diff(got: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Largest |got - expected| where both are finite, and the number of NaN-pattern mismatches.

    A z-score whose channel has a single non-NaN value in its group is NaN in TRL's code and 0 in
    the engine (documented); such positions do not count as mismatches.
    """
    got_nan, exp_nan = torch.isnan(got), torch.isnan(expected)
    mismatch = (got_nan != exp_nan) & ~(exp_nan & (got == 0))
    both = ~got_nan & ~exp_nan
    diff = (got[both].double() - expected[both].double()).abs()
    return (float(diff.max()) if diff.numel() else 0.0), int(mismatch.sum())


def compare_outputs(ours: Tensors, theirs: Tensors, label: str) -> Stats:
    out: Stats = {}
    for name, a, b in zip(("grpo", "gdpo", "zscores"), ours, theirs, strict=True):
        diff, mismatch = max_abs_diff(a, b)
        out[f"{name}_max_abs_diff"] = diff
        out[f"{name}_nan_mismatch"] = mismatch
        print(f"  {label}: {name:8s} max |diff| = {diff:.3e}, NaN-pattern mismatches = {mismatch}")
    return out


def assert_agree(stats: Stats, label: str, atol: float = ATOL) -> None:
    for key, value in stats.items():
        limit = atol if key.endswith("max_abs_diff") else 0
        assert value <= limit, f"{label}: {key} = {value} exceeds {limit}"


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    label: str
    seconds: list[float] = field(default_factory=list)
    peak_rss_mib: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def runs(self) -> str:
        return ", ".join(f"{s:.3f}" for s in self.seconds)


TimedRun = tuple[Timing, Callable[[], Any]]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def interleave(repeats: int, runs: Sequence[TimedRun], keep: bool = False) -> list[Any]:
    """Run every function once per round, ``repeats`` rounds; return the last outputs when ``keep``."""
    last: list[Any] = [None] * len(runs)
    for round_ in range(repeats):
        for i, (timing, fn) in enumerate(runs):
            last[i] = None
            seconds, out = timed(fn)
            timing.seconds.append(seconds)
            if keep:
                last[i] = out
            del out
            print(f"    round {round_ + 1}/{repeats}: {timing.label}: {seconds:.3f} s", flush=True)
    return last


# Peak RSS must be measured in a small intermediate process: Linux keeps a child's RSS high-water mark
# across exec, so a child forked straight from this (multi-GB) process would report the parent's RSS.
RSS_WRAPPER = (
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "code = subprocess.call(sys.argv[2:])\n"
    "wall = time.perf_counter() - start\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(f'{code} {wall} {peak}')\n"
    "sys.exit(code)\n"
)


def run_child(cmd: Sequence[str]) -> tuple[float, float]:
    """Wall time (s, including the child's interpreter start) and peak RSS (MiB) of one command."""
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".txt") as stats,
    ):
        proc = subprocess.run(
            [sys.executable, "-c", RSS_WRAPPER, stats.name, *cmd],
            stdout=out,
            stderr=err,
            cwd=ROOT,
            check=False,
        )
        if proc.returncode != 0:
            err.seek(0)
            out.seek(0)
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}:\n{out.read().decode()}\n{err.read().decode()}"
            )
        _, wall, peak_kib = stats.read().split()
    return float(wall), int(peak_kib) / 1024.0  # ru_maxrss is in KiB on Linux


# ---------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------


def write_rollouts(path: Path, rows: int, group_size: int, rows_per_step: int) -> None:
    """The canonical layout: ``step``, ``group_id`` (int64, unique per run), ``reward/<channel>``; zstd."""
    params = {"rows": rows, "group_size": group_size, "rows_per_step": rows_per_step, "seed": SEED}
    if path.exists():
        try:
            meta = pq.ParquetFile(path).schema_arrow.metadata or {}
            if json.loads(meta.get(b"bench_params", b"{}")) == params:
                return
        except (pa.ArrowException, OSError, ValueError):
            pass
    print(f"  generating {path.relative_to(ROOT)} ({rows:,} rows)", flush=True)
    rng = np.random.default_rng(SEED + rows)
    rewards = make_rewards(rng, rows)
    index = np.arange(rows, dtype=np.int64)
    columns: dict[str, np.ndarray] = {"step": index // rows_per_step, "group_id": index // group_size}
    for k, channel in enumerate(CHANNELS):
        columns[f"reward/{channel}"] = rewards[:, k]
    table = pa.table(columns).replace_schema_metadata({"bench_params": json.dumps(params)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20)
    tmp.replace(path)


def baseline_e2e(src: str, dst: str, group_size: str, rows_per_step: str) -> None:
    """The minimal baseline script: read it all with pyarrow, reshape math in torch, write with pyarrow."""
    table = pq.read_table(src)
    channels = [name for name in table.column_names if name.startswith("reward/")]
    rewards = torch.from_numpy(
        np.stack([table.column(name).to_numpy().astype(np.float32, copy=False) for name in channels], axis=1)
    )
    weights = torch.tensor(WEIGHTS[: len(channels)], dtype=torch.float32)
    grpo, gdpo, zscores = reshape_advantages(rewards, weights, int(group_size), int(rows_per_step))
    columns: dict[str, Any] = {"step": table.column("step"), "group_id": table.column("group_id")}
    for name in channels:
        columns[name] = table.column(name)
    columns["adv/grpo"], columns["adv/gdpo"] = grpo.numpy(), gdpo.numpy()
    z = zscores.numpy()
    for k, name in enumerate(channels):
        columns[f"adv/{name.removeprefix('reward/')}"] = z[:, k]
    pq.write_table(pa.table(columns), dst, compression="zstd")


BASELINE_SCRIPT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from bench_advantages import baseline_e2e; baseline_e2e(*sys.argv[2:])"
)


def cli_path() -> str:
    local = Path(sys.executable).parent / "collapse-doctor"
    found = str(local) if local.exists() else shutil.which("collapse-doctor")
    if not found:
        raise SystemExit("collapse-doctor is not installed in this environment (pip install -e .)")
    return found


def e2e_commands(
    data: Path, out_ours: Path, out_base: Path, group_size: int, rows_per_step: int
) -> tuple[list[str], list[str]]:
    weights = ",".join(f"{c}={w:g}" for c, w in zip(CHANNELS, WEIGHTS, strict=True))
    ours = [cli_path(), "advantages", str(data), "-o", str(out_ours), "--weights", weights, "--device", "cpu"]
    base = [
        sys.executable,
        "-c",
        BASELINE_SCRIPT,
        str(BENCH_DIR),
        str(data),
        str(out_base),
        str(group_size),
        str(rows_per_step),
    ]
    return ours, base


def compare_files(ours: Path, theirs: Path) -> Stats:
    a, b = pq.read_table(ours), pq.read_table(theirs)
    assert a.num_rows == b.num_rows, (a.num_rows, b.num_rows)
    for key in ("step", "group_id"):
        assert np.array_equal(a.column(key).to_numpy(), b.column(key).to_numpy()), key

    def tensors(t: pa.Table) -> tuple[torch.Tensor, ...]:
        z = np.stack([t.column(f"adv/{c}").to_numpy() for c in CHANNELS], axis=1)
        return (
            torch.from_numpy(t.column("adv/grpo").to_numpy()),
            torch.from_numpy(t.column("adv/gdpo").to_numpy()),
            torch.from_numpy(z),
        )

    return compare_outputs(tensors(a), tensors(b), "e2e output (ours vs baseline)")


# ---------------------------------------------------------------------------------------------------------
# Machine, report
# ---------------------------------------------------------------------------------------------------------


def source_digest() -> str:
    """sha256 of the package sources, so a report names the code it measured (others may edit it)."""
    import hashlib

    import collapse_doctor

    package = Path(collapse_doctor.__file__).resolve().parent
    files = sorted(package.rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    newest = max(path.stat().st_mtime for path in files)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(newest))
    return f"sha256 {digest.hexdigest()[:12]} over {len(files)} files (newest modified {stamp} UTC)"


def machine_info() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return {
        "CPU": model,
        "cores": f"{os.cpu_count()} logical, {usable} usable by this process",
        "memory": memory,
        "OS": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "torch threads": str(torch.get_num_threads()),
        "GPU": gpu,
        "collapse_doctor source": source_digest(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


@dataclass
class Row:
    comparison: str
    baseline: str
    baseline_s: float
    ours_s: float
    ratio: float
    ratio_text: str
    target: str
    passed: bool


def results_table(rows: Sequence[Row]) -> str:
    lines = [
        "| Comparison | Baseline | Baseline median (s) | Ours median (s) | Ratio | Target | Result |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.comparison} | {r.baseline} | {r.baseline_s:.3f} | {r.ours_s:.3f} | {r.ratio_text} | "
            f"{r.target} | {'PASS' if r.passed else 'FAIL'} |"
        )
    return "\n".join(lines)


def runs_table(timings: Sequence[Timing]) -> str:
    lines = ["| Measurement | Runs (s) | Median (s) |", "|---|---|---:|"]
    lines += [f"| {t.label} | {t.runs()} | {t.median:.3f} |" for t in timings]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=10_000_000, help="rollouts for the in-process comparisons")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median reported)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=500, help="groups per training step")
    p.add_argument("--loop-rows", type=int, default=1_000_000, help="subset the Python loop is timed on")
    p.add_argument("--e2e-rows", type=int, default=8_000_000, help="rows of the end-to-end Parquet file")
    p.add_argument(
        "--rss-rows",
        default="2000000,16000000",
        help="comma-separated extra e2e file sizes, one run each, for peak-RSS growth ('' or 0: none)",
    )
    p.add_argument("--skip-loop", action="store_true", help="skip comparison 1 (the slow Python loop)")
    p.add_argument("--skip-e2e", action="store_true", help="skip comparison 3")
    p.add_argument("--out", type=Path, help="also write the report (Markdown) to this file")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    step = args.group_size * args.groups_per_step

    def whole_steps(value: int, option: str) -> int:
        rounded = value // step * step
        if value and rounded != value:
            print(f"note: {option} {value:,} rounded down to {rounded:,} (whole steps)")
        if value and not rounded:
            p.error(f"{option} must be at least one step ({step} rows)")
        return rounded

    for name in ("rows", "loop_rows", "e2e_rows"):
        setattr(args, name, whole_steps(getattr(args, name), f"--{name.replace('_', '-')}"))
    try:
        extra = [int(part.replace("_", "")) for part in args.rss_rows.split(",") if part.strip()]
    except ValueError:
        p.error(f"--rss-rows {args.rss_rows!r} is not a comma-separated list of row counts")
    args.rss_rows = sorted({whole_steps(n, "--rss-rows") for n in extra if n} - {args.e2e_rows})
    args.loop_rows = min(args.loop_rows, args.rows)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    g, rows_per_step, repeats = args.group_size, args.group_size * args.groups_per_step, args.repeats
    weights = torch.tensor(WEIGHTS, dtype=torch.float32)
    info = machine_info()
    print("## Machine\n")
    for key, value in info.items():
        print(f"- {key}: {value}")
    print(
        f"\nWorkload: {args.rows:,} rollouts x {len(CHANNELS)} channels ({', '.join(CHANNELS)}; weights "
        f"{', '.join(f'{w:g}' for w in WEIGHTS)}), group size {g} ({args.rows // g:,} groups), "
        f"{args.groups_per_step} groups = {rows_per_step:,} rows per step "
        f"({args.rows // rows_per_step:,} steps), "
        f"TRL convention, scale group; median of {repeats} runs.\n",
        flush=True,
    )
    rows: list[Row] = []
    timings: list[Timing] = []
    checks: dict[str, Any] = {}

    # Warm-up (kernels, allocator) on a small slice, not timed.
    contiguous = contiguous_layout(args.rows, g, rows_per_step)
    small = subset(contiguous, min(args.rows, 64 * rows_per_step))
    engine(small, weights)
    reshape_advantages(small.rewards, weights, g, rows_per_step)

    # 2a. engine vs reshape, contiguous layout ------------------------------------------------------------
    print("### 2a. engine vs TRL-style reshape, contiguous layout", flush=True)
    t_reshape = Timing(f"TRL reshape, contiguous, {args.rows:,} rows")
    t_engine = Timing(f"engine, contiguous, {args.rows:,} rows")
    ours_out, base_out = interleave(
        repeats,
        [
            (t_engine, partial(engine, contiguous, weights)),
            (t_reshape, partial(reshape_advantages, contiguous.rewards, weights, g, rows_per_step)),
        ],
        keep=True,
    )
    stats = compare_outputs(ours_out, base_out, "engine vs reshape")
    checks["engine vs reshape (contiguous)"] = stats
    del ours_out, base_out
    assert_agree(stats, "engine vs reshape (contiguous)")
    timings += [t_reshape, t_engine]
    ratio = t_engine.median / t_reshape.median
    rows.append(
        Row(
            "2a. GRPO+GDPO+z, contiguous equal groups",
            "TRL `view(-1, G)` reshape (same layout)",
            t_reshape.median,
            t_engine.median,
            ratio,
            f"{ratio:.2f}x (ours/base)",
            "<= 1.5x",
            ratio <= 1.5,
        )
    )

    # 2b. engine on ragged, shuffled layout ----------------------------------------------------------------
    print("### 2b. engine on ragged groups, rows shuffled within steps", flush=True)
    ragged = ragged_layout(args.rows, args.groups_per_step)
    print(f"  ragged layout: group sizes {ragged.group_sizes}, {int(ragged.group_index.max()) + 1:,} groups")
    t_ragged = Timing(f"engine, ragged 4..12 + shuffled, {args.rows:,} rows")
    interleave(repeats, [(t_ragged, partial(engine, ragged, weights))])
    del ragged
    timings.append(t_ragged)
    ratio = t_ragged.median / t_reshape.median
    rows.append(
        Row(
            "2b. GRPO+GDPO+z, ragged sizes 4..12, shuffled",
            "TRL reshape on the contiguous layout (it cannot do ragged)",
            t_reshape.median,
            t_ragged.median,
            ratio,
            f"{ratio:.2f}x (ours/base)",
            "<= 3x",
            ratio <= 3.0,
        )
    )

    # 1. engine vs verl-style Python loop ------------------------------------------------------------------
    if not args.skip_loop:
        print(f"### 1. engine vs verl-style per-sample loop ({args.loop_rows:,}-row subset)", flush=True)
        check = subset(contiguous, 2 * rows_per_step)
        checks["verl loop vs engine (verl convention)"] = stats = compare_outputs(
            engine(check, weights, convention="verl"), loop_advantages(check, weights), "loop vs engine(verl)"
        )
        assert_agree(stats, "verl loop vs engine (verl convention)")
        part = subset(contiguous, args.loop_rows)
        t_loop = Timing(f"verl-style loop, {args.loop_rows:,} rows")
        t_engine_part = Timing(f"engine, contiguous, {args.loop_rows:,} rows")
        interleave(
            repeats,
            [
                (t_loop, partial(loop_advantages, part, weights)),
                (t_engine_part, partial(engine, part, weights)),
            ],
        )
        timings += [t_loop, t_engine_part]
        scale = args.rows / args.loop_rows
        loop_scaled = t_loop.median * scale
        speedup = loop_scaled / t_engine.median
        rows.append(
            Row(
                f"1. GRPO+GDPO+z, {args.rows:,} rows",
                f"verl-style Python loop (timed on {args.loop_rows:,} rows, x{scale:g} linear)",
                loop_scaled,
                t_engine.median,
                speedup,
                f"{speedup:.0f}x faster",
                ">= 100x faster",
                speedup >= 100,
            )
        )
        print(
            f"  same-size check: loop {t_loop.median:.2f} s vs engine {t_engine_part.median:.3f} s on "
            f"{args.loop_rows:,} rows = {t_loop.median / t_engine_part.median:.0f}x"
        )
    del contiguous, small
    gc.collect()

    # 3. end to end -----------------------------------------------------------------------------------------
    memory: list[tuple[int, Timing, Timing]] = []
    if not args.skip_e2e:
        print(f"### 3. end to end, {args.e2e_rows:,}-row Parquet file", flush=True)
        sizes = [args.e2e_rows, *args.rss_rows]
        for n in sizes:
            data = DATA_DIR / f"rollouts_{n}x{len(CHANNELS)}_g{g}_s{rows_per_step}.parquet"
            write_rollouts(data, n, g, rows_per_step)
            out_ours = DATA_DIR / f"out_ours_{n}.parquet"
            out_base = DATA_DIR / f"out_baseline_{n}.parquet"
            ours_cmd, base_cmd = e2e_commands(data, out_ours, out_base, g, rows_per_step)
            if n == args.e2e_rows:
                print(f"  ours:     {' '.join(ours_cmd)}")
                print(f"  baseline: python -c '{BASELINE_SCRIPT}' ... (bench_advantages.py:baseline_e2e)")
            t_base = Timing(f"e2e baseline script, {n:,} rows")
            t_ours = Timing(f"e2e collapse-doctor advantages, {n:,} rows")
            rounds = repeats if n == args.e2e_rows else 1
            for round_ in range(rounds):
                for timing, cmd in ((t_base, base_cmd), (t_ours, ours_cmd)):
                    wall, rss = run_child(cmd)
                    timing.seconds.append(wall)
                    timing.peak_rss_mib.append(rss)
                    where = f"round {round_ + 1}/{rounds}: {timing.label}"
                    print(f"    {where}: {wall:.3f} s, peak RSS {rss:.0f} MiB", flush=True)
            memory.append((n, t_base, t_ours))
            if n == args.e2e_rows:
                checks["e2e output"] = stats = compare_files(out_ours, out_base)
                assert_agree(stats, "e2e output")
                timings += [t_base, t_ours]
                ratio = t_ours.median / t_base.median
                rows.append(
                    Row(
                        f"3. end to end, {n:,}-row Parquet (subprocess wall)",
                        "pyarrow read + torch reshape + pyarrow write script",
                        t_base.median,
                        t_ours.median,
                        ratio,
                        f"{ratio:.2f}x (ours/base)",
                        "<= 2.5x",
                        ratio <= 2.5,
                    )
                )
            for path in (out_ours, out_base):
                path.unlink(missing_ok=True)

    # GPU ---------------------------------------------------------------------------------------------------
    gpu_lines: list[str] = []
    if torch.cuda.is_available():
        print("### GPU: engine on CUDA", flush=True)
        dev = torch.device("cuda")
        layouts = [
            contiguous_layout(args.rows, g, rows_per_step),
            ragged_layout(args.rows, args.groups_per_step),
        ]
        w = weights.to(dev)
        for layout in layouts:
            on_dev = Layout(
                layout.name,
                layout.rewards.to(dev),
                layout.group_index.to(dev),
                layout.step_index.to(dev),
                layout.group_sizes,
            )
            engine(on_dev, w)
            torch.cuda.synchronize()
            t_gpu = Timing(f"engine on {torch.cuda.get_device_name(0)}, {layout.name}, {args.rows:,} rows")

            def run_gpu(on_dev: Layout = on_dev, w: torch.Tensor = w) -> None:
                engine(on_dev, w)
                torch.cuda.synchronize()

            interleave(repeats, [(t_gpu, run_gpu)])
            timings.append(t_gpu)
            gpu_lines.append(f"- {t_gpu.label}: median {t_gpu.median:.4f} s ({t_gpu.runs()})")
    else:
        gpu_lines.append("- no GPU (torch.cuda.is_available() is False): CUDA timing not measured")

    # Report ------------------------------------------------------------------------------------------------
    info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    total = time.perf_counter() - started
    parts = ["## Machine", "", *(f"- {k}: {v}" for k, v in info.items()), ""]
    parts += ["## Results (medians)", "", results_table(rows), ""]
    parts += ["## All runs", "", runs_table(timings), ""]
    if memory:
        parts += ["## Peak RSS, end to end (MiB, max over runs)", ""]
        parts += ["| Rows | Baseline script | collapse-doctor advantages |", "|---:|---:|---:|"]
        parts += [
            f"| {n:,} | {max(b.peak_rss_mib):.0f} | {max(o.peak_rss_mib):.0f} |"
            for n, b, o in sorted(memory, key=lambda m: m[0])
        ]
        parts.append("")
    parts += ["## Numerical agreement (max |diff|)", ""]
    for label, stats in checks.items():
        diffs = [f"{k.split('_')[0]} {v:.2e}" for k, v in stats.items() if k.endswith("_diff")]
        mismatches = sum(v for k, v in stats.items() if k.endswith("_mismatch"))
        parts.append(f"- {label}: {', '.join(diffs)}; NaN-pattern mismatches {mismatches}")
    parts += ["", "## GPU", "", *gpu_lines, "", f"Total benchmark time: {total:.0f} s", ""]
    report = "\n".join(parts)
    print("\n" + report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}")
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
