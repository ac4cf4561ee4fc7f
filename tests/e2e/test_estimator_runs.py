"""Runs whose logged advantages come from each estimator's reference code are recognised, not flagged.

What a correct diagnosis says, from the math: the rollouts are healthy (two binary channels at steady pass rates
0.5 and 0.6, no saturation), and the logged advantage column is exactly what the named estimator computes from the
logged rewards (verl 0.9.1's own ``core_algos`` function, called per step as verl's trainer calls it). So the scan
names that estimator (``run.algorithm``, verl's ``adv_estimator`` name) and raises no CD202 warning; before the
estimator registry, every one of these runs got "logged advantages match no recomputation" (a false alarm). An
estimator that weights by response tokens cannot be recomputed without ``completion_length``; the token counts enter
only through a per-group shift or a per-step scale and shift, so the scan matches it up to those and says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor import ScanOptions, diagnose
from collapse_doctor.core.findings import Severity

# verl's own functions, called as verl's trainer calls them (the reference test's helpers; skipped without verl)
from tests.reference.test_estimators_verl import VERL_FUNCTION as VERL
from tests.reference.test_estimators_verl import verl_advantages

STEPS, GROUPS, SIZE = 40, 12, 8


def estimator_run(path: Path, name: str, *, lengths_column: bool = True, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    rows = GROUPS * SIZE
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "group_id", "fmt", "acc", "len", "adv")}
    for step in range(STEPS):
        group = np.repeat(np.arange(GROUPS), SIZE)
        difficulty = np.repeat(rng.normal(0, 0.5, GROUPS), SIZE)
        fmt = (rng.random(rows) < 1 / (1 + np.exp(difficulty))).astype(np.float32)
        acc = (rng.random(rows) < 1 / (1 + np.exp(-np.log(1.5) + difficulty))).astype(np.float32)
        lengths = rng.integers(4, 40, size=rows)
        columns["step"].append(np.full(rows, step))
        columns["group_id"].append(group)
        columns["fmt"].append(fmt)
        columns["acc"].append(acc)
        columns["len"].append(lengths)
        columns["adv"].append(verl_advantages(name, (fmt + acc).astype(np.float64), group, lengths))
    table = {
        "step": np.concatenate(columns["step"]),
        "group_id": np.concatenate(columns["group_id"]),
        "reward/format": np.concatenate(columns["fmt"]),
        "reward/accuracy": np.concatenate(columns["acc"]),
        "advantage": np.concatenate(columns["adv"]).astype(np.float32),
    }
    if lengths_column:
        table["completion_length"] = np.concatenate(columns["len"])
    pq.write_table(pa.table(table), path)
    return path


EXPECTED = {  # the catalogue's run.algorithm for each verl estimator
    "rloo": "rloo",
    "rloo_vectorized": "rloo",  # no group of one here: the loop and vectorised RLOO agree, the loop wins the tie
    "opo": "opo",
    "gpg": "gpg",
    "grpo_passk": "grpo_passk",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
    "grpo": "grpo",
}


@pytest.mark.parametrize("name", sorted(VERL))
def test_a_run_of_each_estimator_is_recognised_without_cd202(tmp_path: Path, name: str) -> None:
    diagnosis = diagnose([estimator_run(tmp_path / f"{name}.parquet", name)], ScanOptions(device="cpu"))
    assert diagnosis.run.algorithm == EXPECTED[name], diagnosis.run.algorithm_source
    assert "logged advantages match" in diagnosis.run.algorithm_source
    assert not [f for f in diagnosis.findings if f.code == "CD202"], [f.title for f in diagnosis.findings]


@pytest.mark.parametrize("name", ["opo", "reinforce_plus_plus"])
def test_a_token_weighted_estimator_without_lengths_matches_up_to_its_token_weighting(
    tmp_path: Path, name: str
) -> None:
    """Without completion_length the exact values cannot be recomputed, but the token counts only enter through a
    per-group shift (OPO) or a per-step scale and shift (REINFORCE++): the logged values still fit that shape."""
    path = estimator_run(tmp_path / f"{name}.parquet", name, lengths_column=False)
    diagnosis = diagnose([path], ScanOptions(device="cpu"))
    assert diagnosis.run.algorithm == name
    assert "up to its token weighting (not checked exactly without completion_length)" in diagnosis.run.algorithm_source
    assert not [f for f in diagnosis.findings if f.code == "CD202"]


def test_a_shape_that_rescaled_grpo_also_has_is_not_named_and_not_a_warning(tmp_path: Path) -> None:
    """REINFORCE++ with a group baseline is a per-step line in the centred total once the token counts are unknown;
    so is GRPO without scaling under weights twice as large. The fit cannot tell them apart: the run is not named
    after it, and the mismatch with the default weights is reported as not checked (info), never a warning."""
    path = estimator_run(tmp_path / "rpp.parquet", "reinforce_plus_plus_baseline", lengths_column=False)
    diagnosis = diagnose([path], ScanOptions(device="cpu"))
    assert diagnosis.run.algorithm == "unknown"
    cd202 = [f for f in diagnosis.findings if f.code == "CD202"]
    assert cd202 and all(f.severity == Severity.INFO for f in cd202)
    assert "cannot check" in cd202[0].message and "reinforce_plus_plus_baseline" in cd202[0].message


def test_inflated_grpo_without_lengths_is_still_a_mismatch(tmp_path: Path) -> None:
    """GRPO advantages times 2.5 (a stale std): no estimator gives them, not even up to token weighting (the scale
    differs group by group), so the mismatch stays a warning that names what was not checked exactly."""
    from tests.helpers import runs

    diagnosis = diagnose([runs.logged_beyond_bound_run(tmp_path / "bound.parquet")], ScanOptions(device="cpu"))
    [mismatch] = [f for f in diagnosis.findings if f.code == "CD202" and "match no" in f.title]
    assert mismatch.severity == Severity.WARNING
    assert "not checked exactly without completion_length, do not fit up to their token weighting" in mismatch.message


def test_rloo_is_told_from_batch_scaled_grpo_that_comes_within_the_tolerance(tmp_path: Path) -> None:
    """Three binary rewards at 0.5: the total's batch std is about sqrt(3/4) = 0.87, so GRPO scaled by it multiplies
    the centred total by about 1.15, and RLOO by n/(n-1) = 8/7 = 1.14. Both are within the 0.01 match of RLOO's
    logged values; the closer, RLOO itself at 0, must win (the chunk is not cut short at the first match)."""
    rng = np.random.default_rng(4)
    steps, groups, size = 30, 500, 8  # large steps: the batch std stays near sqrt(3/4)
    rows = steps * groups * size
    rewards = {f"reward/{k}": (rng.random(rows) < 0.5).astype(np.float32) for k in ("a", "b", "c")}
    total = sum(r.astype(np.float64) for r in rewards.values()).reshape(-1, size)
    logged = ((total - total.mean(axis=1, keepdims=True)) * size / (size - 1)).reshape(-1).astype(np.float32)
    table = {
        "step": np.repeat(np.arange(steps), groups * size),
        "group_id": np.tile(np.repeat(np.arange(groups), size), steps),
        **rewards,
        "advantage": logged,
    }
    path = tmp_path / "rloo.parquet"
    pq.write_table(pa.table(table), path)
    diagnosis = diagnose([path], ScanOptions(device="cpu"))
    assert float(np.nanmean(diagnosis.series["logged_mae_grpo_batch"])) < 0.01  # the near tie is there
    assert diagnosis.run.algorithm == "rloo", diagnosis.run.algorithm_source


def test_the_json_of_an_rloo_run_follows_the_schemas(tmp_path: Path) -> None:
    """run.algorithm takes every catalogue name: scan's and compare's JSON of an RLOO run validate."""
    import json

    import jsonschema
    from typer.testing import CliRunner

    from collapse_doctor.cli.app import app
    from collapse_doctor.report.schemas import schema_text

    rloo, grpo = estimator_run(tmp_path / "rloo.parquet", "rloo"), estimator_run(tmp_path / "grpo.parquet", "grpo")
    runner = CliRunner()
    scanned = runner.invoke(app, ["scan", str(rloo), "--json", str(tmp_path / "s.json"), "--device", "cpu"])
    assert scanned.exit_code in (0, 1), scanned.output
    scan_json = json.loads((tmp_path / "s.json").read_text())
    assert scan_json["run"]["algorithm"] == "rloo" and scan_json["run"]["signal"]["estimator"] == "rloo"
    jsonschema.validate(scan_json, json.loads(schema_text("scan")))
    compared = runner.invoke(
        app, ["compare", str(rloo), str(grpo), "--json", str(tmp_path / "c.json"), "--device", "cpu"]
    )
    assert compared.exit_code == 0, compared.output
    jsonschema.validate(json.loads((tmp_path / "c.json").read_text()), json.loads(schema_text("compare")))
