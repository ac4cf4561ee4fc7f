"""One run, one answer: ``watch`` (after its last poll) and the TRL callback judge a run as ``scan`` does.

Every entry point hands its reduction of the run to the same function
(:func:`collapse_doctor.pipeline.scan.diagnose_reduction`). Here ``watch`` follows a copy of each real TRL run of
tests/data/trl_corpus and each shipped sample while it grows: the first poll sees half of the per-step rollout
files, the second all of them, so the reductions ``watch`` keeps are merged file by file across polls. Its final
diagnosis must equal a fresh ``scan`` of the same files: verdict, signal budget, and every finding's code,
channels, severity and onset. (The callback's side is in tests/unit/integrations/test_trl_callback.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.result import Diagnosis
from collapse_doctor.pipeline.scan import diagnose_runs
from collapse_doctor.pipeline.watch import watch
from tests.helpers.paths import ROOT, SAMPLE_LOGS

CORPUS = ROOT / "tests" / "data" / "trl_corpus"
RUNS = sorted(p for p in CORPUS.iterdir() if p.is_dir()) + sorted(
    p for p in SAMPLE_LOGS.iterdir() if p.name != "README.md"
)
PER_STEP = ("completions_*.parquet", "part-*.parquet")


def answer(diagnosis: Diagnosis) -> dict[str, Any]:
    """What a user acts on: the verdict, the signal budget, the estimators on the same rewards and each finding's
    code, channels, severity, onset and remedy."""
    table = diagnosis.run.counterfactuals
    return {
        "verdict": diagnosis.verdict,
        "signal": dict(diagnosis.run.signal) if diagnosis.run.signal is not None else None,
        "counterfactuals": dict(table) if table is not None else None,
        "remedies": [f.remedy for f in diagnosis.findings],
        "algorithm": diagnosis.run.algorithm,
        "weights": diagnosis.run.weights,
        "findings": [(f.code, f.channels, f.severity.label, f.onset_step, f.step_range) for f in diagnosis.findings],
        "skipped": sorted(diagnosis.skipped),
    }


def held_back(run: Path) -> list[Path]:
    """The second half (by name) of the run's per-step rollout files: what the first poll does not see yet."""
    files = sorted(f for pattern in PER_STEP for f in run.rglob(pattern))
    return files[len(files) // 2 :]


@pytest.mark.parametrize("source", RUNS, ids=[p.name for p in RUNS])
def test_watch_after_its_last_poll_equals_scan(source: Path, tmp_path: Path) -> None:
    run = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, run)
    else:
        shutil.copy2(source, run)
    later = held_back(run) if run.is_dir() else []
    aside = tmp_path / "later"
    for f in later:
        target = aside / f.relative_to(run)
        target.parent.mkdir(parents=True, exist_ok=True)
        f.rename(target)

    def arrive(_: float) -> None:  # between the polls: the rest of the run is written
        for f in later:
            (aside / f.relative_to(run)).rename(f)

    state = watch([run], ScanOptions(), interval=0.0, max_polls=2, sleep=arrive)
    assert state.scans == (2 if later else 1), "each poll that saw new files diagnosed the run again"
    scanned = diagnose_runs([run], ScanOptions())
    watched = [state.diagnoses[d.run.name or ""] for d in scanned]
    assert [answer(d) for d in watched] == [answer(d) for d in scanned]


def test_watch_reads_whole_a_run_whose_step_cannot_be_judged_alone(tmp_path: Path) -> None:
    """A TRL run where one step's rewards are all NaN (every reward function returned None): that file alone has
    no finite reward, the run does. `watch` reads such a run whole, as `scan` does, instead of waiting forever."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(CORPUS / "healthy-two-grpo-s0", run)
    path = sorted((run / "completions").glob("completions_*.parquet"))[6]
    table = pq.read_table(path)
    for name in ("digits", "low"):  # this run's two reward functions
        table = table.set_column(table.column_names.index(name), name, pa.nulls(table.num_rows, pa.float64()))
    pq.write_table(table, path)
    state = watch([run], ScanOptions(), interval=0.0, max_polls=1)
    assert state.scans == 1 and state.last_error is None
    assert answer(state.diagnoses[""]) == answer(diagnose_runs([run], ScanOptions())[0])
