"""GRPO vs GDPO vs the retrain recipes on ``retrain --demo`` (the digit-copy task), over seeds.

Each variant runs ``collapse-doctor retrain --demo`` (its defaults: 100 steps of 8 prompts x 8 completions,
learning rate 3e-2) with one ``--config``, then ``collapse-doctor scan --json`` of its rollouts. Reported per
run: the mean ``correct`` reward over the last 20 steps (``correct`` as the reward function returned it), the
first step at which its 10-step rolling mean reaches ``--level``, the mean ``length`` (raw) over the last 20
steps, and the scan's verdict and findings. One torch thread per run, ``--jobs`` runs at a time.

    .venv/bin/python benchmarks/bench_demo_recipes.py                     # 3 seeds, every variant
    .venv/bin/python benchmarks/bench_demo_recipes.py --seeds 0 1 2 3 4 --out demo.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "gdpo": ("gdpo", {}),
    "gdpo + condition": ("gdpo", {"condition": {"length": "correct >= 1"}}),
    "grpo + condition": ("grpo", {"condition": {"length": "correct >= 1"}}),
    "gdpo + channel_start": ("gdpo", {"channel_start": {"length": 50}}),
}
"""name -> (--algo, extra --config keys). ``condition``: `length` counts only where `correct` passes."""


def run_one(root: Path, name: str, seed: int) -> dict[str, Any]:
    algo, extra = VARIANTS[name]
    slug = name.replace(" + ", "-").replace("_", "-")
    out = root / f"{slug}-{seed}"
    config = root / f"{slug}-{seed}.json"
    config.write_text(json.dumps(extra))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "collapse_doctor"]
    train = [*cli, "retrain", "--demo", "--algo", algo, "--seed", str(seed), "--output-dir", str(out)]
    if extra:
        train += ["--config", str(config)]
    done = subprocess.run(train, capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{name} seed {seed}: retrain exited {done.returncode}: {done.stderr[-2000:]}")
    scan_json = out / "scan.json"
    subprocess.run(
        [*cli, "scan", str(out / "rollouts"), "--json", str(scan_json), "--fail-on", "never"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(scan_json.read_text())
    table = pq.read_table(out / "rollouts").to_pandas()
    length = "raw_reward/length" if "raw_reward/length" in table else "reward/length"
    per_step = table.groupby("step")[["reward/correct", length]].mean()
    correct = per_step["reward/correct"].to_numpy()
    return {
        "variant": name,
        "seed": seed,
        "final_correct": float(correct[-20:].mean()),
        "correct_rolling": np.convolve(correct, np.ones(10) / 10, mode="valid").tolist(),
        "final_length": float(per_step[length].to_numpy()[-20:].mean()),
        "verdict": result["verdict"],
        "findings": sorted(
            {
                f"{f['code']} {f['severity']}" + (f" {','.join(f['channels'])}" if f["channels"] else "")
                for f in result["findings"]
            }
        ),
    }


def steps_to(rolling: list[float], level: float) -> int | None:
    """The last step of the first 10-step window whose mean reaches ``level``."""
    for i, value in enumerate(rolling):
        if value >= level:
            return i + 9
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--level", type=float, default=0.2, help="correct level for 'steps to reach'")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cd-demo-recipes-") as tmp:
        jobs = [(name, seed) for name in args.variants for seed in args.seeds]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(lambda job: run_one(Path(tmp), *job), jobs))
    lines = [
        f"| variant | final `correct` (last 20 steps; per seed {', '.join(map(str, args.seeds))}) | mean | "
        f"steps to `correct` >= {args.level:g} (10-step mean) | final `length` (raw) | scan verdicts |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.variants:
        mine = [r for r in runs if r["variant"] == name]
        finals = [r["final_correct"] for r in mine]
        reach = [steps_to(r["correct_rolling"], args.level) for r in mine]
        lines.append(
            f"| {name} | {' / '.join(f'{v:.2f}' for v in finals)} | {statistics.mean(finals):.2f} | "
            f"{' / '.join('-' if s is None else str(s) for s in reach)} | "
            f"{statistics.mean(r['final_length'] for r in mine):.2f} | "
            f"{' / '.join(r['verdict'] for r in mine)} |"
        )
    lines.append("")
    for r in runs:
        lines.append(f"- {r['variant']} seed {r['seed']}: {r['verdict']}; {', '.join(r['findings']) or 'no finding'}")
    report = "\n".join(lines)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
