"""The scalar detectors on a series read in step buckets: non-finite points counted from the buckets' counts,
spikes and bounds judged on the buckets' extremes (a lone spike is not averaged away in its bucket)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core import fold
from collapse_doctor.core.options import ScanOptions
from tests.helpers.scalar_runs import scalar_event, write_raw

STEPS = 4000


def _scan(directory: Path, grad_norm: np.ndarray) -> dict[str, dict]:
    rng = np.random.default_rng(0)
    reward = 0.5 + 0.01 * rng.standard_normal(STEPS)
    payloads = []
    for step in range(STEPS):
        payloads.append(scalar_event("train/reward", float(reward[step]), step, float(step)))
        payloads.append(scalar_event("train/grad_norm", float(grad_norm[step]), step, float(step)))
    write_raw(directory / "events.out.tfevents.1.host", payloads)
    diagnosis = diagnose([directory], ScanOptions(device="cpu"))
    assert any("points read as" in note for note in diagnosis.run.warnings)
    return {f.evidence["kind"]: f.evidence for f in diagnosis.findings if f.code == "CD509"}


@pytest.fixture(autouse=True)
def _small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold, "FOLD_CAP", 256)  # 4,000 steps: 250 buckets of 16


def test_non_finite_gradient_norms_are_counted_point_by_point(tmp_path: Path) -> None:
    norms = 0.3 * (1 + 0.1 * np.random.default_rng(1).standard_normal(STEPS))
    norms[[100, 101, 2000]] = np.nan
    norms[3000] = np.inf
    found = _scan(tmp_path, norms)["non-finite"]
    assert (found["nonfinite_points"], found["nan_points"], found["inf_points"], found["points"]) == (4, 3, 1, STEPS)


def test_lone_gradient_norm_spikes_survive_their_buckets(tmp_path: Path) -> None:
    norms = 0.3 * (1 + 0.05 * np.random.default_rng(2).standard_normal(STEPS))
    spikes = np.arange(150, STEPS, 400)
    norms[spikes] = 30.0  # 100x, one step in a bucket of 16: its mean would be 7x, its maximum is 100x
    found = _scan(tmp_path, norms)["spikes"]
    assert found["spikes"] == len(spikes) and found["largest_ratio"] > 50
