"""Runs a CI gate must never pass by accident: no finite reward, groups of one, runs too short to judge, empty
selections, rewards on extreme scales (issue 14, items 5, 6, 7 and 10).

The expected answers come from the math, written before the tool ran:

- every reward NaN: nothing can be recomputed, so it is an input error (exit 2), not a verdict;
- groups of one: a lone rollout is its own baseline, so every advantage is 0 under GRPO and GDPO alike: the
  strongest zero-signal finding (CD102 critical, share 1, GDPO would not resolve it);
- 1 or 3 steps: a sustained condition needs 2 x min_persistence (6) steps, so no rollout detector can judge:
  INCONCLUSIVE, which fails the gate unless ``--fail-on never``;
- advantages do not depend on a common scale of the rewards, so the same run at 1, 1e3, 1e6 and 1e10 gives the
  same findings and shares; beyond the float32 limit (1e12) it is an error naming the column and the range.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()


def _table(steps: int, groups: int, size: int, rewards: dict[str, np.ndarray]) -> pa.Table:
    n = steps * groups * size
    return pa.table(
        {
            "step": np.repeat(np.arange(steps), groups * size),
            "group_id": np.tile(np.repeat(np.arange(groups), size), steps),
            **{f"reward/{name}": values[:n] for name, values in rewards.items()},
        }
    )


def _scan_json(path: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["scan", str(path), "--format", "json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("command", ["scan", "report", "advantages"])
def test_all_nan_rewards_are_an_input_error(write_table: WriteTable, tmp_path: Path, command: str) -> None:
    nan = np.full(40 * 16 * 8, np.nan)
    path = write_table(_table(40, 16, 8, {"a": nan, "b": nan}))
    out = tmp_path / "out.file"
    extra = {"scan": [], "report": ["--html", str(out)], "advantages": ["-o", str(out)]}[command]
    result = runner.invoke(app, [command, str(path), *extra])
    assert result.exit_code == 2, result.output
    assert "no finite reward in any channel" in result.output and "reward/a" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_groups_of_one_are_the_strongest_zero_signal_finding(write_table: WriteTable) -> None:
    rng = np.random.default_rng(0)
    n = 50 * 64
    path = write_table(_table(50, 64, 1, {"a": rng.random(n), "b": (rng.random(n) < 0.5) * 1.0}))
    code, out = _scan_json(path)
    assert code == 1 and out["verdict"] == "collapsed"
    (finding,) = [f for f in out["findings"] if f["code"] == "CD102"]
    assert finding["severity"] == "critical" and finding["gdpo_resolves"] is False
    assert finding["evidence"]["zero_advantage_rollout_share"] == 1
    assert finding["evidence"]["single_rollout_group_share"] == 1
    assert "num_generations" in finding["remedy"]


@pytest.mark.parametrize("steps", [1, 3])
def test_a_run_too_short_to_judge_is_inconclusive_and_fails_the_gate(write_table: WriteTable, steps: int) -> None:
    path = write_table(make_table(steps=steps, groups=16))
    code, out = _scan_json(path)
    assert out["verdict"] == "inconclusive" and out["findings"] == [] and code == 1 and out["exit_code"] == 1
    assert all(d["status"] == "skipped" for d in out["detectors"].values())
    assert "6+" in out["detectors"]["CD101"]["reason"]
    text = runner.invoke(app, ["scan", str(path)])
    assert text.exit_code == 1 and text.stdout.startswith("INCONCLUSIVE") and "nothing judged -> exit 1" in text.stdout
    passed = runner.invoke(app, ["scan", str(path), "--fail-on", "never"])
    assert passed.exit_code == 0, passed.output
    junit = runner.invoke(app, ["scan", str(path), "--format", "github"])
    assert "::warning title=collapse-doctor::INCONCLUSIVE" in junit.stdout


def test_a_long_enough_run_is_judged(write_table: WriteTable) -> None:
    _, out = _scan_json(write_table(make_table(steps=6, groups=16)))
    assert out["verdict"] != "inconclusive" and out["detectors"]["CD101"]["status"] == "ran"


def test_a_selection_that_cannot_run_is_inconclusive(write_table: WriteTable) -> None:
    code, out = _scan_json(write_table(make_table(steps=8, groups=16)), "--only", "CD5")
    assert out["verdict"] == "inconclusive" and code == 1


def test_an_empty_selection_is_a_usage_error(write_table: WriteTable) -> None:
    result = runner.invoke(app, ["scan", str(write_table(make_table(steps=8))), "--only", "CD1", "--ignore", "CD1"])
    assert result.exit_code == 2 and "selects no detector" in result.output


def _tied_rewards(scale: float) -> dict[str, np.ndarray]:
    """Two binaries with equal weights: (1, 0) and (0, 1) tie under GRPO at any scale."""
    rng = np.random.default_rng(7)
    n = 30 * 16 * 8
    a = (rng.random(n) < 0.5) * 1.0
    b = np.where(rng.random(n) < 0.7, 1.0 - a, a)
    return {"a": a * scale, "b": b * scale}


def test_statistics_do_not_depend_on_the_reward_scale(write_table: WriteTable, tmp_path: Path) -> None:
    results = {}
    stds = {}
    for scale in (1.0, 1e3, 1e6, 1e10):
        path = write_table(_table(30, 16, 8, _tied_rewards(scale)), name=f"s{scale:g}.parquet")
        _, out = _scan_json(path)
        series = out["series"]
        results[scale] = (
            out["verdict"],
            sorted((f["code"], f["severity"]) for f in out["findings"]),
            out["run"]["signal"]["zero_advantage_rollout_share"],
            np.round(np.asarray(series["tied_pair_share"], dtype=float), 6).tolist(),
        )
        stds[scale] = np.asarray(series["adv_std_grpo"], dtype=float)
    assert any(code == "CD301" for code, _ in results[1.0][1])  # the tie is there to be found
    for scale, found in results.items():
        assert found == results[1.0], scale
        # TRL divides by (std + 1e-4): at scale 1 (group std ~0.5) that epsilon moves the advantages by 2e-4.
        np.testing.assert_allclose(stds[scale], stds[1.0], rtol=1e-3)


@pytest.mark.parametrize("scale", [1e13, 1e20, 1e300])
def test_rewards_beyond_float32_range_name_the_column(write_table: WriteTable, tmp_path: Path, scale: float) -> None:
    path = write_table(_table(30, 16, 8, _tied_rewards(scale)))
    for args in (["scan", str(path)], ["advantages", str(path), "-o", str(tmp_path / "adv.parquet")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "reward column 'reward/a'" in result.output and f"largest {scale:.3g}" in result.output
        assert "+inf" not in result.output and not (tmp_path / "adv.parquet").exists()
