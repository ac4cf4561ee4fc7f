"""`collapse-doctor advantages` end to end: output, order, exit codes, messages, atomic writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.engine.advantages import compute_advantages
from tests.helpers.tables import WriteTable, make_table, modules_imported_by_cli

runner = CliRunner()


def invoke(*args: str | Path):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def test_writes_advantages_in_input_order(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(steps=4, groups=5)
    shuffled = table.take(pa.array(np.random.default_rng(3).permutation(table.num_rows)))
    a = write_table(shuffled.slice(0, 70), "a.parquet")
    b = write_table(shuffled.slice(70), "b.parquet")
    out = tmp_path / "adv.parquet"
    result = invoke("advantages", a, b, "-o", out, "--weights", "format=1,correct=0.5")
    assert result.exit_code == 0, result.output
    size = f"{out.stat().st_size / 1000:.1f} kB"  # every "wrote" line says the size (docs/usage.md)
    assert f"wrote {out} ({size}): 160 rows, 4 steps" in result.stderr and not result.stdout  # a note, not a result
    written = pq.read_table(out)
    assert written.column_names == [
        "step", "group_id", "prompt", "completion", "reward/format", "reward/correct",
        "adv/grpo", "adv/gdpo", "adv/format", "adv/correct",
    ]  # fmt: skip
    assert written.column("completion").to_pylist() == shuffled.column("completion").to_pylist()
    meta = written.schema.metadata
    assert meta[b"collapse_doctor.weights"] == b'{"format": 1.0, "correct": 0.5}'

    # Same numbers as the engine on each step taken on its own, sorted.
    for step in range(4):
        part = written.filter(pa.compute.equal(written.column("step"), step))
        rewards = np.stack([part.column("reward/format").to_numpy(), part.column("reward/correct").to_numpy()], 1)
        expected = compute_advantages(
            torch.from_numpy(rewards),
            torch.tensor(part.column("group_id").to_numpy()),
            weights=torch.tensor([1.0, 0.5]),
        )
        np.testing.assert_allclose(part.column("adv/grpo").to_numpy(), expected.grpo.numpy(), atol=1e-6)
        np.testing.assert_allclose(part.column("adv/gdpo").to_numpy(), expected.gdpo.numpy(), atol=1e-6)
        np.testing.assert_allclose(part.column("adv/correct").to_numpy(), expected.zscores[:, 1].numpy(), atol=1e-6)


def test_known_numbers_and_carried_advantage(write_table: WriteTable, tmp_path: Path) -> None:
    table = pa.table(
        {
            "step": [7, 7, 7, 7],
            "group_id": ["q", "q", "r", "r"],
            "reward/correct": [1.0, 0.0, 0.5, 0.5],
            "advantage": [0.7, -0.7, 0.0, 0.0],
        }
    )
    out = tmp_path / "adv.parquet"
    result = invoke("advantages", write_table(table), "-o", out, "--convention", "paper")
    assert result.exit_code == 0, result.output
    written = pq.read_table(out).to_pydict()
    assert written["advantage"] == pytest.approx([0.7, -0.7, 0.0, 0.0])
    assert written["adv/grpo"] == pytest.approx([2**-0.5, -(2**-0.5), 0.0, 0.0])
    assert written["adv/grpo"][2:] == [0.0, 0.0]  # a constant group gives exactly 0


def test_scale_and_convention_options(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table())
    results = {}
    for scale in ("group", "batch", "none"):
        out = tmp_path / f"{scale}.parquet"
        assert invoke("advantages", path, "-o", out, "--scale", scale).exit_code == 0
        results[scale] = pq.read_table(out).column("adv/grpo").to_numpy()
    assert not np.allclose(results["group"], results["batch"])
    assert not np.allclose(results["group"], results["none"])


def test_group_size_blocks(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table(text=False).drop_columns(["group_id"])
    out = tmp_path / "adv.parquet"
    result = invoke("advantages", write_table(table), "-o", out, "--group-size", "8")
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).column("group_id").to_pylist()[:9] == [0] * 8 + [1]


def test_warnings_go_to_stderr(write_table: WriteTable, tmp_path: Path) -> None:
    table = make_table()
    fmt = table.column("reward/format").to_numpy().copy()
    fmt[:2] = np.nan
    table = table.set_column(2, "reward/format", pa.array(fmt))
    result = invoke("advantages", write_table(table), "-o", tmp_path / "o.parquet")
    assert result.exit_code == 0
    assert "warning: reward/format: 2 NaN value(s)" in result.stderr
    assert "warning:" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "length=2"], "--weights names unknown channel(s) ['length']"),
        (["--weights", "format"], "--weights: cannot read 'format'"),
        (["--convention", "openrlhf"], "--convention 'openrlhf' is not one of trl, verl, paper"),
        (["--scale", "token"], "--scale 'token' is not one of group, batch, none"),
        (["--step-col", "iteration"], "expected column 'iteration'"),
        (["--reward-cols", "score"], "reward column 'score' (from --reward-cols) not found"),
        (["--group-col", "uid"], "group column 'uid' (from --group-col) not found"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    write_table: WriteTable, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out.parquet"
    result = invoke("advantages", write_table(make_table()), "-o", out, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output
    assert not out.exists()


def test_bad_files_exit_2(tmp_path: Path, write_table: WriteTable) -> None:
    text = tmp_path / "rollouts.parquet"
    text.write_text("not parquet")
    empty = write_table(make_table().slice(0, 0), "empty.parquet")
    for path, message in [
        (tmp_path / "missing.parquet", "missing.parquet: no such file or directory"),
        (text, "rollouts.parquet: not a Parquet file"),
        (empty, "the input has no rows"),
    ]:
        result = invoke("advantages", path, "-o", tmp_path / "out.parquet")
        assert result.exit_code == 2, result.output
        assert message in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_gpu(write_table: WriteTable, tmp_path: Path) -> None:
    result = invoke("advantages", write_table(make_table()), "-o", tmp_path / "o.parquet", "--device", "cuda")
    assert result.exit_code == 2
    assert "CUDA is not available" in result.stderr


def test_refuses_to_overwrite_input(write_table: WriteTable) -> None:
    path = write_table(make_table())
    before = path.read_bytes()
    result = invoke("advantages", path, "-o", path)
    assert result.exit_code == 2
    assert "refusing to overwrite an input file" in result.stderr
    assert path.read_bytes() == before


def test_failure_midway_leaves_no_output(write_table: WriteTable, tmp_path: Path) -> None:
    """A bad group id in the last step fails after earlier steps were written: nothing is left behind."""
    table = make_table(steps=3)
    group = table.column("group_id").to_pylist()
    group[-1] = None
    path = write_table(table.set_column(1, "group_id", pa.array(group, pa.int64())))
    out = tmp_path / "out" / "adv.parquet"
    out.parent.mkdir()
    out.write_bytes(b"previous result")
    result = invoke("advantages", path, "-o", out)
    assert result.exit_code == 2
    assert "at step 2" in result.stderr
    assert out.read_bytes() == b"previous result"
    assert sorted(p.name for p in out.parent.iterdir()) == ["adv.parquet"]


def test_debug_shows_traceback(write_table: WriteTable, tmp_path: Path) -> None:
    result = invoke("advantages", tmp_path / "missing.parquet", "-o", tmp_path / "o.parquet", "--debug")
    assert result.exit_code != 0
    assert result.exception is not None


def test_help_does_not_import_torch() -> None:
    assert modules_imported_by_cli(["--help"], ["advantages", "--help"], packages=("torch", "pyarrow", "numpy")) == []


def test_console_script_and_module_entry_points(write_table: WriteTable, tmp_path: Path) -> None:
    path = write_table(make_table())
    exe = Path(sys.executable).with_name("collapse-doctor")
    res = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert res.returncode == 0
    assert res.stdout.startswith("collapse-doctor ")
    res = subprocess.run(
        [sys.executable, "-m", "collapse_doctor", "advantages", str(path), "-o", str(tmp_path / "o.parquet")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "collapse_doctor", "advantages", str(tmp_path / "nope.parquet"), "-o", "x"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope.parquet'}: no such file or directory"]
