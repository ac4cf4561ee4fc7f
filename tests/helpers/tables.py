"""Canonical rollout tables built in code, and a probe of what the CLI imports."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

WriteTable = Callable[..., Path]


def make_table(
    *,
    steps: int = 3,
    groups: int = 4,
    group_size: int = 8,
    channels: tuple[str, ...] = ("format", "correct"),
    seed: int = 0,
    text: bool = True,
) -> pa.Table:
    """A small canonical rollout table: binary first channel, continuous others."""
    rng = np.random.default_rng(seed)
    n = steps * groups * group_size
    columns: dict[str, object] = {
        "step": np.repeat(np.arange(steps, dtype=np.int64), groups * group_size),
        "group_id": np.tile(np.repeat(np.arange(groups, dtype=np.int64), group_size), steps),
    }
    for k, name in enumerate(channels):
        values = rng.integers(0, 2, n) if k == 0 else rng.random(n)
        columns[f"reward/{name}"] = values.astype(np.float32)
    if text:
        columns["prompt"] = [f"prompt {s}-{g}" for s, g in zip(columns["step"], columns["group_id"], strict=True)]
        columns["completion"] = [f"completion {i}" for i in range(n)]
    return pa.table(columns)


def modules_imported_by_cli(*calls: Sequence[str], packages: Sequence[str]) -> list[str]:
    """The modules of ``packages`` a fresh interpreter has imported after running each CLI call (each must exit 0).

    A subprocess, so the modules the test session itself imported do not count.
    """
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from collapse_doctor.cli.app import app\n"
        f"for args in {[list(call) for call in calls]!r}:\n"
        "    r = CliRunner().invoke(app, args)\n"
        "    assert r.exit_code == 0, r.output\n"
        f"print(json.dumps([m for m in sorted(sys.modules) if m.split('.')[0] in {tuple(packages)!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))
