"""``CollapseDoctorCallback`` on a plain ``trl.GRPOTrainer`` (CPU, the tiny model built in code, a few steps).

The expected values come from what TRL itself did (a spy on the loss's inputs, the reward functions' own
returns) and from numpy over the rollout files, never from the callback's own numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")


from collapse_doctor.integrations import trl as integration
from collapse_doctor.integrations.trl import CollapseDoctorCallback, CollapseDoctorWarning, attach
from tests.unit.integrations.tiny_trainer import (
    CHANNELS,
    GROUP,
    WEIGHTS,
    RewardSpy,
    make_trainer,
    train,
    train_recording_loss_advantages,
)

pytestmark = pytest.mark.slow


def rollouts(out: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(out / "rollouts")
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


class Run:
    """One monitored run, shared by the tests that only read what it wrote."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.loss_advantages: list[torch.Tensor] = []
        self.rewards = RewardSpy()
        self.printed: list[str] = []
        self.callback = CollapseDoctorCallback(write_every=4, print_finding=self.printed.append, check_budget=1.0)
        # log_completions as users set it beside the callback: TRL's completions/ and the callback's rollouts/
        self.trainer = make_trainer(out, steps=8, callbacks=[self.callback], spy=self.rewards, log_completions=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    done = Run(tmp_path_factory.mktemp("callback") / "out")
    done.loss_advantages = train_recording_loss_advantages(done.trainer)
    return done


def test_advantages_are_what_the_loss_received(run: Run) -> None:
    rows = rollouts(run.out)
    assert sorted(set(rows["step"].tolist())) == list(range(1, 9)), "TRL's steps: the first batch trains step 1"
    assert len(run.loss_advantages) == 8
    for step, used in enumerate(run.loss_advantages, start=1):
        logged = np.sort(rows["advantage"][rows["step"] == step])
        # the loss sees each batch shuffled; as sets they are the same values, to float32 exactness
        np.testing.assert_array_equal(np.sort(used.numpy()), logged)
    assert np.abs(rows["advantage"]).max() > 0.1, "some groups carry signal"


def test_rewards_are_what_the_reward_functions_returned(run: Run) -> None:
    rows = rollouts(run.out)
    for channel in CHANNELS:
        returned = run.rewards.returned[channel]
        assert len(returned) == 8
        for step, values in enumerate(returned, start=1):
            expected = np.array([np.nan if v is None else v for v in values], dtype=np.float32)
            np.testing.assert_array_equal(rows[f"reward/{channel}"][rows["step"] == step], expected)
    assert np.isnan(rows["reward/sometimes"]).any(), "the None convention is exercised"
    assert rows["group_id"][:8].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert set(np.unique(rows["completion_length"])) <= set(range(7))


def test_cut_completions_are_flagged_as_trl_counts_them(run: Run) -> None:
    """`truncated` marks the completions generation cut at max_completion_length (6 tokens, the last neither EOS nor
    padding: TRL's rule): never a shorter one, and over the run the same share as TRL's own
    `completions/clipped_ratio` (logged every 2 steps as the mean of its steps, which hold equal batches, so the mean
    of the logged values is the run's share)."""
    rows = rollouts(run.out)
    cut = rows["truncated"].astype(bool)
    assert not cut[rows["completion_length"] < 6].any()
    logged = [h["completions/clipped_ratio"] for h in run.trainer.state.log_history if "completions/clipped_ratio" in h]
    assert len(logged) == 4
    assert abs(float(cut.mean()) - float(np.mean(logged))) < 1e-6


def _rel_gain(values: np.ndarray) -> float:
    """Mean over groups with two or more values of the within-group range (the definition in DESIGN.md)."""
    spans = []
    for group in values.reshape(-1, GROUP):
        valid = group[~np.isnan(group)]
        if len(valid) >= 2:
            spans.append(valid.max() - valid.min())
    return float(np.mean(spans))


def _signal_shares(rows: dict[str, np.ndarray], step: int) -> np.ndarray:
    """Each channel's part of the within-group variance of the weighted total (GRPO), NaN rewards left out."""
    at = rows["step"] == step
    rewards = np.stack([rows[f"reward/{c}"][at] for c in CHANNELS], axis=1).astype(np.float64)
    weights = np.asarray(WEIGHTS)
    total = np.nansum(rewards * weights, axis=1).reshape(-1, GROUP)
    dev_total = (total - total.mean(axis=1, keepdims=True)).reshape(-1)
    grouped = rewards.reshape(-1, GROUP, len(CHANNELS))
    dev = np.nan_to_num(grouped - np.nanmean(grouped, axis=1, keepdims=True)).reshape(-1, len(CHANNELS))
    return np.asarray((weights * dev * dev_total[:, None]).sum(axis=0) / (dev_total**2).sum())


def test_scalars_reach_the_trainers_logger(run: Run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = rollouts(run.out)
    logged = [entry for entry in run.trainer.state.log_history if "collapse_doctor/rel_gain/graded" in entry]
    # parts every 4 steps, trainer logs every 2: the log after each part carries the means of its 4 steps
    assert [entry["step"] for entry in logged] == [4, 8]
    for entry, steps in zip(logged, (range(1, 5), range(5, 9)), strict=True):
        for channel in CHANNELS:
            expected = np.mean([_rel_gain(rows[f"reward/{channel}"][rows["step"] == s]) for s in steps])
            assert entry[f"collapse_doctor/rel_gain/{channel}"] == pytest.approx(expected, abs=1e-6)
        silent = np.mean([np.mean(rows["advantage"][rows["step"] == s] == 0) for s in steps])
        assert entry["collapse_doctor/zero_advantage_share"] == pytest.approx(silent, abs=1e-6)
        shares = np.mean([_signal_shares(rows, s) for s in steps], axis=0)
        logged_shares = [entry[f"collapse_doctor/signal_share/{c}"] for c in CHANNELS]
        np.testing.assert_allclose(logged_shares, shares, atol=1e-6)
    # ... and through the trainer's own TensorBoard writer (report_to), under TRL's "train/" prefix
    events = EventAccumulator(str(next((run.out / "runs").iterdir())))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"train/collapse_doctor/rel_gain/{c}" for c in CHANNELS} <= tags
    assert "train/collapse_doctor/zero_advantage_share" in tags


def test_the_rollouts_count_steps_as_trl_does(run: Run) -> None:
    """TRL writes `completions/completions_<step>.parquet` at its logging steps (2, 4, 6, 8), each with the batch it
    just trained; the callback's rollouts of the same step hold the same completions with the same rewards."""
    rows = rollouts(run.out)
    files = sorted((run.out / "completions").glob("completions_*.parquet"))
    assert [int(f.stem.split("_")[1]) for f in files] == [2, 4, 6, 8]
    for file in files:
        table = pq.read_table(file).to_pydict()
        step = int(file.stem.split("_")[1])
        assert {int(s) for s in table["step"]} == {step}
        at = rows["step"] == step
        assert sorted(table["completion"]) == sorted(rows["completion"][at].tolist())
        ours = sorted(zip(rows["completion"][at].tolist(), rows["reward/format_tag"][at].tolist(), strict=True))
        theirs = sorted(zip(table["completion"], table["format_tag"], strict=True))
        assert ours == theirs


def test_one_output_dir_is_one_run_read_once(run: Run) -> None:
    """completions/, rollouts/, runs/ (TRL's events) and tensorboard/ (the callback's) of one training: one run,
    its rollouts read from rollouts/ only (8 steps x 16, not twice), the set-aside files named in the run card."""
    from collapse_doctor.io.discovery import discover_runs
    from collapse_doctor.pipeline.scan import diagnose

    [found] = discover_runs([run.out])
    assert found.rollout_files == sorted((run.out / "rollouts").glob("*.parquet"))
    assert {"events"} <= set(found.scalar_logs)
    assert len(found.set_aside) == 1 and "completions" in found.set_aside[0] and "read once" in found.set_aside[0]
    diagnosis = diagnose([run.out])
    assert diagnosis.run.name is None and diagnosis.run.rollouts == 8 * 16
    assert diagnosis.run.set_aside == found.set_aside
    assert diagnosis.run.scalar_points > 0, "TRL's own events joined the run"


def test_output_dir_scans_like_a_retrain_run(run: Run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose

    parts = sorted(p.name for p in (run.out / "rollouts").glob("*.parquet"))
    assert parts == ["part-000001-000004.parquet", "part-000005-000008.parquet"]
    whole = diagnose([run.out])
    assert whole.run.channels == CHANNELS
    assert whole.run.weights == dict(zip(CHANNELS, WEIGHTS, strict=True))
    assert whole.run.steps == 8 and whole.run.rollouts == 8 * 16
    assert whole.run.algorithm == "grpo", whole.run.algorithm_source  # the logged advantages match GRPO
    events = EventAccumulator(str(run.out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("collapse_doctor/rel_gain/graded")] == list(range(1, 9))
    # one run, one answer: the callback's final diagnosis is a plain scan of the rollouts it wrote
    scanned = diagnose([run.out / "rollouts"], ScanOptions())
    live = run.callback.diagnosis
    assert live is not None

    def answer(d: Any) -> dict[str, Any]:
        return {
            "verdict": d.verdict,
            "signal": d.run.signal,
            "counterfactuals": d.run.counterfactuals,
            "remedies": [f.remedy for f in d.findings],
            "algorithm": (d.run.algorithm, d.run.algorithm_source),
            "weights": (d.run.weights, d.run.weights_source),
            "sizes": (d.run.steps, d.run.rollouts, d.run.groups, d.run.group_size_min, d.run.group_size_max),
            "findings": [(f.code, f.severity, f.channels, f.onset_step, f.step_range, f.title) for f in d.findings],
            "skipped": d.skipped,
        }

    assert answer(live) == answer(scanned)


def test_each_finding_is_printed_once_and_the_run_is_summed_up(run: Run) -> None:
    from collapse_doctor.core.findings import VERDICTS

    live = run.callback.diagnosis
    assert live is not None and live.findings, "the tiny run has findings"
    *found, summary = run.printed
    assert len(found) == len({(f.code, f.channels, f.condition) for f in live.findings})
    for finding in live.findings:
        assert sum(f" {finding.code} " in line for line in found) >= 1
    assert all(line.startswith("collapse-doctor: ") for line in run.printed)
    # the last line: the verdict a scan of the output gives, the signal budget, the findings, where to look next
    assert summary.startswith(f"collapse-doctor: {VERDICTS[live.verdict]} after 8 steps: ")
    assert "gave no gradient" in summary and f"rollouts in {run.out / 'rollouts'}" in summary
    assert f"collapse-doctor report {run.out} --html report.html" in summary


def test_fail_on_stops_with_a_checkpoint(tmp_path: Path) -> None:
    printed: list[str] = []
    callback = CollapseDoctorCallback(fail_on="info", write_every=1, print_finding=printed.append, check_budget=1.0)
    trainer = make_trainer(tmp_path / "out", steps=12, callbacks=[callback])
    train(trainer)
    assert callback.stopped_by and all(f.severity >= 1 for f in callback.stopped_by)
    stopped = trainer.state.global_step
    assert stopped < 12
    first = callback.stopped_by[0]
    [said] = [line for line in printed if "stopping training" in line]
    assert said.startswith(f"collapse-doctor: stopping training after step {stopped} with a checkpoint (fail_on=info)")
    assert f"{first.code} {first.severity.label} {first.title}" in said
    assert (tmp_path / "out" / f"checkpoint-{stopped}").is_dir()
    assert sorted(set(rollouts(tmp_path / "out")["step"].tolist())) == list(range(1, stopped + 1))


def test_attach_hooks_a_trainer_built_already(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path / "out", steps=3, callbacks=[])
    # a budget no check fits in: the first check runs, then none until the one at the end of training
    callback = attach(trainer, write_every=1, output_dir=tmp_path / "elsewhere", print_finding=None, check_budget=1e-9)
    assert callback in trainer.callback_handler.callbacks
    train(trainer)
    assert sorted(set(rollouts(tmp_path / "elsewhere")["step"].tolist())) == [1, 2, 3]
    assert not (tmp_path / "out" / "rollouts").exists()
    assert callback.monitor is not None and callback.monitor.files_written == 3
    assert callback.live is not None and callback.live.checks == 2


def test_a_fault_switches_it_off_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def broken(self: Any, *parts: Any) -> None:
        nonlocal calls
        calls += 1
        raise OSError("disk full")

    monkeypatch.setattr(integration.RolloutMonitor, "_reduce", broken)
    callback = CollapseDoctorCallback(write_every=1, print_finding=None)
    trainer = make_trainer(tmp_path / "out", steps=4, callbacks=[callback])
    with pytest.warns(CollapseDoctorWarning, match="disk full") as caught:
        train(trainer)
    assert trainer.state.global_step == 4, "training ran to the end"
    assert len([w for w in caught if issubclass(w.category, CollapseDoctorWarning)]) == 1, "reported once"
    assert calls == 1, "switched off after the first failure"
    assert callback.error is not None and "OSError: disk full" in callback.error
    assert not any("collapse_doctor/" in key for entry in trainer.state.log_history for key in entry)


def test_existing_rollouts_of_another_run_are_left_alone(tmp_path: Path) -> None:
    first = make_trainer(tmp_path / "out", steps=1, callbacks=[CollapseDoctorCallback(write_every=1)])
    train(first)
    before = sorted((tmp_path / "out" / "rollouts").iterdir())
    second = CollapseDoctorCallback(write_every=1)
    trainer = make_trainer(tmp_path / "out", steps=2, callbacks=[second])
    with pytest.warns(CollapseDoctorWarning, match="already holds rollouts of another run"):
        train(trainer)
    assert trainer.state.global_step == 2
    assert sorted((tmp_path / "out" / "rollouts").iterdir()) == before
    assert sorted(set(rollouts(tmp_path / "out")["step"].tolist())) == [1]


def test_bad_arguments_are_one_line_errors() -> None:
    from collapse_doctor.core.errors import UsageError

    with pytest.raises(UsageError, match="fail_on"):
        CollapseDoctorCallback(fail_on="sometimes")
    with pytest.raises(UsageError, match="write_every=0"):
        CollapseDoctorCallback(write_every=0)


def test_a_print_finding_that_raises_never_breaks_training(tmp_path: Path) -> None:
    """The user's own sink failing (a closed stream) is the callback's fault to contain: one warning, training ends."""

    def closed(line: str) -> None:
        raise ValueError("I/O operation on closed file")

    callback = CollapseDoctorCallback(write_every=2, print_finding=closed, check_budget=1.0)
    trainer = make_trainer(tmp_path / "out", steps=4, callbacks=[callback])
    with pytest.warns(CollapseDoctorWarning, match="closed file"):
        train(trainer)
    assert trainer.state.global_step == 4, "training ran to the end"
