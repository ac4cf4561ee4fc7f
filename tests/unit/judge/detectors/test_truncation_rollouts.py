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
- ``pays`` without its ``truncated`` column but with ``--max-completion-length 8``: a row is cut exactly when its
  token length is 8, so the flags, the share and the finding are the same, told by the cap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs

STEPS, GROUPS, SIZE, CAP = 40, 16, 4, 8


def _run(path: Path, *, cut_rate: float, pays: bool, flag: bool = True, tokens: bool = True) -> Path:
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
    if not flag:
        del columns["truncated"]
    if not tokens:
        del columns["completion_length"]
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


def test_the_cap_tells_the_cut_rows_by_their_token_length(tmp_path: Path) -> None:
    path = _run(tmp_path / "cap.parquet", cut_rate=0.8, pays=True, flag=False)
    without = diagnose([path], ScanOptions.of(device="cpu"))
    assert without.skipped["CD104"].startswith("not enough data")
    assert "--max-completion-length" in without.skipped["CD104"]
    diagnosis = diagnose([path], ScanOptions.of(device="cpu", max_completion_length=CAP))
    [found] = [f for f in diagnosis.findings if f.code == "CD104"]
    assert found.severity == Severity.WARNING and found.channels == ("length",)
    assert abs(found.evidence["share"] - 0.8) < 0.03
    assert "--max-completion-length" in found.message and "`truncated` flag" not in found.message
    flagged = diagnose([_run(tmp_path / "flag.parquet", cut_rate=0.8, pays=True)], ScanOptions.of(device="cpu"))
    [same] = [f for f in flagged.findings if f.code == "CD104"]
    assert same.evidence["share"] == found.evidence["share"]
    assert same.evidence["cut_reward_difference"] == found.evidence["cut_reward_difference"]
    assert not [w for w in diagnosis.run.warnings if "max-completion-length" in w]


def test_a_cap_that_cannot_be_used_says_why(tmp_path: Path) -> None:
    """The trainer's own flag wins over the cap; text lengths are characters, not comparable with a cap in tokens."""
    options = ScanOptions.of(device="cpu", max_completion_length=CAP)
    flagged = diagnose([_run(tmp_path / "flag.parquet", cut_rate=0.8, pays=True)], options)
    assert [w for w in flagged.run.warnings if "--max-completion-length is not used" in w and "'truncated'" in w]
    assert "`truncated` flag" in next(f for f in flagged.findings if f.code == "CD104").message
    text = diagnose([_run(tmp_path / "text.parquet", cut_rate=0.8, pays=True, flag=False, tokens=False)], options)
    assert [w for w in text.run.warnings if "--max-completion-length is not used" in w and "characters" in w]
    assert text.skipped["CD104"].startswith("not enough data")


@pytest.mark.parametrize("cap", [0, -3, 2.5, True])
def test_a_cap_must_be_a_positive_number_of_tokens(cap: object) -> None:
    with pytest.raises(UsageError, match="--max-completion-length"):
        ScanOptions.of(max_completion_length=cap)
