"""CD202 and the remedies follow the algorithm the run used (GRPO, GDPO, gdpo-dynamic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.engine.advantages import dynamic_gdpo_advantages, gdpo_advantages, grpo_advantages
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs
from tests.helpers.paths import SAMPLE_LOGS

STEPS, GROUPS, SIZE = 60, 16, 8


def _rewards(seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Two binary channels with high pass rates: many constant groups, so batch re-normalisation inflates |A|."""
    rng = np.random.default_rng(seed)
    step, group = runs._frame(STEPS, GROUPS, SIZE)
    n = len(step)
    difficulty = np.repeat(rng.normal(0, 0.5, STEPS * GROUPS), SIZE)
    channels = {}
    for name, rate in (("format", 0.9), ("correct", 0.85)):
        logit = np.log(rate / (1 - rate)) - difficulty + rng.normal(0, 0.3, n)
        channels[f"reward/{name}"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return step, group, channels


def _per_step(step: np.ndarray, group: np.ndarray, rewards: np.ndarray, advantage) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.empty(len(step), dtype=np.float32)
    for s in np.unique(step):
        rows = step == s
        out[rows] = advantage(int(s), torch.from_numpy(rewards[rows]), torch.from_numpy(group[rows])).numpy()
    return out


def _logged_run(path: Path, algorithm: str) -> Path:
    step, group, channels = _rewards()
    rewards = np.stack(list(channels.values()), axis=1)
    columns: dict[str, np.ndarray] = {"step": step, "group_id": group, **channels}
    if algorithm == "gdpo":
        logged = _per_step(step, group, rewards, lambda s, r, g: gdpo_advantages(r, g))
    elif algorithm == "grpo_batch":
        logged = _per_step(step, group, rewards, lambda s, r, g: grpo_advantages(r, g, scale="batch"))
    else:  # gdpo-dynamic: weights change every step, as collapse-doctor retrain logs them
        weights = np.stack([0.3 + 0.4 * (step % 7) / 6, 0.7 - 0.4 * (step % 7) / 6], axis=1).astype(np.float32)
        logged = _per_step(
            step,
            group,
            rewards,
            lambda s, r, g: dynamic_gdpo_advantages(r, g, weights=torch.from_numpy(weights[step == s][0])),
        )
        columns["weight/format"], columns["weight/correct"] = weights[:, 0], weights[:, 1]
    columns["advantage"] = logged
    return runs.write(path, columns)


def _beyond_bound_share(path: Path) -> float:
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    return float(np.nanmean(diagnosis.series["logged_beyond_bound_share"]))


def test_cd202_is_silent_on_gdpo_logged_advantages(tmp_path: Path) -> None:
    path = _logged_run(tmp_path / "gdpo.parquet", "gdpo")
    assert _beyond_bound_share(path) > 0.01  # GDPO exceeds the group bound here, by design
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.algorithm == "gdpo"
    assert "CD202" not in {f.code for f in diagnosis.findings}
    assert "CD202" not in {f.code for f in diagnose([path], ScanOptions.of(device="cpu", algo="gdpo")).findings}


def test_cd202_is_silent_on_batch_scaled_grpo(tmp_path: Path) -> None:
    path = _logged_run(tmp_path / "batch.parquet", "grpo_batch")
    assert _beyond_bound_share(path) > 0.01
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.algorithm_source == "logged advantages match GRPO (scale batch)"
    assert "CD202" not in {f.code for f in diagnosis.findings}


def test_cd202_flags_inflated_grpo_advantages(tmp_path: Path) -> None:
    path = runs.logged_beyond_bound_run(tmp_path / "bound.parquet")
    for algo in ("auto", "grpo"):
        titles = {
            f.title for f in diagnose([path], ScanOptions.of(device="cpu", algo=algo)).findings if f.code == "CD202"
        }
        assert titles == {
            "logged advantages exceed the group z-score bound",
            "logged advantages match no recomputation",
        }


def test_cd202_says_dynamic_weights_were_used(tmp_path: Path) -> None:
    path = _logged_run(tmp_path / "dynamic.parquet", "gdpo-dynamic")
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    assert diagnosis.run.algorithm == "gdpo"
    assert diagnosis.run.algorithm_source.startswith("dynamic channel weights")
    cd202 = [f for f in diagnosis.findings if f.code == "CD202"]
    assert [(f.severity, f.title) for f in cd202] == [(Severity.INFO, "logged advantages use dynamic channel weights")]
    assert "gdpo-dynamic" in cd202[0].message
    assert cd202[0].evidence["dynamic_weight_channels"] == ["format", "correct"]


def test_remedies_follow_the_algorithm(tmp_path: Path) -> None:
    """saturating-format: under GRPO, `format` drowns `correct` while it saturates (CD402) and GDPO's advantages do
    not show that, so GRPO is told to switch; judged as GDPO, nothing proposes switching (GDPO's counterfactual is
    GRPO, and the tool never proposes going back), and CD101 (a saturated channel) proposes no aggregation."""
    path = runs.simulated(tmp_path / "sat.parquet", "saturating-format")
    grpo = {f.code: f for f in diagnose([path], ScanOptions.of(device="cpu", algo="grpo")).findings}
    gdpo = {f.code: f for f in diagnose([path], ScanOptions.of(device="cpu", algo="gdpo")).findings}
    assert grpo["CD402"].gdpo_resolves is True and "normalize_then_sum" in grpo["CD402"].remedy
    assert "CD402" not in gdpo
    assert grpo["CD101"].gdpo_resolves is False and "gdpo" not in grpo["CD101"].remedy.lower()
    for code, finding in gdpo.items():
        assert "switch to GDPO" not in finding.remedy, code
        assert "\n" not in finding.remedy


def test_outlier_groups_are_judged_under_the_runs_own_aggregation() -> None:
    sample = SAMPLE_LOGS / "outlier-groups.parquet"

    def outlier_finding(algo: str):  # type: ignore[no-untyped-def]
        found = [
            f
            for f in diagnose([sample], ScanOptions.of(algo=algo, device="cpu")).findings
            if f.title.startswith("outlier")
        ]
        assert len(found) == 1
        return found[0]

    grpo, gdpo = outlier_finding("grpo"), outlier_finding("gdpo")
    assert grpo.severity >= Severity.WARNING and "squeezed" in grpo.message
    # GDPO's per-channel normalisation keeps the rest of those groups apart (std 0.76 >= 0.5): only informational.
    assert gdpo.evidence["rest_advantage_std_gdpo"] >= 0.5
    assert gdpo.severity == Severity.INFO and "keep an advantage spread" in gdpo.message
    assert grpo.evidence["outlier_group_share"] == gdpo.evidence["outlier_group_share"] > 0.05
