"""`collapse-doctor scan` on tracker files the real libraries wrote: the same diagnosis as the TensorBoard log of
the same values, runs picked with --run, and one line with exit 2 for bad tracker files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.paths import SAMPLE_LOGS
from tests.helpers.trackers import Corpus, shared_tracker_corpus

runner = CliRunner()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_tracker_corpus(tmp_path_factory)


def scan(*args: str | Path) -> Any:
    return runner.invoke(app, ["scan", *map(str, args), "--device", "cpu"])


def _findings(result: Any, run: str | None = None) -> list[tuple[Any, ...]]:
    data = json.loads(result.stdout)
    if run is not None:
        data = next(r for r in data["runs"] if r["run"]["name"] == run)
    return [
        (f["code"], f["severity"], f["onset_step"], tuple(f["step_range"] or ()), tuple(f["channels"]))
        for f in data["findings"]
    ]


@pytest.mark.parametrize(
    ("where", "run"),
    [
        (lambda c: c.wandb.parent, lambda c: c.wandb_runs["trl-collapsed"].name),
        (lambda c: c.trackio, lambda c: "trl-project/trl-collapsed"),
        (lambda c: c.mlflow_db.parent, lambda c: "mlflow/trl-collapsed"),
        (lambda c: c.mlruns.parent, lambda c: None),
    ],
    ids=["wandb", "trackio", "mlflow_db", "mlflow_files"],
)
def test_a_trl_run_through_each_tracker_gets_the_tensorboard_diagnosis(corpus: Corpus, where: Any, run: Any) -> None:
    expected = scan(corpus.events_trl, "--format", "json")
    assert expected.exit_code == 1
    findings = _findings(expected)
    assert {"CD503", "CD504"} <= {f[0] for f in findings}  # the entropy collapse the series hold
    name = run(corpus)
    path = where(corpus)
    result = scan(path, "--format", "json", *(["--run", name] if name else []))
    assert result.exit_code == 1, result.output
    assert _findings(result) == findings


def test_a_verl_run_through_each_tracker_gets_the_tensorboard_diagnosis(corpus: Corpus) -> None:
    findings = _findings(scan(corpus.events_verl, "--format", "json"))
    assert "CD503" in {f[0] for f in findings}
    wandb = scan(corpus.wandb, "--format", "json")
    assert _findings(wandb, f"{corpus.wandb_runs['verl-collapsed'].name}") == findings
    assert _findings(scan(corpus.trackio, "--format", "json"), "verl-project/verl-collapsed") == findings
    assert _findings(scan(corpus.mlflow_db, "--format", "json"), "mlflow/verl-collapsed") == findings


def test_a_database_scans_every_run_and_run_picks_one(corpus: Corpus) -> None:
    result = scan(corpus.trackio / "trl-project.db", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert {r["run"]["name"]: r["verdict"] for r in data["runs"]} == {
        "trl-project/trl-collapsed": "collapsed",
        "trl-project/trl-healthy": "healthy",
    }
    healthy = scan(corpus.trackio / "trl-project.db", "--run", "trl-healthy", "--fail-on", "warning")
    assert healthy.exit_code == 0, healthy.output
    missing = scan(corpus.trackio, "--run", "nope")
    assert missing.exit_code == 2 and "--run 'nope' matches no run" in missing.stderr


def test_a_run_with_no_metrics_is_exit_2_alone_and_a_warning_among_others(corpus: Corpus) -> None:
    alone = scan(corpus.mlflow_db, "--run", "no-metrics")
    assert alone.exit_code == 2 and "holds no scalar points" in alone.stderr
    together = scan(corpus.mlflow_db, "--format", "json")
    assert together.exit_code == 1
    names = [r["run"]["name"] for r in json.loads(together.stdout)["runs"]]
    assert sorted(names) == ["mlflow/no-metrics", "mlflow/trl-collapsed", "mlflow/verl-collapsed"]


def _one_line_exit_2(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_tracker_files_are_one_line_exit_2(corpus: Corpus, tmp_path: Path) -> None:
    _one_line_exit_2(scan(corpus.empty_db), "mlflow.db: holds no runs")
    garbage = tmp_path / "runs.db"
    garbage.write_bytes(b"\x00garbage" * 512)
    _one_line_exit_2(scan(garbage), "runs.db: not an SQLite database")
    data = bytearray(next(corpus.wandb_runs["trl-collapsed"].glob("*.wandb")).read_bytes())
    data[50_000] ^= 0x01
    corrupt = tmp_path / "wandb" / "run-20261201_000000-bad" / "run-bad.wandb"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(bytes(data))
    _one_line_exit_2(scan(corrupt), "run-bad.wandb: corrupt W&B record at byte", "checksum mismatch")
    headless = tmp_path / "run-headless.wandb"
    headless.write_bytes(b"no header here" * 10)
    _one_line_exit_2(scan(headless), "not a W&B run file")


def test_a_wandb_run_still_being_written_is_scanned_with_a_warning(corpus: Corpus, tmp_path: Path) -> None:
    data = next(corpus.wandb_runs["trl-collapsed"].glob("*.wandb")).read_bytes()
    live = tmp_path / "wandb" / "run-20261201_000000-live" / "run-live.wandb"
    live.parent.mkdir(parents=True)
    # The corpus is written by wandb itself, so a cut at a fixed offset may fall on a record boundary (a complete
    # file, no warning: seen once in CI); two cuts a byte apart cannot both (a record header alone is 7 bytes)
    seen = []
    for extra in (5, 6):
        live.write_bytes(data[: len(data) * 2 // 3 + extra])
        result = scan(tmp_path, "--format", "json")
        assert result.exit_code in (0, 1), result.output
        seen.append(json.loads(result.stdout)["run"]["warnings"])
    assert any("last record incomplete" in w for warnings in seen for w in warnings), seen


def test_sibling_parquet_runs_in_sample_logs_are_scanned_one_by_one(tmp_path: Path) -> None:
    result = scan(SAMPLE_LOGS, "--format", "json", "--fail-on", "never")
    assert result.exit_code == 0, result.output
    runs = {r["run"]["name"]: r for r in json.loads(result.stdout)["runs"]}
    singles = sorted(p.stem for p in SAMPLE_LOGS.glob("*.parquet"))
    assert set(singles) | {"demo-grpo", "demo-gdpo"} <= set(runs)
    for name in singles:
        alone = json.loads(scan(SAMPLE_LOGS / f"{name}.parquet", "--format", "json").stdout)
        assert [f["code"] for f in runs[name]["findings"]] == [f["code"] for f in alone["findings"]], name
    # The demo run's part files are one run, with both of its event dirs as its scalar log.
    demo = runs["demo-grpo"]["run"]
    assert demo["steps"] == 100 and len([s for s in demo["sources"] if "tfevents" in s]) == 2
    assert "trl-tensorboard/runs/Nov30_12-00-00_trainer" in runs
    copy = tmp_path / "copy"
    shutil.copytree(SAMPLE_LOGS / "demo-grpo", copy)
    assert json.loads(scan(copy, "--format", "json").stdout)["run"]["steps"] == 100
