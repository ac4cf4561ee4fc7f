"""TRL's completions table as W&B and Trackio keep it: the rollouts of a run that wrote no Parquet (RLOOTrainer).

The runs are trained here by TRL's own trainers on the tiny model, logging to wandb (offline) and trackio
(``report_to=["wandb", "trackio"]``, ``log_completions=True``, ``logging_steps=1``), with CollapseDoctorCallback
beside them where a test compares the two sources. What a correct diagnosis says, and why (from TRL's code and the
math, before running the tool):

- RLOO, ``beta=0``: TRL's advantage is ``t_i - mean of the other completions of the prompt`` (``t``: the rewards
  weighted by ``reward_weights`` = 1, 0.5, 2), which ``rloo`` recomputes from the table's rows: the run is named
  ``rloo`` with no CD202, the weights are the config's (1, 0.5, 2), and it has 6 steps of 16 rollouts (TRL logs the
  last batch again when training ends: that table is the same batch and is read once, so 96 rows, not 112).
- The same run through the callback's rollouts, the W&B tables and the Trackio table is one run: the same verdict,
  findings, algorithm, weights and every per-step series computed from rewards and advantages (the table has no
  token lengths, so series of lengths and of the token-weighted estimators differ, as they should).
- RLOO, ``beta=0.05`` (TRL's default): the advantages hold ``-beta * KL``, which the rows lack: not compared, said
  once, no CD202; with nothing to fingerprint the run is named ``rloo`` from its config (the callback's rollouts
  from their metadata), and it is judged as the callback's rollouts of it are.
- GRPO writes ``completions/*.parquet`` as well as the W&B table: with wandb's directory in the output dir, the
  output dir is one run, read from the Parquet, the tables set aside with why; the W&B run directory alone is the
  same rollouts, with the config's weights.
- ``log_unique_prompts=True`` keeps one completion per prompt: no group to recompute: exit 2 with one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from tests.helpers.s3 import S3Server, s3_server  # noqa: F401  (the session fixture)
from tests.helpers.trl_trackers import TRACKIO_PROJECT, train_with_trackers

pytest.importorskip("trl")
pytest.importorskip("wandb")
pytest.importorskip("trackio")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tracker_tables")]
runner = CliRunner()
LENGTH_SERIES = ("completion_length", "cut_", "length_", "logged_mae_opo", "logged_shape_mae_")
"""Series that need token lengths (or the truncation flag) the tracker tables do not carry."""
TOKEN_WEIGHTED = ("gdpo_verl", "reinforce_plus_plus")


def scan_json(path: Path | str, *args: str) -> tuple[int, dict[str, Any], str]:
    result = runner.invoke(app, ["scan", str(path), "--format", "json", "--device", "cpu", *args])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def wandb_dir(out: Path, trackers: str = "trackers") -> Path:
    return next((out / trackers / "wandb").glob("offline-run-*"))


def trackio_db(out: Path, trackers: str = "trackers") -> Path:
    return out / trackers / "trackio" / f"{TRACKIO_PROJECT}.db"


@pytest.fixture(scope="module")
def rloo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rloo")
    train_with_trackers(out, "--rloo", "--callback")
    return out


@pytest.fixture(scope="module")
def rloo_kl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rloo_kl")
    train_with_trackers(out, "--rloo", "--beta", "0.05", "--callback")
    return out


def test_an_rloo_run_is_read_from_its_wandb_tables(rloo: Path) -> None:
    code, data, _ = scan_json(wandb_dir(rloo))
    assert code == 0, data
    run = data["run"]
    assert run["algorithm"] == "rloo"
    assert run["weights"] == {"format_tag": 1.0, "graded": 0.5, "sometimes": 2.0}
    assert (run["steps"], run["rollouts"], run["groups"]) == (6, 96, 24)
    assert "CD202" not in {f["code"] for f in data["findings"]}


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("verdict", "exit_code"):
        assert a[key] == b[key]
    for key in ("algorithm", "weights", "steps", "rollouts", "groups", "channels", "signal", "step_range"):
        assert a["run"][key] == b["run"][key], key
    assert [(f["code"], f["severity"], f["channels"], f["step_range"]) for f in a["findings"]] == [
        (f["code"], f["severity"], f["channels"], f["step_range"]) for f in b["findings"]
    ]
    compared = [
        name
        for name in a["series"]
        if not name.startswith(LENGTH_SERIES) and not any(t in name for t in TOKEN_WEIGHTED)
    ]
    assert len(compared) > 40
    for name in compared:
        assert a["series"][name] == b["series"][name], name


def test_callback_rollouts_wandb_tables_and_the_trackio_table_give_one_answer(rloo: Path) -> None:
    _, callback, _ = scan_json(rloo / "train")
    _, wandb, _ = scan_json(wandb_dir(rloo))
    _, trackio, _ = scan_json(trackio_db(rloo))
    assert callback["run"]["algorithm"] == "rloo"
    _same_run(callback, wandb)
    _same_run(callback, trackio)


def test_rloo_with_a_kl_penalty_is_not_compared_and_raises_no_false_alarm(rloo_kl: Path) -> None:
    _, callback, _ = scan_json(rloo_kl / "train")
    assert len([w for w in callback["run"]["warnings"] if "KL penalty" in w]) == 1  # the callback's rollouts say why
    for path in (wandb_dir(rloo_kl), trackio_db(rloo_kl)):
        code, data, _ = scan_json(path)
        assert code == 0
        assert "CD202" not in {f["code"] for f in data["findings"]}
        assert not data["run"]["logged_advantage"]
        said = [w for w in data["run"]["warnings"] if "KL penalty" in w]
        assert len(said) == 1 and "beta=0.05" in said[0]
        assert data["run"]["algorithm"] == "rloo" and "config" in data["run"]["algorithm_source"]
        _same_run(callback, data)


def test_a_grpo_output_dir_reads_its_parquet_and_sets_the_wandb_tables_aside(tmp_path: Path) -> None:
    train_with_trackers(tmp_path, "--steps", "3", in_output_dir=True)
    _, data, _ = scan_json(tmp_path / "train")
    assert "runs" not in data, "one training is one run"
    assert data["run"]["algorithm"] == "grpo"
    assert data["run"]["rollouts"] == 48
    assert any(s.startswith(str(tmp_path / "train" / "completions")) for s in data["run"]["sources"])
    aside = data["run"]["set_aside"]
    assert len(aside) == 1 and "W&B completions table" in aside[0]
    _, tables, _ = scan_json(wandb_dir(tmp_path, "train"))
    assert tables["run"]["algorithm"] == "grpo" and tables["run"]["rollouts"] == 48
    assert tables["run"]["weights"] == {"format_tag": 1.0, "graded": 0.5, "sometimes": 2.0}


def test_unique_prompts_leave_no_group_and_say_so(tmp_path: Path) -> None:
    train_with_trackers(tmp_path, "--rloo", "--steps", "2", "--unique-prompts")
    result = runner.invoke(app, ["scan", str(wandb_dir(tmp_path)), "--device", "cpu"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 2 and "log_unique_prompts=True" in lines[0]
    assert "Traceback" not in result.output


def test_watch_of_a_wandb_run_whose_tables_arrive_equals_scan(rloo: Path, tmp_path: Path) -> None:
    """watch follows the W&B run directory while its tables are written (half of them at the first poll); after its
    last poll it judges the run as scan does."""
    import shutil

    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose_runs
    from collapse_doctor.pipeline.watch import watch
    from tests.e2e.test_one_pipeline import answer

    run = tmp_path / "run"
    shutil.copytree(wandb_dir(rloo), run)
    tables = sorted((run / "files" / "media" / "table").glob("completions_*.table.json"))
    later = tables[len(tables) // 2 :]
    aside = tmp_path / "later"
    aside.mkdir()
    for f in later:
        f.rename(aside / f.name)

    def arrive(_: float) -> None:
        for f in later:
            (aside / f.name).rename(f)

    state = watch([run], ScanOptions(), interval=0.0, max_polls=2, sleep=arrive)
    assert state.scans == 2
    [scanned] = diagnose_runs([run], ScanOptions())
    assert scanned.run.algorithm == "rloo" and scanned.run.rollouts == 96
    assert answer(state.diagnoses[scanned.run.name or ""]) == answer(scanned)


def test_a_wandb_run_in_a_bucket_scans_as_the_local_one(rloo: Path, s3_server: S3Server) -> None:  # noqa: F811
    """The W&B run directory uploaded to an S3-protocol server on 127.0.0.1: the tables are recognised by their
    first bytes, read and given their config over S3, and the scan is the local one's, path for path."""
    local = wandb_dir(rloo)
    s3_server.bucket("cd-tables")
    url = s3_server.upload(local, f"s3://cd-tables/{local.name}")
    code, remote, _ = scan_json(url)
    _, here, _ = scan_json(local)
    assert code == 0 and remote["run"]["algorithm"] == "rloo"
    text = json.dumps(remote).replace(url, str(local))
    here.pop("seconds", None)
    assert {k: v for k, v in json.loads(text).items() if k != "seconds"} == here
