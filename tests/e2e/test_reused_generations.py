"""Generation batches that TRL logs more than once (``num_iterations`` or ``steps_per_generation`` above 1).

TRL optimises on one generation batch for several steps and writes it at each: ``completions_00002.parquet`` holds
the rows of ``_00001`` with step 2. Built here from a real corpus run of 20 generation batches (32 rollouts each),
each logged twice (steps 2k-1 and 2k). Expected from the definition, before any scan: 20 batches of 32 rollouts are
640 rollouts and 160 groups (not 1,280 and 320), the signal budget is the original run's (the same rows, each
counted once), the run says the advantages were reused, and ``watch`` (one file at a time) says the same.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.watch import watch
from tests.helpers.paths import ROOT

SOURCE = ROOT / "tests" / "data" / "trl_corpus" / "healthy-two-grpo-s0"


def logged_twice(out: Path) -> Path:
    (out / "completions").mkdir(parents=True)
    files = sorted((SOURCE / "completions").glob("completions_*.parquet"))
    for k, path in enumerate(files):
        table = pq.read_table(path)
        for step in (2 * k + 1, 2 * k + 2):
            again = table.set_column(table.column_names.index("step"), "step", pa.array([step] * table.num_rows))
            pq.write_table(again, out / "completions" / f"completions_{step:05d}.parquet")
    return out


def test_each_rollout_is_counted_once(tmp_path: Path) -> None:
    original = diagnose([SOURCE / "completions"], ScanOptions())
    reused = diagnose([logged_twice(tmp_path / "run")], ScanOptions())
    assert (original.run.rollouts, original.run.groups) == (640, 160)
    assert (reused.run.rollouts, reused.run.groups, reused.run.steps) == (640, 160, 20)
    assert reused.run.signal == original.run.signal
    assert any(w.startswith("advantages reused: 20 of 40 logged steps") for w in reused.run.warnings)
    assert reused.verdict == original.verdict
    assert not any(w.startswith("advantages reused") for w in original.run.warnings)


def test_watch_counts_them_once_too(tmp_path: Path) -> None:
    run = logged_twice(tmp_path / "run")
    state = watch([run], ScanOptions(), interval=0.0, max_polls=1)
    watched = state.diagnoses[""]
    scanned = diagnose([run], ScanOptions())
    assert (watched.run.rollouts, watched.run.groups, watched.run.steps) == (640, 160, 20)
    assert watched.run.signal == scanned.run.signal
    assert [(f.code, f.severity, f.onset_step) for f in watched.findings] == [
        (f.code, f.severity, f.onset_step) for f in scanned.findings
    ]
    shutil.rmtree(run)
