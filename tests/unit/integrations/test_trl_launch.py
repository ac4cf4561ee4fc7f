"""The callback under ``torchrun`` with 2 CPU processes: gathered rollouts, one writer, one stop step."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("trl")

from tests.helpers.paths import ROOT
from tests.unit.integrations.tiny_trainer import two_processes

pytestmark = pytest.mark.slow


def test_two_processes_agree_on_the_stop(tmp_path: Path) -> None:
    command = two_processes("tests.unit.integrations.launch_callback", str(tmp_path))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(2)]
    assert ranks[0]["error"] is None and ranks[1]["error"] is None
    # the main process found the findings; both stopped at the end of the same step, before max_steps
    assert ranks[0]["stopped_by"] and 0 < ranks[0]["step"] == ranks[1]["step"] < 12
    assert ranks[0]["files_written"] == ranks[0]["step"] and ranks[1]["files_written"] == 0
    assert (tmp_path / f"checkpoint-{ranks[0]['step']}").is_dir()
    steps = pq.read_table(tmp_path / "rollouts").column("step").to_numpy()
    # each step holds both processes' completions (2 x 2 prompts x 4), written once
    assert np.bincount(steps).tolist() == [0] + [16] * ranks[0]["step"], "TRL's steps 1..N"
