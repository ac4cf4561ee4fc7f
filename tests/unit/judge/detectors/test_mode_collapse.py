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


def test_null_texts_are_not_a_collapse(tmp_path: Path) -> None:
    """A completion column that is all null logged no text: nothing can be said about collapse (skipped), and
    partly null groups never count as one completion repeated."""
    import pyarrow as pa

    path = runs.completions_run(tmp_path / "run.parquet", collapse_from=None)
    table = pq.read_table(path)
    nulls = pa.nulls(table.num_rows, pa.string())
    pq.write_table(table.set_column(table.column_names.index("completion"), "completion", nulls), path)
    diagnosis = scan(path)
    assert not by_code(diagnosis, "CD105") and "no completion text" in diagnosis.skipped["CD105"]
    assert diagnosis.run.signal["silent_causes"]["identical_completions"] is None


def test_a_collapse_that_lasts_on_one_prompt_a_step_is_not_recovered(tmp_path: Path) -> None:
    """One group a step, 60 steps, identical completions from step 30 to the last: the last 6 steps (10%) hold 6
    groups, fewer than min_groups (8), so the window widens to the last 8 steps (8 groups, all identical). The
    stretch reaches the last step: the collapse has not recovered, and it is critical."""
    diagnosis = scan(runs.completions_run(tmp_path / "run.parquet", collapse_from=30, groups=1, steps=60))
    (finding,) = by_code(diagnosis, "CD105")
    assert finding.severity == Severity.CRITICAL and "recovered" not in finding.title
    assert finding.evidence["groups_now"] == 8 and finding.evidence["identical_group_share_now"] == 1.0


def test_an_ended_collapse_does_not_ask_to_change_the_policy(tmp_path: Path) -> None:
    diagnosis = scan(runs.completions_run(tmp_path / "run.parquet", collapse_from=20, recover_at=60, steps=200))
    assert [f.severity for f in by_code(diagnosis, "CD105")] == [Severity.INFO], "the ended collapse is reported"
    for finding in diagnosis.findings:
        if finding.code in ("CD102", "CD105"):
            assert not any(a.kind == "trainer_setting" and a.setting == "learning_rate" for a in finding.actions)
