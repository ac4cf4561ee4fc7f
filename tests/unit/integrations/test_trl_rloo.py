"""``CollapseDoctorCallback`` on a plain ``trl.RLOOTrainer`` (CPU, the tiny model built in code, a few steps).

What a correct diagnosis says, and why:

- beta 0: TRL's advantage is ``t_i - mean of the other completions of the prompt`` (t: the weighted reward sum),
  which is ``n / (n - 1) * (t_i - group mean)``: the scan recomputes it (``rloo``) and names the run ``rloo``; the
  logged values match, so there is no CD202 of any kind.
- ``normalize_advantages=True``: the same advantages z-scored over the batch: ``rloo`` again, variant
  ``RLOO (TRL, normalize_advantages)``.
- beta != 0 (TRL's default 0.05): TRL subtracts ``beta * KL`` per completion from the reward first. The rows do not
  carry the KL, so nothing can check those advantages: they are kept as ``advantage_with_kl``, CD202 is skipped,
  the run is named ``rloo`` from the metadata the callback writes (nothing to fingerprint)
  (never a mismatch warning on a healthy run) and the callback says why once.
- A GRPO run with ``scale_rewards="none"`` (``t_i - group mean``) differs from RLOO by the factor n/(n-1): each is
  named for its own estimator, never the other's (the tolerance is absolute and far below that factor's effect).

The callback's final diagnosis equals ``scan`` of the rollouts it wrote. Expected advantages come from what TRL's
loss received (a spy), never from the callback's own numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from trl import RLOOTrainer

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.integrations.trl import CollapseDoctorCallback
from tests.unit.integrations.tiny_trainer import (
    CHANNELS,
    GROUP,
    WEIGHTS,
    make_trainer,
    train,
    train_recording_loss_advantages,
)

pytestmark = pytest.mark.slow

STEPS = 6


def rollouts(out: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(out / "rollouts")
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


def answer(d: Any) -> dict[str, Any]:
    return {
        "verdict": d.verdict,
        "signal": d.run.signal,
        "algorithm": (d.run.algorithm, d.run.algorithm_source),
        "weights": (d.run.weights, d.run.weights_source),
        "sizes": (d.run.steps, d.run.rollouts, d.run.groups),
        "findings": [(f.code, f.severity, f.channels, f.onset_step, f.step_range, f.title) for f in d.findings],
        "skipped": d.skipped,
    }


class Run:
    def __init__(self, out: Path, **config: Any) -> None:
        self.out = out
        self.printed: list[str] = []
        self.loss_advantages: list[torch.Tensor] = []
        self.callback = CollapseDoctorCallback(write_every=3, print_finding=self.printed.append, check_budget=1.0)
        self.trainer = make_trainer(out, steps=STEPS, callbacks=[self.callback], rloo=True, **config)

    def train(self) -> Run:
        assert isinstance(self.trainer, RLOOTrainer)
        self.loss_advantages = train_recording_loss_advantages(self.trainer)
        return self

    def scan(self) -> Any:
        from collapse_doctor.pipeline.scan import diagnose

        return diagnose([self.out / "rollouts"], ScanOptions())


@pytest.fixture(scope="module")
def rloo(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("rloo") / "out", beta=0.0).train()


def test_rloo_rollouts_hold_what_the_loss_received(rloo: Run) -> None:
    rows = rollouts(rloo.out)
    assert sorted(set(rows["step"].tolist())) == list(range(1, STEPS + 1))
    assert len(rloo.loss_advantages) == STEPS
    for step, used in enumerate(rloo.loss_advantages, start=1):
        np.testing.assert_array_equal(np.sort(used.numpy()), np.sort(rows["advantage"][rows["step"] == step]))
    # TRL's formula from the written rewards, numpy loop by loop: t_i minus the mean of the group's others
    for step in range(1, STEPS + 1):
        at = rows["step"] == step
        rewards = np.stack([rows[f"reward/{c}"][at] for c in CHANNELS], axis=1).astype(np.float64)
        total = np.nansum(rewards * np.asarray(WEIGHTS), axis=1)
        expected = [
            total[i] - (total[g * GROUP : (g + 1) * GROUP].sum() - total[i]) / (GROUP - 1)
            for g in range(len(total) // GROUP)
            for i in range(g * GROUP, (g + 1) * GROUP)
        ]
        np.testing.assert_allclose(rows["advantage"][at], expected, atol=1e-5)
    assert np.abs(rows["advantage"]).max() > 0.1, "some groups carry signal"


def test_rloo_run_is_named_rloo_with_no_cd202(rloo: Run) -> None:
    scanned = rloo.scan()
    assert scanned.run.algorithm == "rloo", scanned.run.algorithm_source
    assert scanned.run.algorithm_source == "logged advantages match RLOO (verl loop)"
    assert float(np.nanmax(scanned.series["logged_mae_rloo"])) < 1e-5
    assert "CD202" not in {f.code for f in scanned.findings}
    assert scanned.run.weights == dict(zip(CHANNELS, WEIGHTS, strict=True))
    live = rloo.callback.diagnosis
    assert live is not None and answer(live) == answer(scanned), "one run, one answer"


def test_rloo_scalars_reach_the_trainers_logger(rloo: Run) -> None:
    logged = [e for e in rloo.trainer.state.log_history if "collapse_doctor/rel_gain/graded" in e]
    assert logged and all("collapse_doctor/zero_advantage_share" in e for e in logged)
    assert "collapse_doctor/aggregation_gdpo" in logged[0] and logged[0]["collapse_doctor/aggregation_gdpo"] == 0.0


def test_grpo_without_scaling_is_not_rloo_and_rloo_is_not_grpo(rloo: Run, tmp_path: Path) -> None:
    """RLOO's advantages are GRPO-without-scaling's times n/(n-1) = 4/3: an absolute tolerance of 0.01 is far
    below that difference on these rewards, each way."""
    from collapse_doctor.pipeline.scan import diagnose

    rloo_scan = rloo.scan()
    assert float(np.nanmean(rloo_scan.series["logged_mae_grpo_none"])) > 0.05
    callback = CollapseDoctorCallback(write_every=3, print_finding=None, check_budget=1.0)
    train(make_trainer(tmp_path / "grpo", steps=3, callbacks=[callback], scale_rewards="none"))
    grpo = diagnose([tmp_path / "grpo" / "rollouts"], ScanOptions())
    assert (grpo.run.algorithm, grpo.run.algorithm_source) == ("grpo", "logged advantages match GRPO (scale none)")
    assert "CD202" not in {f.code for f in grpo.findings}
    # GRPO matched within 0.001, so the scan compared no other estimator (their series left out): RLOO by hand
    assert "logged_mae_rloo" not in grpo.series
    from collapse_doctor.engine.estimators import EstimatorRows
    from collapse_doctor.engine.estimators import rloo as rloo_advantages

    table = pq.read_table(tmp_path / "grpo" / "rollouts").to_pandas()
    rewards = table[[f"reward/{c}" for c in CHANNELS]].to_numpy()
    group = table["step"].to_numpy() * 1000 + table["group_id"].to_numpy()
    rows = EstimatorRows(rewards, np.array(WEIGHTS), group, table["step"].to_numpy())
    assert float(np.mean(np.abs(table["advantage"].to_numpy() - rloo_advantages(rows)))) > 0.05


def test_normalized_rloo_is_its_trl_variant(tmp_path: Path) -> None:
    run = Run(tmp_path / "out", beta=0.0, normalize_advantages=True).train()
    scanned = run.scan()
    assert (scanned.run.algorithm, scanned.run.algorithm_source) == (
        "rloo",
        "logged advantages match RLOO (TRL, normalize_advantages)",
    )
    assert "CD202" not in {f.code for f in scanned.findings}


def test_rloo_with_a_kl_penalty_is_not_checked_and_not_flagged(tmp_path: Path) -> None:
    run = Run(tmp_path / "out").train()  # TRL's default beta 0.05
    assert run.trainer.beta == pytest.approx(0.05)
    rows = rollouts(run.out)
    assert "advantage" not in rows and "advantage_with_kl" in rows
    for step, used in enumerate(run.loss_advantages, start=1):
        np.testing.assert_array_equal(np.sort(used.numpy()), np.sort(rows["advantage_with_kl"][rows["step"] == step]))
    scanned = run.scan()
    assert "CD202" not in {f.code for f in scanned.findings}
    assert "CD202" in scanned.skipped
    # nothing to fingerprint: the run is RLOO as the callback declared it in the rollouts' metadata
    assert scanned.run.algorithm == "rloo" and "metadata" in scanned.run.algorithm_source
    said_by_scan = [w for w in scanned.run.warnings if "advantage_with_kl" in w]
    assert len(said_by_scan) == 1 and "not compared" in said_by_scan[0]
    said = [line for line in run.printed if "beta=0.05" in line]
    assert len(said) == 1 and "advantage_with_kl" in said[0] and "not checked" in said[0]
    live = run.callback.diagnosis
    assert live is not None and answer(live) == answer(scanned)


def test_fail_on_stops_an_rloo_run(tmp_path: Path) -> None:
    printed: list[str] = []
    callback = CollapseDoctorCallback(fail_on="info", write_every=1, print_finding=printed.append, check_budget=1.0)
    trainer = make_trainer(tmp_path / "out", steps=10, callbacks=[callback], rloo=True, beta=0.0)
    train(trainer)
    assert callback.stopped_by, "the tiny run has findings"
    stopped = trainer.state.global_step
    assert stopped < 10
    assert any(line.startswith(f"collapse-doctor: stopping training after step {stopped}") for line in printed)
    assert sorted(set(rollouts(tmp_path / "out")["step"].tolist())) == list(range(1, stopped + 1))
