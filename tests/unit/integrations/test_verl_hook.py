"""The verl hook driven through verl's own ``Tracking`` (verl 0.9.1, CPU), with per-step metrics built by verl's own
``compute_data_metrics`` and ``compute_grpo_outcome_advantage`` and the GDPO per-reward lines of ``ray_trainer.py``.

What a correct diagnosis says, written down before the runs:

- healthy (two Bernoulli(0.5) channels throughout): both channels keep a batch std near 0.5, so no channel
  finding, nothing at warning or above, and ``fail_on="warning"`` never stops the run;
- saturated (``format`` rises to 1 on every completion by step 20): its mean reaches its maximum and its std 0
  while ``accuracy`` varies: CD505 on ``format``, all-pass, information only (a constant adds the same to every
  member: it changes no advantage), so ``fail_on="warning"`` does not stop;
- lost (``format`` earned half the time, then 0 on every completion from step 25): its std falls to 0 at a mean
  below every earlier level: CD505 on ``format``, all-fail, a warning, and ``fail_on="warning"`` stops the run;
- dynamic sampling (verl ``filter_groups`` drops 24 constant groups per step for a batch of 16): 60% of the
  generated groups never train: CD504 "filtered out" (a warning), the scan says what the generation cost, and no
  remedy says to add dynamic sampling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib

pytest.importorskip("verl.utils.tracking")
torch = pytest.importorskip("torch")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.metric_utils import compute_data_metrics  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from collapse_doctor import diagnose  # noqa: E402
from collapse_doctor.core.errors import UsageError  # noqa: E402
from collapse_doctor.core.findings import Severity  # noqa: E402
from collapse_doctor.integrations import verl as hook  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
GROUPS, SIZE, PROMPT, RESPONSE = 16, 8, 4, 6
STEPS = 60
Probs = Callable[[int], dict[str, float]]


def healthy(step: int) -> dict[str, float]:
    return {"format": 0.5, "accuracy": 0.5}


def saturating(step: int) -> dict[str, float]:
    return {"format": min(1.0, 0.5 + 0.5 * step / 20), "accuracy": 0.5}


def lost(step: int) -> dict[str, float]:
    return {"format": 0.5 if step < 25 else 0.0, "accuracy": 0.5}


def verl_step(step: int, probs: dict[str, float], rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
    """One training step's metrics as verl's trainer logs them, and the step's rollout dump columns."""
    n = GROUPS * SIZE
    rewards = {c: (rng.random(n) < p).astype(np.float32) for c, p in probs.items()}
    scores = torch.tensor(sum(rewards.values()))
    lengths = torch.tensor(rng.integers(1, RESPONSE + 1, n))
    mask = (torch.arange(RESPONSE)[None, :] < lengths[:, None]).float()
    token_scores = torch.zeros(n, RESPONSE)
    token_scores[torch.arange(n), lengths - 1] = scores
    index = np.repeat(np.arange(GROUPS), SIZE).astype(object)
    advantages, returns = compute_grpo_outcome_advantage(token_scores, mask, index)
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores,
            "advantages": advantages,
            "returns": returns,
            "prompts": torch.zeros(n, PROMPT, dtype=torch.long),
            "responses": torch.zeros(n, RESPONSE, dtype=torch.long),
            "response_mask": mask,
            "attention_mask": torch.cat([torch.ones(n, PROMPT), mask], dim=1),
        }
    )
    metrics: dict[str, Any] = {"training/global_step": step, "training/epoch": 0}
    metrics.update(compute_data_metrics(batch=batch, use_critic=False))
    for key, values in rewards.items():  # ray_trainer.py, adv_estimator=gdpo with algorithm.gdpo_reward_keys
        vals = np.asarray(values, dtype=np.float32)
        metrics[f"gdpo/{key}/mean"] = float(np.mean(vals))
        metrics[f"gdpo/{key}/std"] = float(np.std(vals))
        metrics[f"gdpo/{key}/max"] = float(np.max(vals))
        metrics[f"gdpo/{key}/min"] = float(np.min(vals))
    dump = {
        "inputs": [f"prompt {step}-{g}" for g in range(GROUPS) for _ in range(SIZE)],
        "outputs": ["response"] * n,
        "gts": [None] * n,
        "scores": scores.tolist(),
        "extra": {c: v.tolist() for c, v in rewards.items()},
    }
    return metrics, dump


def train(
    tmp_path: Path,
    probs: Probs,
    *,
    ours: dict[str, Any] | None = None,
    rollouts: bool = False,
    extra: Callable[[int], dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
    steps: int = STEPS,
) -> tuple[Tracking, list[int], BaseException | None]:
    """verl's loop in miniature: one ``Tracking`` from the config, ``log`` after each step (the dump written first,
    as ``_log_rollout_data`` does), ``finish`` at the end. Returns the tracker, the steps run and what stopped it."""
    os.environ["VERL_FILE_LOGGER_PATH"] = str(tmp_path / "verl_file_logger.jsonl")
    rollout_dir = tmp_path / "rollouts"
    cfg: dict[str, Any] = {
        "trainer": {
            "default_local_dir": str(tmp_path / "ckpt"),
            "rollout_data_dir": str(rollout_dir) if rollouts else None,
        },
        "collapse_doctor": {"check_budget": 1.0, **(ours or {})},
        **(config or {}),
    }
    tracker = Tracking("project", "experiment", default_backend=["file", "collapse_doctor"], config=cfg)
    rng = np.random.default_rng(0)
    done: list[int] = []
    stopped: BaseException | None = None
    try:
        for step in range(1, steps + 1):
            metrics, dump = verl_step(step, probs(step), rng)
            if extra is not None:
                metrics.update(extra(step))
            if rollouts:
                write_generations(
                    dump["inputs"], dump["outputs"], dump["gts"], dump["scores"], dump["extra"], str(rollout_dir), step
                )
            done.append(step)
            tracker.log(data=metrics, step=step)
    except hook.CollapseDoctorStop as exc:
        stopped = exc
    tracker.finish()
    return tracker, done, stopped


def write_generations(
    inputs: list[str],
    outputs: list[str],
    gts: list[Any],
    scores: list[float],
    extra: dict[str, list[Any]],
    dump_path: str,
    global_steps: int,
) -> None:
    """verl 0.9.1 ``RayPPOTrainer._write_generations`` (ray_trainer.py:454-476), as written (its module needs
    torchdata, which this environment lacks)."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{global_steps}.jsonl")
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [global_steps] * n}
    for k, v in extra.items():
        if len(v) == n:
            base_data[k] = v
    with open(filename, "w") as f:
        for i in range(n):
            entry = {k: v[i] for k, v in base_data.items()}
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")


def monitor_of(tracker: Tracking) -> hook.VerlMonitor:
    monitor = tracker.logger[hook.BACKEND]
    assert isinstance(monitor, hook.VerlMonitor)
    return monitor


def file_logger_steps(tmp_path: Path) -> list[int]:
    lines = (tmp_path / "verl_file_logger.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def assert_same_diagnosis(hooked: Any, scanned: Any) -> None:
    assert hooked.verdict == scanned.verdict
    assert hooked.findings == scanned.findings
    assert hooked.channels == scanned.channels
    assert hooked.run.warnings == scanned.run.warnings


def test_a_healthy_run_raises_nothing_and_runs_to_its_end(tmp_path: Path) -> None:
    tracker, done, stopped = train(tmp_path, healthy, ours={"fail_on": "warning"})
    monitor = monitor_of(tracker)
    assert stopped is None and done == list(range(1, STEPS + 1))
    assert monitor.error is None and monitor.checks >= STEPS
    diagnosis = monitor.diagnosis
    assert diagnosis is not None
    assert diagnosis.run.scalar_framework == "verl"
    assert {row["channel"] for row in diagnosis.channels} == {"format", "accuracy"}
    assert not [f for f in diagnosis.findings if f.severity >= Severity.WARNING]
    assert not [f for f in diagnosis.findings if f.code == "CD505"]
    assert file_logger_steps(tmp_path) == list(range(1, STEPS + 1))  # verl's own backend got every point


def test_a_saturated_channel_is_information_and_does_not_stop(tmp_path: Path) -> None:
    tracker, done, stopped = train(tmp_path, saturating, ours={"fail_on": "warning"})
    diagnosis = monitor_of(tracker).diagnosis
    assert stopped is None and len(done) == STEPS
    assert diagnosis is not None
    (found,) = [f for f in diagnosis.findings if f.code == "CD505"]
    assert found.channels == ("format",) and "all-pass" in found.title
    assert found.severity == Severity.INFO
    assert 15 <= (found.onset_step or 0) <= 25  # format reaches 1 on every completion at step 20


def test_fail_on_stops_the_loop_after_the_other_backends_have_the_step(tmp_path: Path) -> None:
    tracker, done, stopped = train(tmp_path, lost, ours={"fail_on": "warning"})
    monitor = monitor_of(tracker)
    assert isinstance(stopped, hook.CollapseDoctorStop)
    assert done[-1] < STEPS  # the loop ended early
    assert monitor.stopped_by and all(f.severity >= Severity.WARNING for f in monitor.stopped_by)
    assert "fail_on=warning" in str(stopped)
    # verl's file backend logged every step up to and including the one that stopped the run
    assert file_logger_steps(tmp_path) == done


def test_the_lost_channel_is_the_warning_the_math_predicts(tmp_path: Path) -> None:
    tracker, _, stopped = train(tmp_path, lost)
    diagnosis = monitor_of(tracker).diagnosis
    assert stopped is None and diagnosis is not None
    (found,) = [f for f in diagnosis.findings if f.code == "CD505"]
    assert found.channels == ("format",) and "all-fail" in found.title
    assert found.severity == Severity.WARNING
    assert found.onset_step == 25


def test_the_hooks_final_diagnosis_is_scans_of_what_it_saw(tmp_path: Path) -> None:
    tracker, _, _ = train(tmp_path, saturating)
    monitor = monitor_of(tracker)
    assert monitor.metrics_path.parent == tmp_path / "ckpt" / "collapse_doctor"
    assert_same_diagnosis(monitor.diagnosis, diagnose([monitor.output_dir]))


def test_with_rollout_dumps_the_hook_judges_them_as_scan_does(tmp_path: Path) -> None:
    tracker, _, stopped = train(tmp_path, lost, rollouts=True, steps=40)
    monitor = monitor_of(tracker)
    diagnosis = monitor.diagnosis
    assert stopped is None and diagnosis is not None
    assert monitor.output_dir == tmp_path / "rollouts"  # the metrics sit beside verl's dumps: one run
    assert diagnosis.run.rollouts == 40 * GROUPS * SIZE
    assert set(diagnosis.run.channels) == {"format", "accuracy"}
    assert_same_diagnosis(diagnosis, diagnose([tmp_path / "rollouts"]))
    # rel_gain of format falls from its early level to 0 at step 25: the per-group check sees it too
    assert any(f.code == "CD101" and f.channels == ("format",) for f in diagnosis.findings)


@pytest.mark.parametrize("metric", ["acc", "reward"])
def test_dynamic_sampling_reports_the_generation_spent_and_never_prescribes_it(tmp_path: Path, metric: str) -> None:
    def evicted(step: int) -> dict[str, Any]:
        # replay_buffer.py: the key is written only at steps where some group was dropped
        return {"training/filter_groups/evicted_samples": 24} if step % 10 else {}

    config = {"algorithm": {"filter_groups": {"enable": True, "metric": metric}}, "data": {"train_batch_size": 16}}
    tracker, _, _ = train(tmp_path, healthy, extra=evicted, config=config)
    diagnosis = monitor_of(tracker).diagnosis
    assert diagnosis is not None and diagnosis.scalars is not None
    share = diagnosis.scalars.get("frac_reward_zero_std")
    assert share is not None
    expected = np.where(np.arange(1, STEPS + 1) % 10 == 0, 0.0, 24 / 40)  # dropped / (dropped + trained)
    np.testing.assert_allclose(share.values, expected)
    (found,) = [f for f in diagnosis.findings if f.code == "CD504"]
    assert found.title == "most generated groups are filtered out" and found.severity == Severity.WARNING
    (note,) = [w for w in diagnosis.run.warnings if w.startswith("dynamic sampling (")]
    # filtering on `acc`, a reward_extra_info field, is not filtering on the trained reward: said once, and only then
    other_metric = [w for w in diagnosis.run.warnings if "metric other than the trained reward" in w]
    assert len(other_metric) == (1 if metric == "acc" else 0)
    dropped = 24 * (STEPS - STEPS // 10)  # 1,296 groups, against 16 trained at each of the 60 steps
    assert f"{dropped:,} groups dropped as constant over {STEPS} steps" in note
    assert f"{dropped / (dropped + 16 * STEPS):.0%} of the generated groups never trained" in note
    for f in diagnosis.findings:
        assert "(dynamic sampling)" not in str(f.remedy), (f.code, f.remedy)
    assert_same_diagnosis(diagnosis, diagnose([monitor_of(tracker).output_dir]))


def test_an_internal_error_leaves_training_and_the_other_backends_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: hook.VerlMonitor, *, final: bool = False) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(hook.VerlMonitor, "check", broken)
    with pytest.warns(hook.CollapseDoctorWarning, match="disk on fire") as caught:
        tracker, done, stopped = train(tmp_path, lost, ours={"fail_on": "warning"})
    assert len([w for w in caught if issubclass(w.category, hook.CollapseDoctorWarning)]) == 1
    assert stopped is None and done == list(range(1, STEPS + 1))
    assert monitor_of(tracker).error is not None
    assert file_logger_steps(tmp_path) == done


def test_a_run_without_the_backend_is_verls_own(tmp_path: Path) -> None:
    os.environ["VERL_FILE_LOGGER_PATH"] = str(tmp_path / "plain.jsonl")
    tracker = Tracking("project", "experiment", default_backend="file", config={})
    assert list(tracker.logger) == ["file"]
    tracker.finish()
    assert hook.BACKEND in Tracking.supported_backend


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"fail_on": "sometimes"}, "collapse_doctor.fail_on"),
        ({"fail_soon": "warning"}, "unknown key collapse_doctor.fail_soon"),
        ({"check_every": 0}, "collapse_doctor.check_every=0"),
    ],
)
def test_a_config_mistake_fails_before_training_with_one_line(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    cfg = {"trainer": {"default_local_dir": str(tmp_path)}, "collapse_doctor": section}
    with pytest.raises(UsageError, match=message) as raised:
        Tracking("project", "experiment", default_backend=["collapse_doctor"], config=cfg)
    assert "\n" not in raised.value.one_line()


def test_fail_on_comes_from_the_environment_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hook.ENV_FAIL_ON, "critical")
    monitor = hook.VerlMonitor.from_verl_config("p", "e", {"trainer": {"default_local_dir": str(tmp_path)}})
    assert monitor.fail_on == "critical"
    monitor.finish()


def test_the_declared_entry_point_registers_the_backend() -> None:
    """verl's loader (``verl/__init__.py``) calls ``EntryPoint.load()`` for each ``verl.plugins`` entry point."""
    from importlib.metadata import EntryPoint

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    assert declared == {"collapse_doctor": "collapse_doctor.integrations.verl:verl_plugin"}
    loaded = EntryPoint(name="collapse_doctor", value=declared["collapse_doctor"], group="verl.plugins").load()
    assert loaded is hook.register and loaded() is True


def test_verl_imports_the_hook_by_its_own_external_modules_variable(tmp_path: Path) -> None:
    """A fresh process: ``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import this module, which registers."""
    config = {"trainer": {"default_local_dir": str(tmp_path)}}
    script = (
        "import verl\n"
        "from verl.utils.tracking import Tracking\n"
        f"t = Tracking('p', 'e', default_backend=['collapse_doctor'], config={config!r})\n"
        "print(type(t.logger['collapse_doctor']).__name__)\n"
    )
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_MODULES": "collapse_doctor.integrations.verl",
        "VERL_USE_EXTERNAL_PLUGINS": "none",
    }
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("VerlMonitor")


def test_the_hook_module_imports_without_verl() -> None:
    script = (
        "import sys\n"
        "sys.modules['verl'] = None  # as if verl were not installed\n"
        "import collapse_doctor.integrations.verl as hook\n"
        "assert hook.register() is False\n"
        "assert 'torch' not in sys.modules and 'collapse_doctor.pipeline.scan' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_non_numeric_metrics_are_left_out_and_non_finite_ones_kept_as_gaps(tmp_path: Path) -> None:
    monitor = hook.VerlMonitor(tmp_path, print_finding=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monitor.log({"val-core/x/acc/mean@1": 0.5, "table": {"a": 1}, "name": "x", "flag": True}, step=0)
        monitor.log({"critic/score/mean": float("nan"), "actor/entropy": np.float32(0.5)}, step=1)
    monitor.finish()
    records = [json.loads(line) for line in monitor.metrics_path.read_text().splitlines()]
    assert records == [
        {"step": 0, "data": {"val-core/x/acc/mean@1": 0.5}},
        {"step": 1, "data": {"critic/score/mean": None, "actor/entropy": 0.5}},
    ]
