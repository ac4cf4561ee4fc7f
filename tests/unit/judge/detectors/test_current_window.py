"""The current-window rule (``judge.detectors.base.CURRENT_WINDOW_RULE``), on runs built so the answer follows from
the construction.

Each run has 100 steps of 16 groups of 8 rollouts and one continuous channel (uniform noise, so a group that is not
silenced varies). A silenced group gets one value for all its members, so it is silent under GRPO (and GDPO) and
its 8 rollouts carry zero advantage; the share of silenced groups per step is the zero-advantage share. The
current window of 100 steps is the last 10 (10% of the steps, the persistence window is 5).

- ``lasting``: 60% silenced at steps 20-79, 90% at steps 80-99. Over the whole stretch (steps 20-99) the share is
  (60 * 60% + 20 * 90%) / 80 = 67.5%, under CD102's 80% critical cut; over the current window it is 90%. The
  condition holds through the current window, so it is graded there: CRITICAL, verdict COLLAPSED.
- ``ended``: 60% silenced at steps 20-59, none after. The condition ended 40 steps before the current window:
  INFO, "recovered at step N" with N about 60 (the smoothed share crosses the 50% cut within half its 11-step
  window of step 60), ``recovered_step`` N, no actions, and the verdict HEALTHY.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.smoothing import persistent_onset
from collapse_doctor.judge.detectors import Severity
from tests.helpers import runs

STEPS, GROUPS, SIZE = 100, 16, 8


def _silenced_run(path: Path, share_at: dict[tuple[int, int], float]) -> Path:
    rng = np.random.default_rng(0)
    step, group = runs._frame(STEPS, GROUPS, SIZE)
    reward = rng.random(len(step)).reshape(STEPS, GROUPS, SIZE)
    for (first, last), share in share_at.items():
        silenced = round(share * GROUPS)
        reward[first : last + 1, :silenced, :] = 0.5  # one value for every member of the group
    return runs.write(path, {"step": step, "group_id": group, "reward/quality": reward.reshape(-1)})


def test_a_condition_that_lasts_is_graded_on_the_current_window(tmp_path: Path) -> None:
    path = _silenced_run(tmp_path / "lasting.parquet", {(20, 79): 0.6, (80, 99): 0.9})
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD102"]
    assert found.severity == Severity.CRITICAL and found.recovered_step is None
    assert 0.6 < found.evidence["zero_advantage_rollout_share"] < 0.75  # the stretch alone would say warning
    assert abs(found.evidence["zero_advantage_rollout_share_now"] - 0.875) < 0.03  # 14 of 16 groups, last 10 steps
    assert "over the last 10 steps" in found.message
    assert diagnosis.verdict == "collapsed"


def test_a_condition_that_ended_is_information_with_the_step_it_recovered_at(tmp_path: Path) -> None:
    path = _silenced_run(tmp_path / "ended.parquet", {(20, 59): 0.6})
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    [found] = [f for f in diagnosis.findings if f.code == "CD102"]
    assert found.severity == Severity.INFO
    assert found.recovered_step is not None and 55 <= found.recovered_step <= 65
    assert found.title.endswith(f"; recovered at step {found.recovered_step}")
    assert found.actions == () and found.remedy.startswith("if it returns: ")
    assert found.to_dict()["recovered_step"] == found.recovered_step
    assert diagnosis.verdict == "healthy"


def test_a_condition_that_holds_in_most_of_the_current_window_has_not_recovered() -> None:
    """No sustained episode (5 rows) reaches the last 10 rows, but the condition holds in 6 of them (a statistic
    flapping around its cut): not recovered. Absent from all of them: recovered at the row after the stretch."""
    from collapse_doctor.core.config import Config
    from collapse_doctor.judge.detectors.base import DetectionContext

    flapping = np.zeros(100, dtype=bool)
    flapping[20:88] = True
    flapping[[90, 92, 94, 96, 98, 99]] = True
    stretch = persistent_onset(flapping, 5)
    assert stretch == (20, 87)
    series_steps = np.arange(1, 101)

    class _Series:
        steps = series_steps
        num_steps = 100

    ctx = DetectionContext.__new__(DetectionContext)
    object.__setattr__(ctx, "config", Config())
    object.__setattr__(ctx, "series", _Series())
    assert ctx.recovered_at(stretch) is None
    ended = flapping.copy()
    ended[88:] = False
    assert ctx.recovered_at(persistent_onset(ended, 5)) == 89  # the step of row 88
