"""CD105 mode collapse and CD102's silent groups by cause, on runs whose completions are logged.

The runs (tests/helpers/runs.py ``completions_run``) have two rewards that are functions of the completion text.
Expected from the math, before any scan: where every member of a group writes the same completion, both rewards
are constant in the group, so its GRPO and GDPO advantages are exactly 0 and no channel weight changes that
(w * 0 = 0); so

- a collapse from step 40 of 120 to the end: 100% of the groups of the last 12 steps hold one completion: CD105
  critical, the verdict COLLAPSED; CD102 names the cause ("one completion repeated") and proposes neither a weight
  nor an aggregation;
- a collapse that ended (steps 30-69, distinct completions again from step 70): CD105 at info, "recovered";
- the same run without its completion text: CD105 cannot judge (skipped, with the reason), never a guess.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs


def scan(path: Path) -> Diagnosis:
    return diagnose([path], ScanOptions.of(device="cpu"))


def by_code(diagnosis: Diagnosis, code: str) -> list:
    return [f for f in diagnosis.findings if f.code == code]


def test_a_collapse_that_lasts_is_critical_and_named(tmp_path: Path) -> None:
    diagnosis = scan(runs.completions_run(tmp_path / "run.parquet", collapse_from=40))
    (finding,) = by_code(diagnosis, "CD105")
    assert finding.severity == Severity.CRITICAL and diagnosis.verdict == "collapsed"
    assert finding.title == "the policy collapsed to identical completions"
    assert finding.evidence["identical_group_share_now"] == 1.0
    assert finding.evidence["groups_now"] == 12 * 16
    assert 40 <= finding.onset_step <= 46
    assert {a.kind for a in finding.actions} == {"trainer_setting"}
    assert finding.gdpo_resolves is False
    (silent,) = by_code(diagnosis, "CD102")
    assert "hold one completion repeated (mode collapse)" in silent.message
    assert not {a.kind for a in silent.actions} & {"weight", "aggregation"}, "no weighting helps"
    assert silent.evidence["cancel_group_share"] == 0.0
    causes = diagnosis.run.signal["silent_causes"]
    assert causes["identical_completions"] > 0.6 and causes["cancelling"] == 0.0
    from collapse_doctor.core.result import signal_sentence

    assert "of groups one completion repeated" in signal_sentence(diagnosis.run.signal)


def test_a_collapse_that_ended_is_information(tmp_path: Path) -> None:
    diagnosis = scan(runs.completions_run(tmp_path / "run.parquet", collapse_from=30, recover_at=70))
    (finding,) = by_code(diagnosis, "CD105")
    assert finding.severity == Severity.INFO
    assert "recovered at step" in finding.title and not finding.actions
    assert finding.evidence["identical_group_share_now"] == 0.0


def test_healthy_completions_raise_nothing(tmp_path: Path) -> None:
    diagnosis = scan(runs.completions_run(tmp_path / "run.parquet", collapse_from=None))
    assert not by_code(diagnosis, "CD105") and "CD105" not in diagnosis.skipped


def test_without_completion_text_it_cannot_judge(tmp_path: Path) -> None:
    path = runs.completions_run(tmp_path / "run.parquet", collapse_from=40)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["completion", "prompt"]), path)
    diagnosis = scan(path)
    assert not by_code(diagnosis, "CD105")
    assert "no completion text" in diagnosis.skipped["CD105"]
