"""Channel weights inferred from logged advantages (TRL keeps reward_weights only in training_args.bin), and the
``advantages`` export using the scaling the logged advantages match.

Synthetic runs log TRL 1.16's advantages (float32) computed with known weights; the real TRL runs are
tests/data/trl_corpus/weighted-* (reward_weights [1.0, 0.2]) and drowning-batch-* (scale_rewards="batch").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import collapse_doctor.pipeline.scan as pipeline
from collapse_doctor.cli.app import app
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.export import export_advantages
from collapse_doctor.pipeline.scan import INFERRED_WEIGHTS_SOURCE, diagnose

CORPUS = Path(__file__).resolve().parents[1] / "data" / "trl_corpus"
runner = CliRunner()


def _trl_advantages(rewards: np.ndarray, size: int, weights: tuple[float, ...], algo: str, scale: str) -> np.ndarray:
    """TRL 1.16 (grpo_trainer.py) for one step of consecutive groups of ``size``, in float64."""
    w = np.asarray(weights)
    if algo == "grpo":
        total = (rewards * w).sum(axis=1)
        groups = total.reshape(-1, size)
        dev = (groups - groups.mean(axis=1, keepdims=True)).reshape(-1)
        std = (
            np.repeat(groups.std(axis=1, ddof=1), size) if scale == "group" else np.full(len(total), total.std(ddof=1))
        )
        return dev if scale == "none" else dev / (std + 1e-4)
    g = rewards.reshape(-1, size, rewards.shape[1])
    z = ((g - g.mean(axis=1, keepdims=True)) / (g.std(axis=1, ddof=1, keepdims=True) + 1e-4)).reshape(rewards.shape)
    fused = (z * w).sum(axis=1)
    return (fused - fused.mean()) / (fused.std(ddof=1) + 1e-4)


def _write_run(
    path: Path,
    weights: tuple[float, ...],
    *,
    algo: str = "grpo",
    scale: str = "group",
    steps: int = 12,
    groups: int = 16,
    size: int = 8,
    constant_third: bool = False,
) -> Path:
    """A canonical Parquet run: reward/a binary, reward/b on 0-5 (a third channel if ``weights`` has three)."""
    rng = np.random.default_rng(0)
    parts = []
    for step in range(steps):
        n = groups * size
        cols = [(rng.random(n) < 0.4).astype(float), 5 * rng.random(n), rng.random(n)][: len(weights)]
        if constant_third:
            cols[2] = np.full(n, 0.5)
        rewards = np.stack(cols, axis=1)
        adv = _trl_advantages(rewards, size, weights, algo, scale).astype(np.float32)
        table = {"step": np.full(n, step), "group_id": np.repeat(np.arange(groups), size)}
        table |= {f"reward/{c}": rewards[:, k] for k, c in enumerate("abc"[: len(weights)])}
        parts.append(pa.table(table | {"advantage": adv}))
    pq.write_table(pa.concat_tables(parts), path)
    return path


@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_scan_infers_trl_reward_weights(tmp_path: Path, algo: str) -> None:
    run = diagnose([_write_run(tmp_path / "run.parquet", (1.0, 0.2), algo=algo)], ScanOptions.of(device="cpu"))
    assert run.run.weights == pytest.approx({"a": 1.0, "b": 0.2}, abs=1e-4)
    assert run.run.weights_source == INFERRED_WEIGHTS_SOURCE
    assert run.run.algorithm == algo
    assert run.run.algorithm_source.endswith("with the inferred weights")
    assert "CD202" not in {f.code for f in run.findings}
    (note,) = [w for w in run.run.warnings if "weights inferred" in w]
    assert "a=1, b=0.2" in note and "--weights overrides" in note


def test_given_weights_are_used_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_run(tmp_path / "run.parquet", (1.0, 0.2))
    passes = _count_passes(monkeypatch)
    run = diagnose([path], ScanOptions.of(device="cpu", weights={"a": 1.0, "b": 0.2}))
    assert run.run.weights == {"a": 1.0, "b": 0.2}
    assert run.run.weights_source == "--weights"
    assert run.run.algorithm == "grpo" and "CD202" not in {f.code for f in run.findings}
    assert not any("weights inferred" in w for w in run.run.warnings)
    assert passes == [1]
    # Partly given weights are the user's word too: nothing is inferred, the mismatch is reported.
    run = diagnose([path], ScanOptions.of(device="cpu", weights={"b": 1.0}))
    assert run.run.weights_source == "--weights + default 1.0"
    assert run.run.algorithm == "unknown" and "CD202" in {f.code for f in run.findings}
    assert passes == [2]


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times scans reduce rollouts (one counter, updated in place)."""
    count = [0]
    reduce = pipeline.reduce_rollouts

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        return reduce(*args, **kwargs)

    monkeypatch.setattr(pipeline, "reduce_rollouts", counted)
    return count


def test_the_second_pass_is_only_for_runs_that_need_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passes = _count_passes(monkeypatch)
    equal = diagnose([_write_run(tmp_path / "equal.parquet", (1.0, 1.0))], ScanOptions.of(device="cpu"))
    assert equal.run.weights_source == "default 1.0" and equal.run.algorithm == "grpo"
    assert passes == [1]
    diagnose([_write_run(tmp_path / "weighted.parquet", (1.0, 0.2))], ScanOptions.of(device="cpu"))
    assert passes == [3]


def test_a_channel_that_never_varies_is_named(tmp_path: Path) -> None:
    path = _write_run(tmp_path / "run.parquet", (1.0, 0.2, 1.0), constant_third=True)
    run = diagnose([path], ScanOptions.of(device="cpu"))
    # The third channel's weight changes no advantage, but b's 0.2 does: defaults match nothing.
    assert run.run.algorithm == "unknown" and run.run.weights_source == "default 1.0"
    (note,) = [w for w in run.run.warnings if "channel weights not inferred" in w]
    assert "c never varies within a group, so its weight is not identifiable" in note


def test_weights_right_only_up_to_scale_are_not_used(tmp_path: Path) -> None:
    """Unscaled GRPO (scale_rewards="none") with weights (2, 0.4): the ratio fits, the scale is unknown."""
    run = diagnose([_write_run(tmp_path / "run.parquet", (2.0, 0.4), scale="none")], ScanOptions.of(device="cpu"))
    assert run.run.weights_source == "default 1.0" and run.run.algorithm == "unknown"
    (note,) = [w for w in run.run.warnings if "up to scale" in w]
    assert "a=1, b=0.2" in note and "--weights" in note


def test_scan_json_says_where_the_weights_came_from(tmp_path: Path) -> None:
    path = _write_run(tmp_path / "run.parquet", (1.0, 0.2))
    out = tmp_path / "scan.json"
    result = runner.invoke(app, ["scan", str(path), "--json", str(out), "--device", "cpu"])
    assert result.exit_code in (0, 1), result.output
    run = json.loads(out.read_text())["run"]
    assert run["weights_source"] == INFERRED_WEIGHTS_SOURCE
    assert run["weights"] == pytest.approx({"a": 1.0, "b": 0.2}, abs=1e-4)
    assert "weights inferred from the logged advantages" in result.output


@pytest.mark.parametrize("name", ["weighted-grpo-s0", "weighted-grpo-s1", "weighted-gdpo-s0", "weighted-gdpo-s1"])
def test_real_trl_weighted_runs(name: str) -> None:
    run = diagnose([CORPUS / name], ScanOptions.of(device="cpu"))
    assert run.run.weights == pytest.approx({"digits": 1.0, "detail": 0.2}, abs=1e-4)
    assert run.run.weights_source == INFERRED_WEIGHTS_SOURCE
    assert run.run.algorithm == ("gdpo" if "-gdpo-" in name else "grpo")
    assert "CD202" not in {f.code for f in run.findings}


def test_real_trl_run_with_its_weights_given() -> None:
    options = ScanOptions.of(device="cpu", weights={"digits": 1.0, "detail": 0.2})
    run = diagnose([CORPUS / "weighted-grpo-s0"], options)
    assert run.run.weights_source == "--weights" and run.run.algorithm == "grpo"
    assert "CD202" not in {f.code for f in run.findings}


def test_real_trl_equal_weight_run_keeps_the_defaults() -> None:
    run = diagnose([CORPUS / "healthy-two-grpo-s0"], ScanOptions.of(device="cpu"))
    assert run.run.weights_source == "default 1.0" and run.run.algorithm == "grpo"
    assert not any("weights" in w for w in run.run.warnings)


@pytest.mark.parametrize("source", ["synthetic", "drowning-batch-grpo-s0", "drowning-batch-grpo-s1"])
def test_export_uses_the_scaling_the_logged_advantages_match(tmp_path: Path, source: str) -> None:
    path = _write_run(tmp_path / "run.parquet", (1.0, 1.0), scale="batch") if source == "synthetic" else CORPUS / source
    summary = export_advantages([path], tmp_path / "adv.parquet", device="cpu")
    assert summary.scale == "batch"
    assert summary.scale_source == "detected: the logged advantages match GRPO with --scale batch"
    table = pq.read_table(tmp_path / "adv.parquet")
    np.testing.assert_allclose(table["adv/grpo"].to_numpy(), table["advantage"].to_numpy(), atol=1e-5)
    meta = json.loads(table.schema.metadata[b"collapse_doctor.advantages"])
    assert meta["scale"] == "batch" and meta["scale_source"].startswith("detected")
    # An explicit --scale always wins.
    summary = export_advantages([path], tmp_path / "group.parquet", device="cpu", scale="group")
    assert (summary.scale, summary.scale_source) == ("group", "--scale")
    group = pq.read_table(tmp_path / "group.parquet")["adv/grpo"].to_numpy()
    assert np.abs(group - table["advantage"].to_numpy()).max() > 0.1


def test_export_cli_says_which_scale_and_why(tmp_path: Path) -> None:
    out = tmp_path / "adv.parquet"
    result = runner.invoke(app, ["advantages", str(CORPUS / "drowning-batch-grpo-s0"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    # The file is the result; the `wrote` line that says how it was made is on stderr (stdout may be the file).
    assert result.stdout == "" and result.stderr.startswith(f"wrote {out} (")
    assert "scale batch (detected: the logged advantages match GRPO with --scale batch)" in result.stderr
    result = runner.invoke(app, ["advantages", str(CORPUS / "drowning-batch-gdpo-s0"), "-o", str(out)])
    assert "scale group (default: the logged advantages match GDPO, which --scale does not change)" in result.stderr
    unlogged = tmp_path / "unlogged.parquet"
    pq.write_table(
        pq.read_table(_write_run(tmp_path / "run.parquet", (1.0, 1.0))).drop_columns(["advantage"]), unlogged
    )
    result = runner.invoke(app, ["advantages", str(unlogged), "-o", str(out)])
    assert "scale group (default: no logged advantage column)" in result.stderr and result.stdout == ""


def test_weights_in_the_file_metadata_are_not_second_guessed(tmp_path: Path) -> None:
    path = _write_run(tmp_path / "run.parquet", (1.0, 0.2))
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({"collapse_doctor.weights": json.dumps({"a": 1.0})}), path)
    run = diagnose([path], ScanOptions.of(device="cpu"))
    assert run.run.weights_source == "file metadata + default 1.0"
    assert run.run.algorithm == "unknown" and not any("weights" in w for w in run.run.warnings)
    run = diagnose([path], ScanOptions.of(device="cpu", weights={"b": 0.2}))
    assert run.run.weights_source == "--weights + file metadata" and run.run.algorithm == "grpo"
