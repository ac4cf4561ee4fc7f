"""CD5xx beyond the registry cases: quiet on healthy noisy logs, support, conditional firing, the right reading
of each framework's numbers; and the scan notes of a normal TRL run (no noise in its warnings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.io.rollouts.trl import open_trl_completions
from collapse_doctor.judge.detectors import Finding, Severity
from tests.helpers.scalar_runs import (
    STEPS,
    Curve,
    after,
    flat,
    rises_then_falls,
    scalar_event,
    session_start,
    trl_final_summary,
    trl_series,
    write_events,
    write_raw,
    write_trainer_state,
)


def scan(path: Path, **options: Any) -> Diagnosis:
    return diagnose([path], ScanOptions.of(device="cpu", **options))


def of_code(diagnosis: Diagnosis, code: str) -> list[Finding]:
    return [f for f in diagnosis.findings if f.code == code]


def test_healthy_trl_logs_stay_quiet_over_seeds(tmp_path: Path) -> None:
    noisy = {}
    for seed in range(8):
        write_events(tmp_path / str(seed), trl_series(seed=seed))
        diagnosis = scan(tmp_path / str(seed))
        if diagnosis.findings:
            noisy[seed] = [f.code for f in diagnosis.findings]
    assert noisy == {}


def test_short_logs_are_not_judged_and_say_so(tmp_path: Path) -> None:
    series = {tag: values[:6] for tag, values in trl_series(train__entropy=after(3, 0.8, 0.01)).items()}
    write_events(tmp_path / "short", series)
    diagnosis = scan(tmp_path)
    assert diagnosis.findings == ()
    for code in ("CD501", "CD502", "CD503", "CD504", "CD505"):
        assert "not enough data to judge" in diagnosis.skipped[code], code
    assert "6 logged point(s); 8 are needed (min_points)" in diagnosis.skipped["CD503"]


def test_min_points_comes_from_the_config(tmp_path: Path) -> None:
    series = {tag: values[:6] for tag, values in trl_series().items()}
    write_events(tmp_path / "short", series)
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD503]\nmin_points = 5\n")
    assert "CD503" not in scan(tmp_path, config=config).skipped


# CD503 entropy: convergence (reward rising) is not collapse; critical needs the zero-advantage evidence


def test_onset_and_severity_of_an_entropy_collapse(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__entropy=after(120, 0.8, 0.2), train__reward=flat(0.5)))
    found = of_code(scan(tmp_path), "CD503")
    assert len(found) == 1 and found[0].severity == Severity.WARNING
    assert found[0].onset_step is not None and abs(found[0].onset_step - 120) <= 10
    assert "not rising" in found[0].message and found[0].evidence["points"] == STEPS
    assert found[0].gdpo_resolves is None


def test_entropy_falling_while_the_reward_rises_is_convergence(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__entropy=after(90, 0.8, 0.05)))  # reward 0.3 -> 0.7
    assert of_code(scan(tmp_path), "CD503") == []


def test_entropy_collapse_after_the_reward_fell_back_is_reported(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__entropy=after(40, 0.8, 0.05), train__reward=rises_then_falls))
    found = of_code(scan(tmp_path), "CD503")
    assert len(found) == 1 and found[0].severity == Severity.WARNING


def test_entropy_collapse_without_a_reward_series_is_judged_on_entropy(tmp_path: Path) -> None:
    series = trl_series(train__entropy=after(90, 0.8, 0.05))
    # no reward at all: CD503 falls back to the per-channel means when `reward` is missing, so drop them too
    for tag in ("train/reward", "train/rewards/format_reward/mean", "train/rewards/correct_reward/mean"):
        del series[tag]
    write_events(tmp_path / "run", series)
    found = of_code(scan(tmp_path), "CD503")
    assert len(found) == 1 and "no reward series" in found[0].message


@pytest.mark.parametrize(("zero_std", "severity"), [(0.9, Severity.CRITICAL), (0.1, Severity.WARNING)])
def test_entropy_collapse_is_critical_only_when_most_rollouts_are_silent(
    zero_std: float, severity: Severity, tmp_path: Path
) -> None:
    write_events(
        tmp_path / "run",
        trl_series(
            train__entropy=after(90, 0.8, 0.02),
            train__reward=flat(0.5),
            train__frac_reward_zero_std=after(90, 0.1, zero_std, noise=0.01),
        ),
    )
    found = of_code(scan(tmp_path), "CD503")
    assert len(found) == 1 and found[0].severity == severity
    assert np.isclose(found[0].evidence["zero_std_share"], zero_std, atol=0.02)


# CD501 reward / advantage std


@pytest.mark.parametrize("spike", [True, False], ids=["spike", "collapse"])
def test_advantage_std_shift_both_ways(spike: bool, tmp_path: Path) -> None:
    later = 4.0 if spike else 0.02
    write_events(tmp_path / "run", trl_series(train__reward_std=after(100, 0.6, later), train__reward=flat(0.5)))
    found = of_code(scan(tmp_path), "CD501")
    assert len(found) == 1 and found[0].severity == Severity.WARNING
    assert ("spikes" in found[0].title) == spike


def test_reward_std_spike_while_the_reward_rises_is_learning(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__reward_std=after(100, 0.6, 4.0)))  # reward 0.3 -> 0.7
    assert of_code(scan(tmp_path), "CD501") == []


def test_reward_std_narrowing_while_the_reward_rises_is_information(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__reward_std=after(100, 0.6, 0.02)))
    found = of_code(scan(tmp_path), "CD501")
    assert len(found) == 1 and found[0].severity == Severity.INFO
    assert "convergence" in found[0].message


def test_reward_std_of_exactly_zero_is_critical_under_grpo_only(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__reward_std=after(100, 0.6, 0.0), train__reward=flat(0.5)))
    found = of_code(scan(tmp_path), "CD501")
    assert len(found) == 1 and found[0].severity == Severity.CRITICAL
    assert "no GRPO advantage anywhere" in found[0].message
    gdpo = of_code(scan(tmp_path, algo="gdpo"), "CD501")
    assert len(gdpo) == 1 and gdpo[0].severity == Severity.WARNING  # channels may still vary under GDPO


def test_a_collapse_that_recovers_is_not_reported(tmp_path: Path) -> None:
    def dip(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.where((t >= 100) & (t < 140), 0.01, 0.6) * (1 + 0.05 * rng.standard_normal(len(t)))

    write_events(tmp_path / "run", trl_series(train__reward_std=dip, train__reward=flat(0.5)))
    assert of_code(scan(tmp_path), "CD501") == []


def test_trainer_state_json_with_trl_key_names(tmp_path: Path) -> None:
    history = [
        {"step": s, "epoch": s / 20, "loss": 0.0, "reward": 0.5, "reward_std": 0.4 if s <= 20 else 0.0}
        for s in range(1, 41)
    ]
    write_trainer_state(tmp_path / "out", history)
    found = of_code(scan(tmp_path / "out"), "CD501")
    assert len(found) == 1 and found[0].severity == Severity.CRITICAL and found[0].onset_step == 21


# CD504: per aggregation, and the all-fail / all-pass split where the log has it


def test_thresholds_come_from_the_config(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__frac_reward_zero_std=after(100, 0.1, 0.4, noise=0.02)))
    assert not of_code(scan(tmp_path), "CD504")
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD504]\nwarn_share = 0.3\n")
    found = of_code(scan(tmp_path, config=config), "CD504")
    assert len(found) == 1 and np.isclose(found[0].evidence["share"], 0.4, atol=0.03)


def test_trl_zero_std_share_under_grpo_says_the_split_is_unknown(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__frac_reward_zero_std=after(100, 0.1, 0.9, noise=0.02)))
    (found,) = of_code(scan(tmp_path), "CD504")
    assert found.severity == Severity.CRITICAL and found.evidence["reading"] == "groups"
    assert "does not say whether they are all-pass or all-fail, or channels that cancel" in found.message
    # the split is unknown: what helps either way, never harder and easier prompts at once
    assert "dynamic sampling" in found.remedy and "unequal weights" in found.remedy
    assert "harder prompts" not in found.remedy and "easier prompts" not in found.remedy
    assert [a.setting for a in found.actions] == ["num_generations"]
    assert found.gdpo_resolves is None and "GDPO" not in found.remedy


def _flags(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """TRL's frac_reward_zero_std under GDPO: 1 when the whole batch's fused rewards are equal, else 0."""
    return (rng.random(len(t)) < np.where(t < 100, 0.0, 0.7)).astype(float)


def test_trl_whole_batch_flag_under_gdpo_is_a_lower_bound(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__frac_reward_zero_std=_flags))
    for options in ({}, {"algo": "gdpo"}):  # 0/1 values are read as the flag even without --algo
        (found,) = of_code(scan(tmp_path, **options), "CD504")
        assert found.evidence["reading"] == "batch" and found.title == "whole batches give no gradient"
        assert "at least that share of the rollouts" in found.message


def test_trl_share_under_gdpo_is_not_read_as_a_group_share(tmp_path: Path) -> None:
    # under GDPO a point between 0 and 1 is the share of the step's generation batches that were silent
    write_events(tmp_path / "run", trl_series(train__frac_reward_zero_std=after(100, 0.1, 0.6, noise=0.02)))
    (found,) = of_code(scan(tmp_path, algo="gdpo"), "CD504")
    assert found.evidence["reading"] == "batch" and "generation batches" in found.message


def _nemo(pct_fail: float, pct_pass: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    t = np.arange(STEPS)
    return {
        "train/reward": 0.4 + 0.01 * rng.standard_normal(STEPS),
        "train/approx_entropy": 0.8 * (1 + 0.02 * rng.standard_normal(STEPS)),
        "train/baseline_reward/pct_0": np.where(t < 100, 10.0, pct_fail) + rng.standard_normal(STEPS),
        "train/baseline_reward/pct_1": np.where(t < 100, 10.0, pct_pass) + rng.standard_normal(STEPS),
    }


@pytest.mark.parametrize(
    ("fail", "ok", "fix", "not_fix"),
    [(80.0, 3.0, "easier prompts", "harder prompts"), (3.0, 85.0, "harder prompts", "easier prompts")],
    ids=["all-fail", "all-pass"],
)
def test_nemo_rl_split_picks_the_remedy(fail: float, ok: float, fix: str, not_fix: str, tmp_path: Path) -> None:
    write_events(tmp_path / "nemo", _nemo(fail, ok))
    (found,) = of_code(scan(tmp_path), "CD504")
    assert found.severity == Severity.CRITICAL
    assert np.isclose(found.evidence["all_fail_share"], fail / 100, atol=0.02)
    assert np.isclose(found.evidence["all_pass_share"], ok / 100, atol=0.02)
    assert fix in found.remedy and not_fix not in found.remedy


def test_nemo_rl_split_with_both_causes_asks_for_no_opposite_prompt_changes(tmp_path: Path) -> None:
    """45% all-fail and 42% all-pass groups: harder prompts for the one and easier for the other would be opposite
    changes at once; the remedy is what helps both (dynamic sampling, more generations)."""
    write_events(tmp_path / "nemo", _nemo(45.0, 42.0))
    (found,) = of_code(scan(tmp_path), "CD504")
    assert "harder prompts" not in found.remedy and "easier prompts" not in found.remedy
    assert "dynamic sampling" in found.remedy and [a.setting for a in found.actions] == ["num_generations"]


def test_openrlhf_filtered_groups_are_a_warning_at_most(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(STEPS)
    write_events(
        tmp_path / "orl",
        {
            "train/reward": 0.5 + 0.01 * rng.standard_normal(STEPS),
            "train/group_reward_std": 0.3 * (1 + 0.02 * rng.standard_normal(STEPS)),
            "train/dynamic_filtering_pass_rate": np.where(t < 100, 0.8, 0.05),
        },
    )
    (found,) = of_code(scan(tmp_path), "CD504")
    assert found.severity == Severity.WARNING and found.evidence["reading"] == "filtered"


# CD505: which way a channel saturated; a channel that never varied is not a collapse from a peak


def _channel_run(directory: Path, std: Curve, mean: Curve) -> Path:
    return write_events(
        directory,
        trl_series(
            train__rewards__format_reward__std=std, train__rewards__format_reward__mean=mean, train__reward=flat(0.5)
        ),
    )


def _ramp(start: float, end: float, at: int = 100) -> Curve:
    def curve(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        level = np.where(t < at, start + (end - start) * 0.5 * t / at, end)
        return np.clip(level + np.where(t < at, 0.03 * rng.standard_normal(len(t)), 0.0), 0, 1)

    return curve


@pytest.mark.parametrize(
    ("end", "severity", "direction"), [(1.0, Severity.INFO, "all-pass"), (0.0, Severity.WARNING, "all-fail")]
)
def test_channel_std_saturation_says_which_way(end: float, severity: Severity, direction: str, tmp_path: Path) -> None:
    _channel_run(tmp_path / "run", after(100, 0.4, 0.0, noise=0.1), _ramp(0.5, end))
    (found,) = of_code(scan(tmp_path), "CD505")
    assert found.channels == ("format_reward",) and found.severity == severity
    assert found.evidence["direction"] == direction and direction in found.title
    assert found.gdpo_resolves is None and "GDPO" not in found.remedy


def test_a_channel_constant_from_its_first_point_is_information_at_most(tmp_path: Path) -> None:
    _channel_run(tmp_path / "run", after(0, 0.0, 0.0, noise=0.0), after(0, 0.0, 0.0, noise=0.0))
    (found,) = of_code(scan(tmp_path), "CD505")
    assert found.severity == Severity.INFO and found.evidence["direction"] == "never varied"


def test_a_channel_at_its_ceiling_with_rare_failures_is_not_a_collapse(tmp_path: Path) -> None:
    def rare_failures(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        std = np.where(rng.random(len(t)) < 0.5, 0.125, 0.0)
        return np.where(t >= 150, 0.0, std)  # and a final stretch with no failure at all

    _channel_run(tmp_path / "run", rare_failures, after(0, 0.99, 0.99, noise=0.005))
    assert all(f.severity <= Severity.INFO for f in of_code(scan(tmp_path), "CD505"))


# CD506: the group z-score bound does not apply to GDPO


def test_logged_advantage_bound_is_not_judged_under_gdpo(tmp_path: Path) -> None:
    from tests.helpers.scalar_runs import verl_run

    run = verl_run(tmp_path / "v", jump_at=100)
    assert of_code(scan(run), "CD506")
    assert not of_code(scan(run, algo="gdpo"), "CD506")


# Scan notes: what is normal on every TRL run is not a warning; a real restart or a file given twice is


def test_trl_final_summary_is_not_a_restart(tmp_path: Path) -> None:
    payloads = []
    for step in range(1, 21):
        payloads += [
            scalar_event("train/reward", 0.5, step, float(step)),
            scalar_event("train/epoch", step / 20, step, float(step)),
        ]
    payloads += trl_final_summary(20, 30.0)  # epoch at step 20 again, with train_runtime, total_flos, ...
    write_raw(tmp_path / "run" / "events.out.tfevents.1.host", payloads)
    diagnosis = scan(tmp_path / "run")
    assert not [w for w in diagnosis.run.warnings if "twice" in w or "restart" in w]


def test_a_restart_logging_many_tags_again_is_a_warning(tmp_path: Path) -> None:
    tags = ("train/reward", "train/kl", "train/entropy")
    first = [scalar_event(tag, 0.5, s, float(s)) for s in range(0, 30) for tag in tags]
    write_raw(tmp_path / "run" / "events.out.tfevents.100.host", first)
    again = [scalar_event(tag, 0.6, s, 100.0 + s) for s in range(20, 40) for tag in tags]  # resumed from step 20
    write_raw(tmp_path / "run" / "events.out.tfevents.200.host", again)
    warnings = scan(tmp_path / "run").run.warnings
    assert any("30 scalar point(s) of 3 tags logged again for steps already logged (restart?)" in w for w in warnings)


def test_a_session_start_is_still_noted(tmp_path: Path) -> None:
    payloads = [scalar_event("train/reward", 0.5, s, float(s)) for s in range(20)]
    payloads += [session_start(10, 50.0)] + [scalar_event("train/reward", 0.6, s, 50.0 + s) for s in range(10, 30)]
    write_raw(tmp_path / "run" / "events.out.tfevents.1.host", payloads)
    assert any("SessionLog START" in w for w in scan(tmp_path / "run").run.warnings)


def _completions(path: Path, step: int, texts: list[str], prompts: list[str]) -> None:
    rewards = [float(len(t) % 3) for t in texts]
    mean = {p: np.mean([r for r, q in zip(rewards, prompts, strict=True) if q == p]) for p in set(prompts)}
    table = pa.table(
        {
            "step": [step] * len(texts),
            "prompt": prompts,
            "completion": texts,
            "length_reward": rewards,
            "advantage": [r - mean[p] for r, p in zip(rewards, prompts, strict=True)],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _trl_run(directory: Path, *, copy_step: int | None = None) -> list[Path]:
    rng = np.random.default_rng(0)
    files = []
    for step in range(1, 6):
        prompts = [f"q{step}-{g}" for g in range(4) for _ in range(4)]
        texts = ["ab" if i % 4 < 2 else "".join(rng.choice(list("xyz123"), 5)) for i in range(16)]  # 2 alike/group
        path = directory / "completions" / f"completions_{step:05d}.parquet"
        _completions(path, step, texts, prompts)
        files.append(path)
    if copy_step is not None:
        copy = directory / "completions" / f"completions_{copy_step:04d}.parquet"  # the same step, another name
        copy.write_bytes(files[copy_step - 1].read_bytes())
        files.append(copy)
    return files


def test_duplicate_rows_within_groups_are_information_not_a_warning(tmp_path: Path) -> None:
    files = _trl_run(tmp_path / "run")
    reader = open_trl_completions(files)
    for _ in reader.iter_chunks(1 << 16):
        pass
    assert reader.notes.duplicate_rows == 5 * 4  # one identical pair per group
    assert reader.notes.warnings() == []
    assert reader.notes.info() and "20 duplicate row(s)" in reader.notes.info()[0]
    assert not [w for w in scan(tmp_path / "run").run.warnings if "duplicate" in w]


def test_whole_groups_given_twice_are_a_warning_with_counts(tmp_path: Path) -> None:
    files = _trl_run(tmp_path / "run", copy_step=3)
    reader = open_trl_completions(files)
    for _ in reader.iter_chunks(1 << 16):
        pass
    (warning,) = reader.notes.warnings()
    assert warning.startswith("4 group(s) (16 rows) repeat an earlier group of the same step row for row")
    assert any(w.startswith("4 group(s) (16 rows)") for w in scan(tmp_path / "run").run.warnings)


def test_trainer_state_bookkeeping_is_not_a_restart(tmp_path: Path) -> None:
    history: list[dict[str, object]] = [{"step": s, "epoch": s / 10, "reward": 0.5, "loss": 0.0} for s in range(1, 21)]
    history.append({"step": 20, "epoch": 2.0, "train_runtime": 3.0, "train_loss": 0.0, "total_flos": 0.0})
    write_trainer_state(tmp_path / "out", history)
    assert not [w for w in scan(tmp_path / "out").run.warnings if "twice" in w or "restart" in w]
    assert json.loads((tmp_path / "out" / "checkpoint-20" / "trainer_state.json").read_text())["global_step"] == 20


def test_a_scalar_log_no_check_can_read_is_inconclusive(tmp_path: Path) -> None:
    """An event file whose only tag is unrecognised: no scalar check has what it reads, no rollout check has
    rollouts, so nothing judged the run: INCONCLUSIVE (exit 1 under the gate), not HEALTHY; the coverage says why."""
    from tests.helpers.scalar_runs import scalar_event, write_raw

    write_raw(
        tmp_path / "run" / "events.out.tfevents.1.host",
        [scalar_event("train/custom", 0.1, i, float(i)) for i in range(30)],
    )
    diagnosis = diagnose([tmp_path / "run"], ScanOptions.of(device="cpu"))
    assert diagnosis.verdict == "inconclusive" and diagnosis.exit_code() == 1
    cover = diagnosis.coverage()
    assert cover["ran"] == 0 and cover["skipped"]["rollouts"] == 9 and cover["skipped"]["series"] == 11
    assert diagnosis.skipped["CD503"].startswith("the scalar log has none of the series it reads: entropy")
