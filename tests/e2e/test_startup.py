"""The executable's start-up: a read command's process never imports pandas for pyarrow (cli/startup.py), and
pandas conversions still work after the probe was made without it. Fresh processes: the probe is once per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import ROOT, SAMPLE_LOGS


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _imported(importtime: str, module: str) -> bool:
    """Whether ``-X importtime`` output shows ``module`` loaded (a blocked attempt takes microseconds, no child)."""
    return any(
        line.rsplit("|", 1)[-1].strip() == module and int(line.split("|")[1]) > 1000
        for line in importtime.splitlines()
        if "|" in line
    )


def test_a_scan_from_the_executable_imports_no_pandas(tmp_path: Path) -> None:
    out = tmp_path / "scan.json"
    argv = ["scan", str(SAMPLE_LOGS / "healthy.parquet"), "--json", str(out)]
    code = f"from collapse_doctor.cli.app import run; run({argv!r})"
    done = _python(code, "-X", "importtime")
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists() and not _imported(done.stderr, "pandas")
    assert _imported(done.stderr, "pyarrow.compute")  # the check sees real imports: pyarrow's are there


def test_pandas_conversions_work_after_the_probe() -> None:
    code = """
import sys
from collapse_doctor.cli.startup import before_command
before_command(["scan", "run/"])
import pyarrow as pa
table = pa.table({"a": [1.0, None]})
assert "pandas" not in sys.modules
frame = table.to_pandas()  # pyarrow imports pandas now that a conversion asks for it
assert frame["a"].isna().tolist() == [False, True]
assert pa.Table.from_pandas(frame).column("a").null_count == 1
print("ok")
"""
    done = _python(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_other_commands_and_other_processes_keep_pyarrows_own_probe() -> None:
    code = """
import sys
from collapse_doctor.cli.startup import before_command
before_command(["retrain", "--demo"])  # TRL and datasets hand pandas objects to pyarrow
import pyarrow as pa
pa.array([1.0])
print("pandas" in sys.modules)
"""
    done = _python(code)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
