"""CD104 from the rollouts: the `truncated` flag, and whether the cut changes a reward inside groups.

Runs of 40 steps x 16 groups x 4 rollouts, no scalar log. Each rollout is cut with probability 0.8 (``truncated``
True, length 8 = the cap) or finishes with a length drawn from 5-7 (so finished rows are comparable: at least half
the cap). Expectations, from the construction:

- ``pays``: ``length`` = 5 per token (40 for a cut row, 25-35 for a finished one: +10 on average within a group,
  a third of its 10-point range) and ``content`` is uniform noise independent of the cut. 80% cut is above the 50%
  ``warn_share``; about 1 - 0.8^4 - 0.2^4 = 59% of groups hold both kinds, ~380 groups: CD104 warns and names
  ``length`` only, from the rollouts' flag, with a difference near +10.
- ``unchanged``: both channels uniform noise: every channel judged, none differs: CD104 is info ("the cut changes
  no reward") and the verdict stays HEALTHY.
- ``few``: 20% cut: under ``warn_share``, no finding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs

STEPS, GROUPS, SIZE, CAP = 40, 16, 4, 8


def _run(path: Path, *, cut_rate: float, pays: bool) -> Path:
    rng = np.random.default_rng(3)
    step, group = runs._frame(STEPS, GROUPS, SIZE)
    n = len(step)
    cut = rng.random(n) < cut_rate
    length = np.where(cut, CAP, rng.integers(5, 8, n))
    columns = {
        "step": step,
        "group_id": group,
        "reward/length": (5.0 * length) if pays else rng.random(n),
        "reward/content": rng.random(n),
        "completion": np.array([f"c{i}" for i in range(n)], dtype=object),
        "completion_length": length.astype(np.int64),
        "truncated": cut,
    }
    return runs.write(path, columns)


def test_a_reward_that_pays_for_the_cut_is_a_warning_from_the_rollouts(tmp_path: Path) -> None:
    diagnosis = diagnose([_run(tmp_path / "pays.parquet", cut_rate=0.8, pays=True)], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD104"]
    assert found.severity == Severity.WARNING and found.channels == ("length",)
    assert abs(found.evidence["cut_reward_difference"]["length"] - 10.0) < 1.0
    assert abs(found.evidence["cut_reward_difference"]["content"]) < 0.05
    assert found.evidence["cut_mixed_groups"]["length"] > 300
    assert abs(found.evidence["share"] - 0.8) < 0.03 and "`truncated` flag" in found.message


def test_a_cut_that_changes_no_reward_is_information(tmp_path: Path) -> None:
    diagnosis = diagnose([_run(tmp_path / "same.parquet", cut_rate=0.8, pays=False)], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD104"]
    assert found.severity == Severity.INFO and found.channels == ()
    assert "the cut changes no reward" in found.message
    assert diagnosis.verdict == "healthy"


def test_few_cut_completions_are_no_finding(tmp_path: Path) -> None:
    diagnosis = diagnose([_run(tmp_path / "few.parquet", cut_rate=0.2, pays=True)], ScanOptions.of(device="cpu"))
    assert not [f for f in diagnosis.findings if f.code == "CD104"]
    assert "CD104" not in diagnosis.skipped


def test_without_a_share_cd104_says_it_cannot_judge(tmp_path: Path) -> None:
    """No scalar log and no `truncated` column: nothing tells cut from finished; CD104 is skipped with the reason."""
    path = runs.binary_run(tmp_path / "plain.parquet", pass_rates={"a": 0.5}, steps=20)
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    assert diagnosis.skipped["CD104"].startswith("not enough data") and "truncated" in diagnosis.skipped["CD104"]
