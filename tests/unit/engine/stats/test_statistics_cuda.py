"""The statistics on CUDA (torch's general path) equal those on the CPU (the NumPy dense path, torch's general
path), and a scan on CUDA reaches the CPU scan's diagnosis."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import ChunkInput, step_statistics
from tests.helpers.paths import ROOT as REPO_ROOT
from tests.helpers.stats_cases import make_case
from tests.unit.engine.stats.test_completions import made_up_completions, with_completions
from tests.unit.engine.stats.test_paths import EXACT

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = REPO_ROOT


def _on(chunk: ChunkInput, device: str) -> ChunkInput:
    """The chunk's rows on ``device``, with the advantages recomputed there."""
    r, gi, si, w = (t.to(device) for t in (chunk.rewards, chunk.group_index, chunk.step_index, chunk.weights))
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    logged = chunk.logged.to(device) if chunk.logged is not None else None
    return ChunkInput(r, gi, si, w, adv, chunk.num_groups, chunk.num_steps, logged, chunk.completions)


@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("layout", ["dense", "messy"])
def test_cuda_statistics_match_the_cpu(layout: str, text: bool) -> None:
    case = make_case(layout, channels=3, logged=True)
    if text:  # completion codes and lengths stay NumPy arrays on the host
        case = with_completions(case, *made_up_completions(case))
    cpu = step_statistics(_on(case.chunk, "cpu"))
    gpu = step_statistics(_on(case.chunk, "cuda"))
    assert list(gpu) == list(cpu)
    for key in EXACT:
        if key in cpu:
            np.testing.assert_array_equal(gpu[key], cpu[key], err_msg=key)
    for key in cpu:
        np.testing.assert_allclose(gpu[key], cpu[key], rtol=2e-5, atol=1e-6, equal_nan=True, err_msg=key)


@pytest.mark.parametrize("sample", ["healthy.parquet", "saturating-format.parquet", "tied-sums.parquet"])
def test_a_cuda_scan_reaches_the_cpu_diagnosis(sample: str) -> None:
    runner = CliRunner()
    out = {}
    for device in ("cpu", "cuda"):
        done = runner.invoke(app, ["scan", str(ROOT / "sample_logs" / sample), "--format", "json", "--device", device])
        assert done.exit_code in (0, 1), done.output
        out[device] = json.loads(done.stdout)
    cpu, gpu = out["cpu"], out["cuda"]
    assert gpu["verdict"] == cpu["verdict"]
    assert [(f["code"], f["severity"], f.get("onset_step")) for f in gpu["findings"]] == [
        (f["code"], f["severity"], f.get("onset_step")) for f in cpu["findings"]
    ]
