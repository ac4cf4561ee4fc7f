"""``--ray``: the same results as a local scan, from shards of one run or one run per task of a sweep.

A local Ray instance with 2 CPUs is started once for this module (the commands reuse an instance the process
already started). What a correct result is follows from the design, not from the tool's output: the shards
end where steps end and every statistic is per step, so the per-step series, the findings and every number
built on them are the local scan's, bit for bit (only ``seconds``, the wall time, differs); the exported
advantages are the same rows in the same order; a failed run is named and the other runs' results stay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app, main
from collapse_doctor.engine import reduce
from collapse_doctor.engine.cluster import normalise_ray_flag
from tests.helpers.ray_runs import assert_same, multi_file_run, start_local_ray
from tests.helpers.runs import simulated
from tests.helpers.tables import make_table

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'collapse-doctor[ray]')")
pytestmark = pytest.mark.xdist_group("ray")
runner = CliRunner()


def invoke(args: list[str]) -> Any:
    """The CLI as its entry point reads the arguments (a bare ``--ray`` is ``--ray=local`` there)."""
    return runner.invoke(app, normalise_ray_flag(args))


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Any:
    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards of a few thousand rows, so that the small runs here are cut into several."""
    monkeypatch.setattr(reduce, "MIN_SHARD_ROWS", 1500)


def _without_time(document: dict[str, Any]) -> dict[str, Any]:
    document = json.loads(json.dumps(document))
    for run in document.get("runs", [document]):
        run.pop("seconds", None)
    return document


def _scan_json(args: list[str], tmp_path: Path, name: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    result = invoke(["scan", *args, "--json", str(out)])
    assert result.exit_code in (0, 1, 2), result.output
    return result.exit_code, _without_time(json.loads(out.read_text()))


def test_scan_of_shards_equals_the_local_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps straddle the part files and the row groups; the driver reads the footers only (pass 1 over the step
    column runs in the tasks), and the document is the local scan's exactly, every number to the last bit."""
    from collapse_doctor.io.rollouts.parquet import ParquetRun

    run = multi_file_run(tmp_path, straddling=True)
    files = [str(p) for p in sorted(run.glob("*.parquet"))]
    code, local = _scan_json(files, tmp_path, "local")
    assert local["findings"], "the run is meant to have findings"
    assert len(local["run"]["sources"]) == 3
    assert len(reduce.planned_shards(ParquetRun(files), 2)) >= 4  # cut into several

    def driver_reads(self: ParquetRun, *args: Any) -> Any:
        raise AssertionError("the driver read a column")

    with monkeypatch.context() as driver:  # this process only: the tasks run in Ray's worker processes
        driver.setattr(ParquetRun, "_scan", driver_reads)
        driver.setattr(ParquetRun, "_batches_between", driver_reads)
        code_ray, on_ray = _scan_json([*files, "--ray"], tmp_path, "ray")
    assert code_ray == code
    assert on_ray == local  # codes, severities, onsets, evidence and every per-step number exactly


def test_report_collects_the_same_histograms_and_sample(tmp_path: Path) -> None:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import ScanHooks, plan_scan, run_scan
    from collapse_doctor.report.html.collect import ReportCollector

    run = multi_file_run(tmp_path)
    extras = []
    for ray_address in (None, "local"):
        plan = plan_scan([run], ScanOptions.of(ray=ray_address))
        extras.append(run_scan(plan, ScanHooks(collector=ReportCollector))[0].extra)
    local, on_ray = extras
    assert local.histograms is not None and local.logged_sample is not None
    for name in ("steps", "grpo", "gdpo"):
        assert np.array_equal(getattr(local.histograms, name), getattr(on_ray.histograms, name))
    for name in ("steps", "logged", "grpo", "gdpo"):
        assert np.array_equal(getattr(local.logged_sample, name), getattr(on_ray.logged_sample, name))
    assert [g.step for g in local.examples] == [g.step for g in on_ray.examples]
    out = tmp_path / "report.html"
    result = invoke(["report", str(run), "--html", str(out), "--ray"])
    assert result.exit_code in (0, 1), result.output
    assert out.stat().st_size > 10_000


def _advantages(args: list[str], out: Path) -> pa.Table:
    result = invoke(["advantages", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return pq.read_table(out)


def test_advantages_on_ray_writes_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps straddle the part files and the row groups; pass 1 runs in the tasks (the driver reads only the first
    shard's step column, for the scaling and the output's schema): the file is the local one, row for row."""
    from collapse_doctor.io.rollouts.parquet import ParquetRun

    run = multi_file_run(tmp_path, straddling=True)
    files = [str(p) for p in sorted(run.glob("*.parquet"))]
    assert len(reduce.planned_shards(ParquetRun(files), 2)) >= 4
    local = _advantages(files, tmp_path / "local.parquet")

    def whole_pass_1(self: ParquetRun, *args: Any) -> Any:
        raise AssertionError("the driver ran pass 1 over the whole run")

    with monkeypatch.context() as driver:  # this process only: the tasks run in Ray's worker processes
        driver.setattr(ParquetRun, "_scan", whole_pass_1)
        on_ray = _advantages([*files, "--ray"], tmp_path / "ray.parquet")
    assert local.num_rows == sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert local.equals(on_ray) and local.schema.metadata == on_ray.schema.metadata


def test_advantages_of_unsorted_steps_on_ray_are_exported_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps out of order, in the first shard (the driver sees it and sends no task) or only in a later one (a
    task's claim says so and nothing the tasks sent is kept): the driver exports the run, the same file."""
    from collapse_doctor.io.rollouts.parquet import ParquetRun, steps_read_in_tasks

    accepted: list[bool] = []
    original = ParquetRun.accept_claims

    def recorded(self: ParquetRun, claims: Any) -> bool:
        accepted.append(original(self, claims))
        return accepted[-1]

    monkeypatch.setattr(ParquetRun, "accept_claims", recorded)
    table = make_table(steps=120, groups=8, text=False)
    steps = table.column("step").to_numpy()
    late = np.concatenate([np.flatnonzero(steps != 3), np.flatnonzero(steps == 3)])  # step 3 written last
    for name, order, claims in (("reversed", np.argsort(-steps, kind="stable"), []), ("late", late, [False])):
        path = tmp_path / f"{name}.parquet"
        # without statistics the footers cannot tell the order: the shards are planned, and only the rows tell
        pq.write_table(table.take(pa.array(order)), path, row_group_size=500, write_statistics=False)
        with steps_read_in_tasks():
            footers = ParquetRun([path], check_rewards_first=False)
        assert len(reduce.planned_shards(footers, 2)) >= 3
        local = _advantages([str(path)], tmp_path / f"{name}-local.parquet")
        accepted.clear()
        assert local.equals(_advantages([str(path), "--ray"], tmp_path / f"{name}-ray.parquet")), name
        assert accepted == claims, name


def _sweep(tmp_path: Path, broken: bool) -> Path:
    root = tmp_path / "sweep"
    for name, scenario in (("a-healthy", "healthy"), ("b-saturating", "saturating-format"), ("c-healthy", "healthy")):
        (root / name).mkdir(parents=True)
        simulated(root / name / "rollouts.parquet", scenario, steps=40, seed=len(name))
    if broken:
        (root / "d-broken").mkdir()
        (root / "d-broken" / "rollouts.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    return root


def test_sweep_one_run_per_task_equals_local(tmp_path: Path) -> None:
    root = _sweep(tmp_path, broken=False)
    assert_same(_scan_json([str(root)], tmp_path, "local"), _scan_json([str(root), "--ray"], tmp_path, "ray"))


def test_a_failed_run_is_named_and_the_others_stay(tmp_path: Path) -> None:
    root = _sweep(tmp_path, broken=True)
    for extra in ([], ["--ray"]):
        out = tmp_path / "sweep.json"
        result = invoke(["scan", str(root), "--json", str(out), *extra])
        assert result.exit_code == 2, result.output
        assert "error: run d-broken:" in result.stderr and "rollouts.parquet" in result.stderr
        assert result.stdout.startswith("4 runs: worst") and "not scanned (error)" in result.stdout.splitlines()[0]
        document = json.loads(out.read_text())
        assert [r["run"]["name"] for r in document["runs"]] == ["a-healthy", "b-saturating", "c-healthy"]
        assert document["exit_code"] == 2
        assert [f["run"] for f in document["failed_runs"]] == ["d-broken"]
        assert "rollouts.parquet" in document["failed_runs"][0]["error"]


def test_compare_on_ray_equals_local(tmp_path: Path) -> None:
    a = simulated(tmp_path / "a.parquet", "healthy", steps=40)
    b = simulated(tmp_path / "b.parquet", "saturating-format", steps=40)
    documents = []
    for extra in ([], ["--ray"]):
        result = invoke(["compare", str(a), str(b), "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        documents.append(_without_time(json.loads(result.stdout)))
    assert_same(documents[0], documents[1])


def test_bare_ray_flag_before_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--ray`` takes an optional address: the path after it stays the path (through the real entry point)."""
    path = tmp_path / "run.parquet"
    pq.write_table(make_table(steps=12, groups=8), path)
    with pytest.raises(SystemExit) as done:
        main(["scan", "--ray", str(path), "--format", "json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "healthy"


def test_unsorted_steps_are_reduced_here(tmp_path: Path) -> None:
    """Steps out of order cannot be cut into shards of whole steps: the run is reduced locally, same result."""
    table = make_table(steps=30, groups=8, text=False)
    order = np.argsort(-table.column("step").to_numpy(), kind="stable")
    path = tmp_path / "reversed.parquet"
    pq.write_table(table.take(pa.array(order)), path)
    assert _scan_json([str(path)], tmp_path, "local") == _scan_json([str(path), "--ray"], tmp_path, "ray")


def _dies(_: int) -> int:
    os._exit(1)


def test_a_task_that_dies_is_an_error_naming_its_input() -> None:
    from collapse_doctor.core.errors import InputError
    from collapse_doctor.engine.cluster import ray_session

    with ray_session("local") as executor, pytest.raises(InputError, match=r"^shard-7: the Ray task reading it"):
        list(executor.map(_dies, [7], lambda item: f"shard-{item}"))


def test_ray_with_a_gpu_device_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.parquet"
    pq.write_table(make_table(steps=12, groups=8), path)
    result = invoke(["scan", str(path), "--ray", "local", "--device", "cuda"])
    assert result.exit_code == 2 and "--ray computes on the workers' CPUs" in result.stderr


def test_unreachable_address_fails_fast() -> None:
    from collapse_doctor.core.errors import InputError
    from collapse_doctor.engine.cluster import _check_reachable

    with pytest.raises(InputError, match=r"--ray 127.0.0.1:1: cannot connect to a Ray cluster"):
        _check_reachable("127.0.0.1:1")
