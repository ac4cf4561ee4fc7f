"""``torchrun -m collapse_doctor retrain`` with 2 CPU processes: gathered rollouts, one writer, parity."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from collapse_doctor.engine.advantages import dynamic_gdpo_advantages
from tests.helpers.paths import ROOT
from tests.unit.integrations.tiny_trainer import two_processes

pytestmark = pytest.mark.slow
CHANNELS = ("format", "correct", "length")


def test_two_cpu_processes(tmp_path: Path) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"group_size": 4, "batch_size_prompts": 4, "learning_rate": 0.01}))
    out = tmp_path / "run"
    command = two_processes(
        "collapse_doctor",
        "retrain",
        "--algo",
        "gdpo-dynamic",
        "--demo",
        "--demo-task",
        "sums",
        "--config",
        str(config),
        "--max-steps",
        "3",
        "--max-completion-length",
        "6",
        "--write-every",
        "2",
        "--save-steps",
        "2",
        "--output-dir",
        str(out),
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    table = pq.read_table(out / "rollouts").to_pandas()
    # each step holds both processes' completions (4 prompts x 4), written once by the main process
    assert table.groupby("step").size().to_dict() == {1: 16, 2: 16, 3: 16}
    for _, rows in table.groupby("step"):
        rewards = torch.tensor(rows[[f"reward/{c}" for c in CHANNELS]].to_numpy(), dtype=torch.float32)
        weights = torch.tensor(rows[[f"weight/{c}" for c in CHANNELS]].iloc[0].to_numpy(), dtype=torch.float32)
        expected = dynamic_gdpo_advantages(rewards, torch.arange(len(rows)) // 4, weights=weights)
        np.testing.assert_allclose(expected.numpy(), rows["advantage"].to_numpy(), atol=1e-5)
    assert (out / "checkpoint-2" / "collapse_doctor_dynamic_weights.json").is_file()
