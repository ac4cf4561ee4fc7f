"""The executable's fast exit keeps exit codes and every byte of output, also through pipes and files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs" / "saturating-format.parquet"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "collapse_doctor", *args], capture_output=True, text=True)


def test_findings_exit_1_with_the_whole_json_on_a_pipe(tmp_path: Path) -> None:
    out = tmp_path / "scan.json"
    done = _run("scan", str(SAMPLE), "--format", "json", "--json", str(out), "--device", "cpu")
    assert done.returncode == 1
    piped = json.loads(done.stdout)  # complete: flushed before the process left
    assert piped["verdict"] == "at_risk"  # CD402 warning, at or above the default --fail-on
    assert json.loads(out.read_text()) == piped


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    done = _run("scan", str(tmp_path / "missing.parquet"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no such file" in done.stderr


def test_help_and_usage_errors_keep_click_exit_codes() -> None:
    assert _run("--help").returncode == 0
    assert _run("scan", "--fail-on", "bogus", str(SAMPLE)).returncode == 2
    bare = _run()
    assert bare.returncode == 2 and "Usage: " in bare.stdout + bare.stderr  # a bare command shows its help


def test_usage_errors_are_one_line_with_a_hint() -> None:
    for args, expected in (
        (["scan"], "error: Missing argument 'PATH...'. Hint: see `collapse-doctor scan --help`"),
        (["scan", "--bogus", str(SAMPLE)], "error: No such option: --bogus. Hint: see `collapse-doctor scan --help`"),
        (["report", str(SAMPLE)], "error: Missing option '--html'. Hint: see `collapse-doctor report --help`"),
        (["bogus"], "error: No such command 'bogus'. Hint: see `collapse-doctor --help`"),
    ):
        done = _run(*args)
        assert done.returncode == 2, args
        assert done.stderr.strip() == expected
        assert done.stdout == ""


def test_a_scalar_only_scan_does_not_import_torch() -> None:
    log = Path(__file__).resolve().parents[2] / "sample_logs" / "trl-tensorboard"
    code = (
        "import sys\nfrom collapse_doctor import diagnose\n"
        f"d = diagnose([{str(log)!r}])\nprint(d.run.scalar_points > 0, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"]


def test_a_dense_cpu_scan_runs_on_numpy_and_does_not_import_torch(tmp_path: Path) -> None:
    """A run in the dense layout (consecutive groups of 8, no NaN) on CPU: the NumPy engine, no torch import;
    the same rows with one NaN reward need the general (torch) path."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 8 * 16 * 4
    table = {
        "step": np.repeat(np.arange(4), n // 4),
        "group_id": np.repeat(np.arange(n // 8), 8),
        "reward_format": rng.integers(0, 2, n).astype(np.float32),
        "reward_correct": rng.random(n).astype(np.float32),
    }
    dense = tmp_path / "dense.parquet"
    pq.write_table(pa.table(table), dense)
    table["reward_correct"][5] = np.nan
    with_nan = tmp_path / "nan.parquet"
    pq.write_table(pa.table(table), with_nan)
    code = (
        "import sys\nfrom collapse_doctor import diagnose\n"
        "d = diagnose([sys.argv[1]])\nprint(d.run.rollouts, 'torch' in sys.modules)"
    )
    for path, imported in ((dense, "False"), (with_nan, "True")):
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert done.stdout.split() == [str(n), imported], path
