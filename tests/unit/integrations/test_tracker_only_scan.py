"""A tracker's files alone give the channel checks' answer of the rollouts (issue 25: one run, one answer).

Real TRL runs (tests/unit/integrations/tracker_run.py) with ``CollapseDoctorCallback``, reporting to TensorBoard and
to an MLflow file store; each is scanned three ways: its rollouts (what the callback wrote), the TensorBoard events of
``report_to`` alone, the MLflow store alone.

What a correct diagnosis says, from the rewards' definitions:

- ``always`` is 1 for every completion: constant at its maximum in every group from the first step, CD101 info
  (saturated), under either aggregation.
- Under GRPO (sum, then normalise in the group) ``coin`` (0 or 1: within-group variance about 0.25 * 4/3) holds about
  99% of the variance of the sum against ``fine`` (spread 0.1: variance about 0.001) and decides most advantage
  signs: CD402 warning, ``coin`` drowns ``fine``. The rollouts recompute GDPO, where each channel has unit spread
  and ``coin``'s share is about 1/2, below the 0.8 limit: the finding says GDPO resolves it. The trackers hold the
  run's own aggregation only: the same finding, its counterfactual not computed, no switch proposed.
- Under GDPO (normalise each channel, then sum) ``coin``'s share is about 1/2 (``fine`` is as loud after its own
  normalisation): no CD402 from any source.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("mlflow")

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.io.open import read_scalar_log
from collapse_doctor.judge.budget import steps_at_extreme
from collapse_doctor.judge.logged_channels import callback_channel_series
from collapse_doctor.pipeline.scan import plan_scan
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow

CHANNEL_CHECKS = ("CD101", "CD402")


def _trained(tmp_path_factory: pytest.TempPathFactory, aggregation: str) -> Path:
    out = tmp_path_factory.mktemp(aggregation) / "out"
    command = [sys.executable, "-m", "tests.unit.integrations.tracker_run", str(out), aggregation]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trained(tmp_path_factory, "sum_then_normalize")


@pytest.fixture(scope="module")
def gdpo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trained(tmp_path_factory, "normalize_then_sum")


def _scan(path: Path) -> Any:
    return diagnose([path], ScanOptions.of(device="cpu"))


def _sources(out: Path) -> dict[str, Any]:
    """The rollouts, the TensorBoard events of ``report_to``, the MLflow file store: each scanned alone."""
    (events,) = (out / "runs").iterdir()
    return {"rollouts": _scan(out / "rollouts"), "tensorboard": _scan(events), "mlflow": _scan(out / "mlruns")}


def _channel_findings(diagnosis: Any) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(f.code, f.severity.label, f.channels) for f in diagnosis.findings if f.code in CHANNEL_CHECKS}


def test_a_grpo_run_gets_the_rollouts_channel_findings_from_each_tracker(grpo: Path) -> None:
    scans = _sources(grpo)
    expected = {("CD101", "info", ("always",)), ("CD402", "warning", ("coin", "fine"))}
    for source, diagnosis in scans.items():
        assert _channel_findings(diagnosis) == expected, source
        assert diagnosis.verdict == "at_risk", source
    rollouts = scans["rollouts"]
    dominant = next(f for f in rollouts.findings if f.code == "CD402")
    assert dominant.gdpo_resolves is True and "switch to GDPO" in str(dominant.remedy)
    for source in ("tensorboard", "mlflow"):
        diagnosis = scans[source]
        assert diagnosis.run.algorithm == "grpo" and diagnosis.run.channel_series == "callback scalars"
        assert diagnosis.coverage()["sources"] == "a scalar log with the callback's channel series"
        assert not {"CD101", "CD402"} & set(diagnosis.skipped)
        found = next(f for f in diagnosis.findings if f.code == "CD402")
        assert found.gdpo_resolves is None  # not computed: nothing was recomputed
        assert "switch to GDPO" not in str(found.remedy) and "scan the rollouts" in str(found.remedy)
        assert "was not computed" in found.message
        assert found.evidence["variance_share_grpo"] > 0.9  # about 99% (the module docstring)
        assert found.onset_step <= 2  # the first logged point covers steps 1-2


def test_a_gdpo_run_raises_no_dominance_from_any_source(gdpo: Path) -> None:
    for source, diagnosis in _sources(gdpo).items():
        assert _channel_findings(diagnosis) == {("CD101", "info", ("always",))}, source
        assert diagnosis.run.algorithm == "gdpo", source


def test_the_callbacks_per_step_series_are_the_rollouts(grpo: Path) -> None:
    """The callback's own TensorBoard events (one point per step) rebuild the very series scan computes from the
    rollouts it wrote: every statistic the channel checks read, at every step."""
    plan = plan_scan([grpo / "tensorboard"], ScanOptions.of(device="cpu"))
    rebuilt = callback_channel_series(read_scalar_log(plan.runs[0]), "grpo")
    assert rebuilt is not None
    scanned = _scan(grpo / "rollouts").series
    assert rebuilt.steps.tolist() == scanned.steps.tolist() == list(range(1, 25))
    assert rebuilt.channels == scanned.channels
    for name in (
        "rel_gain",
        "channel_zero_var_share",
        "signal_share_grpo",
        "dominance_grpo",
        "channel_groups",
        "reward_min",
        "reward_max",
        "reward_std",
    ):
        np.testing.assert_allclose(rebuilt[name], scanned[name], rtol=1e-6, atol=1e-7, err_msg=name)
    for how in ("max", "min"):  # the groups at the run's extremes, as channel_extreme_shares counts them
        counted = np.where(steps_at_extreme(scanned, how), scanned[f"channel_at_{how}_groups"], 0.0)
        np.testing.assert_allclose(rebuilt[f"channel_at_{how}_groups"], counted, atol=1e-7, err_msg=how)
    scored = scanned["channel_rows"] / scanned["valid_rows"][:, None]
    np.testing.assert_allclose(rebuilt["channel_rows"], scored, rtol=1e-6)
