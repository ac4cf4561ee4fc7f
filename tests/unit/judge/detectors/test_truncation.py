"""CD104 length-cap truncation: built logs of each framework's tag, the conditions, support, and the real corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core import scalars as S
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.open import read_scalar_log
from collapse_doctor.judge.detectors import REGISTRY, Finding, Severity
from tests.helpers.paths import ROOT as REPO_ROOT
from tests.helpers.scalar_runs import STEPS, truncation_series, write_events, write_trainer_state

CORPUS = REPO_ROOT / "tests" / "data" / "trl_corpus"


def scan(path: Path, **options: Any) -> Diagnosis:
    return diagnose([path], ScanOptions.of(device="cpu", **options))


def cd104(diagnosis: Diagnosis) -> list[Finding]:
    return [f for f in diagnosis.findings if f.code == "CD104"]


def test_metadata() -> None:
    detector = REGISTRY["CD104"]
    assert detector.requires == () and detector.targets == "run"  # a scalar log or the rollouts' flag
    assert detector.default_severity == Severity.WARNING
    assert dict(detector.thresholds) == {
        "warn_share": 0.5,
        "all_share": 0.98,
        "channel_corr": 0.8,
        "min_points": 8,
        "within_corr": 0.3,
        "min_length_groups": 8,
        "cut_effect": 0.1,
        "share_match": 0.05,
    }


def test_fires_when_a_channel_follows_the_cut(tmp_path: Path) -> None:
    write_events(tmp_path / "run", truncation_series(share=0.9))
    (found,) = cd104(scan(tmp_path))
    assert found.severity == Severity.WARNING and found.channels == ("length",)
    assert np.isclose(found.evidence["share"], 0.9, atol=0.02)
    assert found.evidence["tag"] == "train/completions/clipped_ratio" and found.evidence["points"] == STEPS
    assert found.evidence["channel_correlation"]["length"] > 0.8
    assert found.onset_step == 0 and found.step_range == (0, STEPS - 1)
    assert "max_completion_length" in found.remedy and "mask_truncated_completions=True" in found.remedy
    assert "untruncated text" in found.remedy
    assert found.gdpo_resolves is False and "GDPO" not in found.remedy  # the cut precedes any aggregation


def test_silent_when_no_channel_follows_the_cut(tmp_path: Path) -> None:
    write_events(tmp_path / "run", truncation_series(share=0.9, tracked=False))
    assert cd104(scan(tmp_path)) == []


def test_silent_below_the_share(tmp_path: Path) -> None:
    write_events(tmp_path / "run", truncation_series(share=0.3))
    assert cd104(scan(tmp_path)) == []


def test_a_channel_that_loses_what_the_cut_removes_is_named(tmp_path: Path) -> None:
    series = truncation_series(share=0.8, tracked=False)
    clipped = series["train/completions/clipped_ratio"]
    series["train/rewards/correct_reward/mean"] = (
        1.0 - clipped + 0.005 * np.random.default_rng(1).standard_normal(STEPS)
    )
    write_events(tmp_path / "run", series)
    (found,) = cd104(scan(tmp_path))
    assert found.channels == ("correct_reward",) and found.evidence["channel_correlation"]["correct_reward"] < -0.8
    assert "fall" in found.message


def test_every_completion_cut_fires_without_a_channel(tmp_path: Path) -> None:
    series = truncation_series(tracked=False)
    series["train/completions/clipped_ratio"] = np.ones(STEPS)
    write_events(tmp_path / "run", series)
    (found,) = cd104(scan(tmp_path))
    assert found.channels == () and "practically every completion" in found.message


def test_thresholds_come_from_the_config(tmp_path: Path) -> None:
    write_events(tmp_path / "run", truncation_series(share=0.4))
    assert cd104(scan(tmp_path)) == []
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD104]\nwarn_share = 0.3\n")
    assert len(cd104(scan(tmp_path, config=config))) == 1


def test_few_points_are_not_enough_data(tmp_path: Path) -> None:
    write_events(tmp_path / "run", {tag: values[:5] for tag, values in truncation_series().items()})
    diagnosis = scan(tmp_path)
    assert cd104(diagnosis) == [] and "not enough data to judge" in diagnosis.skipped["CD104"]


def test_a_log_without_the_tag_is_not_judged(tmp_path: Path) -> None:
    series = truncation_series()
    del series["train/completions/clipped_ratio"]
    write_events(tmp_path / "run", series)
    diagnosis = scan(tmp_path)
    assert cd104(diagnosis) == [] and "truncated share" in diagnosis.skipped["CD104"]  # not judged, and said so


def test_trainer_state_json_with_trl_key_names(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    history = []
    for step in range(1, 31):
        clipped = float(np.clip(0.9 + 0.05 * rng.standard_normal(), 0, 1))
        history.append(
            {
                "step": step,
                "reward": 1.2,
                "completions/clipped_ratio": clipped,
                "rewards/length/mean": 0.5 + 0.5 * clipped,
                "rewards/length/std": 0.2,
                "rewards/digits/mean": float(0.3 + 0.02 * rng.standard_normal()),
                "rewards/digits/std": 0.3,
            }
        )
    write_trainer_state(tmp_path / "out", history)
    (found,) = cd104(scan(tmp_path / "out"))
    assert found.channels == ("length",)


# Other frameworks' tags (checked against their sources: see collapse_doctor/io/logs/tags.py)


@pytest.mark.parametrize(
    ("framework", "tag", "setting"),
    [
        ("verl", "response_length/clip_ratio", "data.max_response_length"),
        ("openrlhf", "train/rollout/truncated_rate", "--rollout.max_new_tokens"),
        ("nemo_rl", "train/truncation_rate", "policy.generation.max_new_tokens"),
    ],
)
def test_other_frameworks_tags(framework: str, tag: str, setting: str, tmp_path: Path) -> None:
    others = {
        "verl": {"critic/score/mean": 0.5, "actor/entropy": 0.7},
        "openrlhf": {"train/reward": 0.5, "train/policy_loss": 0.1},
        "nemo_rl": {"train/reward": 0.5, "train/approx_entropy": 0.7},
    }[framework]
    series = {name: np.full(STEPS, value) for name, value in others.items()}
    series[tag] = np.ones(STEPS)  # every completion cut: fires without a channel (none logged here)
    write_events(tmp_path / framework, series)
    scalars = read_scalar_log(discover_runs([tmp_path])[0])
    assert scalars is not None and scalars.framework == framework and scalars.tags[S.TRUNCATED_SHARE] == tag
    (found,) = cd104(scan(tmp_path))
    assert setting in found.remedy and found.evidence["tag"] == tag


# The real TRL corpus (tests/data/trl_corpus): expectations from manifest.json, reasoned from the reward math


def item_resolves(run: str) -> bool:
    entry = next(e for e in json.loads((CORPUS / "manifest.json").read_text())["runs"] if e["run"] == run)
    return bool(entry["expected"]["gdpo_resolves"]["TRUNCATION"]["resolves"])


def _manifest_runs(prefixes: tuple[str, ...]) -> list[str]:
    manifest = CORPUS / "manifest.json"
    if not manifest.exists():
        return []
    return sorted(r["run"] for r in json.loads(manifest.read_text())["runs"] if r["run"].startswith(prefixes))


@pytest.mark.skipif(not CORPUS.exists(), reason="the TRL corpus is not in this checkout")
@pytest.mark.parametrize("run", _manifest_runs(("truncation-",)))
def test_corpus_truncation_runs_fire_on_the_length_channel(run: str) -> None:
    expected = next(e for e in json.loads((CORPUS / "manifest.json").read_text())["runs"] if e["run"] == run)[
        "expected"
    ]
    (item,) = [e for e in expected["expect"] if e["code"] == "TRUNCATION"]
    (found,) = cd104(scan(CORPUS / run))
    assert found.severity.label == item["min_severity"] == item["max_severity"] == "warning"
    assert set(item["channels"]) <= set(found.channels)
    assert found.gdpo_resolves is item_resolves(run) is False  # truncation happens before any aggregation


@pytest.mark.skipif(not CORPUS.exists(), reason="the TRL corpus is not in this checkout")
@pytest.mark.parametrize("run", _manifest_runs(("ceiling-", "healthy-")))
def test_corpus_ceiling_and_healthy_runs_do_not_fire(run: str) -> None:
    # ~82% of their completions reach the 8-token cap too, but no reward pays a cut completion differently from a
    # finished one of its group: at most the information that the cut changes no reward, naming no channel
    diagnosis = scan(CORPUS / run)
    for found in cd104(diagnosis):
        assert found.severity == Severity.INFO and found.channels == ()
        assert "the cut changes no reward" in found.message


def _context(**values: Any) -> Any:
    from collapse_doctor.core.config import Config
    from collapse_doctor.judge.detectors.base import DetectionContext, threshold_defaults
    from tests.helpers.series import diagnose_series, make_series

    series = make_series(40, ("length_score", "answer"), **values)
    run = diagnose_series(series, codes=("CD102",)).run
    return DetectionContext(run=run, series=series, config=Config(defaults=threshold_defaults()))


def test_within_group_evidence_decides_which_channel_is_length_type() -> None:
    """Expected from the definitions: `length_score` rises with the length inside every group (pooled
    within-group correlation sxy / sqrt(sxx syy) = 10 / sqrt(100 * 1) = 1.0 >= 0.3 on 40 x 4 = 160 groups whose
    lengths vary): length-type. `answer` has no within-group co-movement (sxy = 0): whatever its step-to-step
    trend says, it is not length-type. Without length series (a run whose rollouts carry no lengths) there is
    no rollout evidence: None, and the scalar log decides."""
    detector = REGISTRY["CD104"]()
    ctx = _context(
        length_reward_sxy=np.array([10.0, 0.0]),
        length_sxx=np.array([100.0, 100.0]),
        length_reward_syy=np.array([1.0, 1.0]),
        length_groups=np.array([4.0, 4.0]),
    )
    within = detector._within_group_evidence(ctx, 0, 39)
    assert within == {"length_score": pytest.approx(1.0)}
    # identical completions: no group's lengths vary, so no channel is length-type on evidence
    collapsed = _context(
        length_reward_sxy=np.array([0.0, 0.0]),
        length_sxx=np.array([0.0, 0.0]),
        length_reward_syy=np.array([0.0, 0.0]),
        length_groups=np.array([0.0, 0.0]),
    )
    assert detector._within_group_evidence(collapsed, 0, 39) == {}
    unknown = _context(length_sxx=np.full(2, np.nan))
    assert detector._within_group_evidence(unknown, 0, 39) is None


def test_a_policy_collapsed_at_the_cap_is_not_a_length_reward() -> None:
    """tests/data/trl_corpus/mode-collapse-gdpo-s0 collapsed to 'zzzzzzzz' (8 characters, the cap): every
    completion is cut, and both channels moved with the cut share over the run (the collapse), but inside its
    groups no length varies: no channel is length-type, so none is 'clipped' (the manifest's states: `single`
    floor, `rank` ceiling)."""
    run = CORPUS / "mode-collapse-gdpo-s0"
    diagnosis = scan(run)
    states = {row["channel"]: row["state"] for row in diagnosis.channels}
    assert states == {"single": "floor", "rank": "ceiling"}
    assert all(not f.channels for f in cd104(diagnosis))
