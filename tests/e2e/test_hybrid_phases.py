"""A run that switched from summed rewards (GRPO) to per-channel normalisation (GDPO) is judged phase by phase.

The run: `simulate saturating-format` (a format channel saturates while a continuous correctness score keeps
ranking), 120 steps, with the rollouts' ``aggregation`` column saying GRPO for steps 0-59 and GDPO from step 60,
as `retrain` writes it for ``hybrid_switch = 60``; the logged advantages are dropped, so the column is the only
record of the aggregation. What a correct diagnosis says, from the math:

- under GRPO the saturated format channel's within-group spread vanishes from the summed reward while the score's
  spread is small, so the share of groups and rollouts with no ranking signal grows: CD402 fires (its onset at
  step 11, well inside the GRPO phase; on the same data judged under GDPO the per-channel z-scores keep the
  score's ranking, which is why CD402 says GDPO resolves it);
- from step 60 the run trains under GDPO, so the run as it trains now shows no CD402: the verdict is healthy,
  and the GRPO phase's CD402 is history, reported as information naming its phase and its severity there;
- judged under one aggregation (the column ignored, or ``--algo grpo``) the whole run is AT RISK: the false alarm
  this issue removes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.result import Phase
from collapse_doctor.pipeline.scan import aggregation_phases
from collapse_doctor.pipeline.simulate import write_simulation
from tests.unit.report.test_outputs import SCHEMA

runner = CliRunner()
SWITCH = 60


def _hybrid(tmp_path: Path, labels: Any = None, *, column: bool = True) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "sat.parquet"
    write_simulation(source, "saturating-format", steps=120, groups=64, group_size=8)  # the CLI defaults
    table = pq.read_table(source).drop(["advantage"])
    steps = table.column("step").to_numpy()
    if column:
        values = labels(steps) if labels is not None else np.where(steps < SWITCH, "grpo", "gdpo-dynamic")
        table = table.append_column("aggregation", pa.array(values.tolist(), pa.string()))
    path = tmp_path / "hybrid.parquet"
    pq.write_table(table, path)
    return path


def _scan(path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["scan", str(path), "--format", "json", *extra])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_each_phase_is_judged_under_its_own_aggregation(tmp_path: Path) -> None:
    code, document = _scan(_hybrid(tmp_path))
    jsonschema.validate(document, SCHEMA)
    run = document["run"]
    assert run["phases"] == [
        {"algorithm": "grpo", "step_range": [0, SWITCH - 1]},
        {"algorithm": "gdpo", "step_range": [SWITCH, 119]},
    ]
    assert run["algorithm"] == "gdpo" and "GRPO steps 0-59, then GDPO steps 60-119" in run["algorithm_source"]
    assert (code, document["verdict"]) == (0, "healthy")
    assert not [f for f in document["findings"] if f["severity"] in ("warning", "critical")]
    history = [f for f in document["findings"] if f["code"] == "CD402"]
    assert len(history) == 1 and history[0]["severity"] == "info"
    assert history[0]["message"].startswith(
        "Before the switch to GDPO at step 60 (judged under GRPO, steps 0-59, where it was warning): "
    )
    assert history[0]["evidence"]["phase"] == "GRPO steps 0-59" and history[0]["onset_step"] < SWITCH
    assert run["signal"]["algorithm"] == "gdpo"  # the budget of the run as it trains now


def test_one_aggregation_for_the_whole_run_is_the_false_alarm(tmp_path: Path) -> None:
    for path, extra in ((_hybrid(tmp_path / "a", column=False), ()), (_hybrid(tmp_path / "b"), ("--algo", "grpo"))):
        code, document = _scan(path, *extra)
        assert (code, document["verdict"]) == (1, "at_risk") and "phases" not in document["run"]
        assert any(f["code"] == "CD402" and f["severity"] == "warning" for f in document["findings"])


def test_text_output_names_the_phases(tmp_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(_hybrid(tmp_path))])
    assert result.exit_code == 0
    assert "GRPO steps 0-59, then GDPO steps 60-119; each phase judged under its own" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("labels", "phases", "warning"),
    [
        ({0: "grpo", 1: "grpo"}, (), None),  # one aggregation: no phases, the column names the algorithm
        ({0: "sum_then_normalize", 1: "normalize_then_sum"}, (Phase(0, 0, "grpo"), Phase(1, 1, "gdpo")), None),
        ({0: "grpo", 1: "ppo"}, (), "the 'aggregation' column holds 'ppo'"),
    ],
)
def test_aggregation_column_values(labels: dict[int, str], phases: tuple[Phase, ...], warning: str | None) -> None:
    (algorithm, _), found, notes = aggregation_phases(labels, "auto", ("unknown", "no logged advantage column"))
    assert found == phases
    assert notes[0].startswith(warning) if warning else notes == ()
    if not phases and not warning:
        assert algorithm == "grpo"


def test_unknown_values_are_a_warning_and_the_run_is_judged_as_before(tmp_path: Path) -> None:
    path = _hybrid(tmp_path, labels=lambda steps: np.where(steps < SWITCH, "grpo", "ppo"))
    code, document = _scan(path)
    assert "phases" not in document["run"] and code == 1
    assert any("the 'aggregation' column holds 'ppo'" in w for w in document["run"]["warnings"])


def test_watch_judges_the_phases_too(tmp_path: Path) -> None:
    from collapse_doctor.pipeline.incremental import IncrementalScan

    (diagnosis,) = IncrementalScan().diagnose_runs([_hybrid(tmp_path)])
    assert [p.label() for p in diagnosis.run.phases] == ["GRPO steps 0-59", "GDPO steps 60-119"]
    assert diagnosis.verdict == "healthy"


def test_a_last_phase_too_short_to_judge_is_inconclusive(tmp_path: Path) -> None:
    """Switched 4 steps before the end: fewer steps than the rollout detectors need (6), so the run as it trains
    now cannot be judged; the GRPO phase's findings (information now) do not make it healthy."""
    path = _hybrid(tmp_path, labels=lambda steps: np.where(steps < 116, "grpo", "gdpo"))
    code, document = _scan(path)
    assert (code, document["verdict"]) == (1, "inconclusive")
    assert document["findings"] and all(f["severity"] == "info" for f in document["findings"])
    reasons = [d["reason"] for d in document["detectors"].values() if d["status"] == "skipped"]
    assert reasons and all(r.startswith("GDPO phase since step 116: ") for r in reasons)


def test_steps_without_a_label_belong_to_the_phase_around_them(tmp_path: Path) -> None:
    """Labels on steps 10-109 only: steps 0-9 are judged with the first phase, 110-119 with the last."""
    path = _hybrid(tmp_path, labels=lambda steps: np.where(steps < 10, None, np.where(steps < SWITCH, "grpo", "gdpo")))
    labelled = pq.read_table(path)
    steps = labelled.column("step").to_numpy()
    values = np.where(steps < 10, None, np.where(steps < SWITCH, "grpo", "gdpo")).astype(object)
    values[steps >= 110] = None
    pq.write_table(labelled.drop(["aggregation"]).append_column("aggregation", pa.array(values.tolist())), path)
    code, document = _scan(path)
    assert document["run"]["phases"] == [
        {"algorithm": "grpo", "step_range": [10, SWITCH - 1]},
        {"algorithm": "gdpo", "step_range": [SWITCH, 109]},
    ]
    history = [f for f in document["findings"] if f["code"] == "CD402"]
    assert history and history[0]["onset_step"] == 11  # found on the first phase from step 0, as without labels
    assert (code, document["verdict"]) == (0, "healthy")


def test_retrain_from_scan_does_not_act_on_history(tmp_path: Path) -> None:
    from collapse_doctor.retrain.from_scan import scan_advice
    from collapse_doctor.retrain.rewards import parse_rewards

    out = tmp_path / "scan.json"
    result = runner.invoke(app, ["scan", str(_hybrid(tmp_path)), "--json", str(out)])
    assert result.exit_code == 0
    specs = parse_rewards(["format=format_tag", "correct=exact_match"])
    advice = scan_advice(out, specs, {s.name: 1.0 for s in specs})
    assert not advice.wants_gdpo and advice.weights == {"format": 1.0, "correct": 1.0}
    assert "CD402: from the GRPO steps 0-59 phase, before the switch; not applied" in advice.changes
