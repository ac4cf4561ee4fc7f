"""Ground truth of the synthetic runs: each scenario shows what its metadata says it shows."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import OutputError, UsageError
from collapse_doctor.pipeline import simulate
from collapse_doctor.pipeline.simulate import (
    GROUND_TRUTH_KEY,
    SCENARIOS,
    WEIGHTS_KEY,
    SimulationSummary,
    simulate_batches,
    simulation_metadata,
    write_simulation,
)
from tests.helpers.paths import SAMPLE_LOGS

STEPS, GROUPS, SIZE = 200, 32, 8


@cache
def _table(scenario: str, seed: int = 0, onset_step: int | None = None) -> pa.Table:
    batches = simulate_batches(scenario, steps=STEPS, groups=GROUPS, group_size=SIZE, seed=seed, onset_step=onset_step)
    return pa.Table.from_batches(list(batches))


def _cube(table: pa.Table, column: str) -> np.ndarray:
    """A column as ``[steps, groups, group_size]`` (rows are sorted by step, then group)."""
    return table.column(column).to_numpy().reshape(STEPS, GROUPS, SIZE)


def _rewards(table: pa.Table) -> dict[str, np.ndarray]:
    return {c.removeprefix("reward/"): _cube(table, c) for c in table.column_names if c.startswith("reward/")}


def _truth(table: pa.Table) -> dict[str, Any]:
    return json.loads(table.schema.metadata[GROUND_TRUTH_KEY])


def _demeaned(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(axis=-1, keepdims=True)).ravel()


def _excess_kurtosis(x: np.ndarray) -> float:
    centered = x.ravel().astype(np.float64) - x.mean()
    return float((centered**4).mean() / (centered**2).mean() ** 2 - 3.0)


# --- determinism, schema, metadata ------------------------------------------------------------------


def test_same_seed_same_run_other_seed_other_run() -> None:
    first = pa.Table.from_batches(list(simulate_batches("healthy", steps=20, groups=4, group_size=8, seed=7)))
    again = pa.Table.from_batches(list(simulate_batches("healthy", steps=20, groups=4, group_size=8, seed=7)))
    other = pa.Table.from_batches(list(simulate_batches("healthy", steps=20, groups=4, group_size=8, seed=8)))
    assert first.equals(again, check_metadata=True)
    assert not first.column("reward/correct").equals(other.column("reward/correct"))


def test_row_groups_change_the_layout_not_the_values(tmp_path: Path) -> None:
    options: dict[str, Any] = {"steps": 30, "groups": 5, "group_size": 4, "seed": 3}
    one = write_simulation(tmp_path / "one.parquet", "outlier-groups", row_group_steps=1, **options)
    many = write_simulation(tmp_path / "many.parquet", "outlier-groups", row_group_steps=7, **options)
    assert pq.ParquetFile(one.path).num_row_groups == 30
    assert pq.ParquetFile(many.path).num_row_groups == math.ceil(30 / 7)
    assert pq.read_table(one.path).equals(pq.read_table(many.path), check_metadata=True)
    streamed = pa.Table.from_batches(list(simulate_batches("outlier-groups", **options)))
    assert pq.read_table(one.path).equals(streamed, check_metadata=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_schema_metadata_and_layout(tmp_path: Path, scenario: str) -> None:
    summary = write_simulation(tmp_path / f"{scenario}.parquet", scenario, steps=12, groups=6, group_size=8, seed=5)
    assert isinstance(summary, SimulationSummary)
    assert summary.rows == 12 * 6 * 8
    assert summary.steps == 12
    table = pq.read_table(summary.path)
    reward_columns = [f"reward/{c}" for c in summary.channels]
    assert table.column_names == ["step", "group_id", *reward_columns, "completion_length", "advantage"]
    types = {f.name: f.type for f in table.schema}
    assert types["step"] == pa.int64()
    assert types["group_id"] == pa.int64()
    assert types["completion_length"] == pa.int32()
    assert types["advantage"] == pa.float32()
    assert all(types[c] == pa.float32() for c in reward_columns)

    file_meta = pq.read_metadata(summary.path).metadata
    weights = json.loads(file_meta[WEIGHTS_KEY])
    truth = json.loads(file_meta[GROUND_TRUTH_KEY])
    assert tuple(weights) == summary.channels
    assert all(isinstance(w, float) and w > 0 for w in weights.values())
    assert truth == summary.ground_truth
    assert truth["scenario"] == scenario
    assert (truth["seed"], truth["steps"], truth["groups"], truth["group_size"]) == (5, 12, 6, 8)
    assert set(truth["affected_channels"]) <= set(summary.channels)
    assert truth["description"]
    assert set(truth["params"]["channels"]) == set(summary.channels)
    assert (
        file_meta[GROUND_TRUTH_KEY]
        == simulation_metadata(scenario, steps=12, groups=6, group_size=8, seed=5)[GROUND_TRUTH_KEY]
    )

    step = table.column("step").to_numpy()
    group = table.column("group_id").to_numpy()
    assert np.all(np.diff(step) >= 0)
    assert np.array_equal(np.unique(step), np.arange(12))
    order = np.lexsort((group, step))
    assert np.array_equal(order, np.arange(len(step)))
    assert all(np.array_equal(np.unique(group[step == s]), np.arange(6)) for s in range(12))
    length = table.column("completion_length").to_numpy()
    assert length.min() >= 8
    assert length.max() <= 4096
    assert 100 < np.median(length) < 600
    assert not any(table.column(c).null_count for c in table.column_names)
    assert list(tmp_path.iterdir()) == [summary.path]  # no temporary file left behind


def test_onsets_in_ground_truth() -> None:
    def onset(scenario: str, **kw: Any) -> Any:
        meta = simulation_metadata(scenario, steps=100, groups=2, group_size=4, **kw)
        return json.loads(meta[GROUND_TRUTH_KEY])["onset_step"]

    assert onset("healthy") is None
    assert onset("single-reward") is None
    assert onset("saturating-format") == 40
    assert onset("saturating-format", onset_step=70) == 70
    assert onset("tied-sums") == 0
    assert onset("collinear") == 0
    assert onset("outlier-groups") == 0
    assert onset("outlier-groups", onset_step=30) == 30


def _reference_advantage(rewards: dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
    """TRL's GRPO advantage, one group at a time."""
    total = sum(weights[c] * r.astype(np.float64) for c, r in rewards.items())
    assert isinstance(total, np.ndarray)
    out = np.zeros_like(total)
    for s in range(total.shape[0]):
        for g in range(total.shape[1]):
            values = total[s, g]
            if values.max() > values.min():
                out[s, g] = (values - values.mean()) / (values.std(ddof=1) + 1e-4)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_advantage_is_trl_grpo(scenario: str) -> None:
    table = _table(scenario)
    weights = json.loads(table.schema.metadata[WEIGHTS_KEY])
    logged = _cube(table, "advantage")
    np.testing.assert_allclose(logged, _reference_advantage(_rewards(table), weights), atol=1e-5)
    assert np.abs(logged).max() <= (SIZE - 1) / math.sqrt(SIZE) + 1e-5


# --- ground truth of each scenario ------------------------------------------------------------------


def test_single_reward_has_one_channel() -> None:
    table = _table("single-reward")
    assert list(_rewards(table)) == ["correct"]
    assert _truth(table)["affected_channels"] == []


def test_healthy_channels_keep_their_within_group_spread() -> None:
    rewards = _rewards(_table("healthy"))
    assert 2 <= len(rewards) <= 3
    for name, r in rewards.items():
        spread = r.std(axis=-1, ddof=1).mean(axis=-1)  # per step
        early, late = spread[:40].mean(), spread[-40:].mean()
        assert early > 0.1, name
        assert 0.8 < late / early < 1.25, name
        assert spread.min() > 0.5 * early, name
    assert _truth(_table("healthy"))["onset_step"] is None


def test_saturating_format_saturates_at_onset_while_correct_keeps_varying() -> None:
    table = _table("saturating-format")
    truth = _truth(table)
    onset = truth["onset_step"]
    assert onset == round(0.4 * STEPS)
    assert truth["affected_channels"] == ["format"]
    rewards = _rewards(table)
    fmt, correct = rewards["format"], rewards["correct"]
    assert set(np.unique(fmt)) <= {0.0, 1.0}
    pass_rate = fmt.mean(axis=(1, 2))
    assert pass_rate[:20].mean() < 0.5
    assert pass_rate[onset:].mean() >= 0.98
    assert pass_rate[onset:].min() >= 0.95
    # After the onset a group typically passes entirely, occasionally all but one.
    failures = (1.0 - fmt[onset:]).sum(axis=-1)
    assert (failures == 0).mean() > 0.9
    assert (failures <= 1).mean() > 0.99
    rel_gain = (fmt.max(axis=-1) - fmt.min(axis=-1)).mean(axis=-1)
    assert rel_gain[:20].mean() > 0.85
    assert rel_gain[onset:].mean() < 0.1
    correct_spread = correct.std(axis=-1, ddof=1).mean(axis=-1)
    assert correct_spread[onset:].min() > 0.5 * correct_spread[:20].mean()


def test_saturating_format_onset_can_move() -> None:
    table = _table("saturating-format", onset_step=150)
    pass_rate = _rewards(table)["format"].mean(axis=(1, 2))
    assert pass_rate[:100].mean() < 0.55
    assert pass_rate[150:].min() >= 0.95


def test_collinear_channels_are_collinear_within_groups() -> None:
    rewards = _rewards(_table("collinear"))
    rho = np.corrcoef(_demeaned(rewards["correct"]), _demeaned(rewards["verifier"]))[0, 1]
    assert 0.8 <= rho <= 0.97
    for other in ("correct", "verifier"):
        independent = np.corrcoef(_demeaned(rewards[other]), _demeaned(rewards["style"]))[0, 1]
        assert abs(independent) < 0.1
    assert _truth(_table("collinear"))["affected_channels"] == ["correct", "verifier"]


def test_tied_sums_collapse_distinct_reward_vectors() -> None:
    table = _table("tied-sums")
    rewards = _rewards(table)
    assert len(rewards) >= 3
    weights = json.loads(table.schema.metadata[WEIGHTS_KEY])
    assert len(set(weights.values())) == 1
    vectors = np.stack(list(rewards.values()), axis=-1)  # [steps, groups, size, channels]
    assert set(np.unique(vectors)) <= {0.0, 1.0}
    assert 0.35 < vectors.mean() < 0.65
    sums = vectors.sum(axis=-1)
    equal_sum = sums[..., :, None] == sums[..., None, :]
    different_vector = (vectors[..., :, None, :] != vectors[..., None, :, :]).any(axis=-1)
    tied_groups = (equal_sum & different_vector).any(axis=(-1, -2))
    assert tied_groups.mean() > 0.8
    # Tied samples get identical advantages: the information is gone.
    advantage = _cube(table, "advantage")
    s, g, i, j = np.argwhere(equal_sum & different_vector)[0]
    assert advantage[s, g, i] == advantage[s, g, j]


def test_outlier_groups_make_grpo_advantages_heavy_tailed() -> None:
    healthy = _cube(_table("healthy"), "advantage")
    outliers = _cube(_table("outlier-groups"), "advantage")
    assert _excess_kurtosis(outliers) > _excess_kurtosis(healthy) + 0.25
    assert (np.abs(outliers) > 2.0).mean() > 1.5 * (np.abs(healthy) > 2.0).mean()
    judge = _rewards(_table("outlier-groups"))["judge"]
    extreme_groups = (np.abs(judge) > 2.0).any(axis=-1)
    assert 0.05 < extreme_groups.mean() < 0.15
    assert ((np.abs(judge) > 2.0).sum(axis=-1) <= 1).all()


def test_outlier_groups_start_at_the_onset() -> None:
    judge = _rewards(_table("outlier-groups", onset_step=120))["judge"]
    assert np.abs(judge[:120]).max() <= 1.0
    assert (np.abs(judge[120:]) > 2.0).any(axis=-1).mean() > 0.05


# --- options and errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "options"),
    [
        ("no-such-scenario", {}),
        ("healthy", {"steps": 0}),
        ("healthy", {"steps": 2.5}),
        ("healthy", {"groups": 0}),
        ("healthy", {"group_size": 1}),
        ("healthy", {"group_size": True}),
        ("healthy", {"seed": -1}),
        ("healthy", {"seed": "1"}),
        ("healthy", {"groups": 1 << 22, "group_size": 8}),
        ("healthy", {"onset_step": 3}),
        ("collinear", {"onset_step": 0}),
        ("saturating-format", {"onset_step": 10}),
        ("saturating-format", {"onset_step": -1}),
        ("outlier-groups", {"onset_step": 99}),
    ],
)
def test_invalid_options_raise_usage_error(scenario: str, options: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"steps": 10, "groups": 2, "group_size": 4, **options}
    with pytest.raises(UsageError) as info:
        simulation_metadata(scenario, **kwargs)
    assert info.value.hint
    with pytest.raises(UsageError):
        simulate_batches(scenario, **kwargs)


def test_invalid_row_group_steps(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="row-group-steps"):
        write_simulation(tmp_path / "x.parquet", "healthy", steps=2, groups=2, group_size=4, row_group_steps=0)
    assert list(tmp_path.iterdir()) == []


def test_write_into_missing_folder_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        write_simulation(tmp_path / "nope" / "x.parquet", "healthy", steps=2, groups=2, group_size=4)


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run.parquet"
    target.write_bytes(b"previous")
    real = simulate._chunk_columns

    def failing(plan: Any, first: int, last: int) -> Any:
        if first > 0:
            raise RuntimeError("boom")
        return real(plan, first, last)

    monkeypatch.setattr(simulate, "_chunk_columns", failing)
    with pytest.raises(RuntimeError, match="boom"):
        write_simulation(target, "healthy", steps=5, groups=2, group_size=4, row_group_steps=1)
    assert target.read_bytes() == b"previous"
    assert list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sample_logs_match_the_generator(scenario: str) -> None:
    """sample_logs/README.md documents how these files are made; they must not go stale."""
    shipped = pq.read_table(SAMPLE_LOGS / f"{scenario}.parquet")
    fresh = pa.Table.from_batches(list(simulate_batches(scenario, steps=200, groups=16, group_size=8, seed=0)))
    assert shipped.equals(fresh, check_metadata=True)
