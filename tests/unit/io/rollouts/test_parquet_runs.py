"""Canonical Parquet files found in a directory: sibling runs apart, the part files of one run together."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.rollouts.parquet_parts import being_written, split_directory
from tests.helpers.scalar_runs import trl_series, write_events
from tests.helpers.trl import trl_output_dir


def _table(steps: range, channels: tuple[str, ...]) -> pa.Table:
    rows = [(s, g) for s in steps for g in range(2) for _ in range(4)]
    table = {"step": [s for s, _ in rows], "group_id": [g for _, g in rows]}
    for k, channel in enumerate(channels):
        table[f"reward/{channel}"] = [float((i + k) % 2) for i in range(len(rows))]
    return pa.table(table)


def _write(path: Path, steps: range, channels: tuple[str, ...] = ("format", "correct")) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_table(steps, channels), path)
    return path


def _runs(*paths: Path) -> dict[str, list[str]]:
    return {r.name: [p.name for p in r.rollout_files] for r in discover_runs(list(paths))}


def test_siblings_with_different_channels_are_separate_runs(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", range(10), ("format",))
    _write(tmp_path / "b.parquet", range(10), ("format", "correct"))
    assert _runs(tmp_path) == {"a": ["a.parquet"], "b": ["b.parquet"]}


def test_siblings_over_the_same_steps_are_separate_runs(tmp_path: Path) -> None:
    _write(tmp_path / "seed0.parquet", range(10))
    _write(tmp_path / "seed1.parquet", range(10))
    assert _runs(tmp_path) == {"seed0": ["seed0.parquet"], "seed1": ["seed1.parquet"]}


def test_parts_cut_by_steps_are_one_run(tmp_path: Path) -> None:
    for lo in (0, 10, 20):
        _write(tmp_path / "rollouts" / f"part-{lo:06d}-{lo + 9:06d}.parquet", range(lo, lo + 10))
    for step in range(3):  # one file per step
        _write(tmp_path / "per_step" / f"step_{step}.parquet", range(step, step + 1), ("x",))
    runs = _runs(tmp_path)
    assert runs["rollouts"] == [f"part-{lo:06d}-{lo + 9:06d}.parquet" for lo in (0, 10, 20)]
    assert runs["per_step"] == [f"step_{s}.parquet" for s in range(3)]
    assert split_directory(sorted((tmp_path / "rollouts").iterdir())) == [sorted((tmp_path / "rollouts").iterdir())]


def test_hive_partitions_are_one_table(tmp_path: Path) -> None:
    for step in range(3):
        _write(tmp_path / "rollouts" / f"step={step}" / "part-0.parquet", range(step, step + 1))
    [run] = discover_runs([tmp_path])
    assert len(run.rollout_files) == 3


def test_files_named_explicitly_stay_one_run(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.parquet", range(10), ("format",))
    b = _write(tmp_path / "b.parquet", range(10, 20), ("format",))
    [run] = discover_runs([a, b])
    assert run.rollout_files == [a, b]


def test_a_run_directory_keeps_its_scalar_logs_when_it_sits_beside_other_runs(tmp_path: Path) -> None:
    for lo in (0, 10):
        _write(tmp_path / "demo" / "rollouts" / f"part-{lo}.parquet", range(lo, lo + 10))
    series = trl_series()
    write_events(tmp_path / "demo" / "runs" / "Nov30", series)
    write_events(tmp_path / "demo" / "tensorboard", {"train/kl": series["train/kl"]})
    _write(tmp_path / "other.parquet", range(5), ("style",))
    runs = {r.name: r for r in discover_runs([tmp_path])}
    assert sorted(runs) == ["demo", "other"]
    assert len(runs["demo"].rollout_files) == 2 and len(runs["demo"].scalar_logs["events"]) == 2
    assert runs["other"].scalar_logs == {}


def test_a_damaged_footer_is_a_run_of_its_own(tmp_path: Path) -> None:
    bad = tmp_path / "part-9.parquet"
    bad.write_bytes(b"PAR1 not really")
    os.utime(bad, ns=(1, 1))  # older than the good parts: damaged, not being written
    good = [_write(tmp_path / f"part-{lo}.parquet", range(lo, lo + 5)) for lo in (0, 5)]
    assert being_written([*good, bad]) == []
    assert split_directory([*good, bad]) == [good, [bad]]


def test_a_glob_of_one_runs_parts_is_one_run(tmp_path: Path) -> None:
    parts = [_write(tmp_path / "rollouts" / f"part-{lo}.parquet", range(lo, lo + 5)) for lo in (0, 5)]
    [run] = discover_runs([str(tmp_path / "rollouts" / "part-*.parquet")])
    assert run.rollout_files == parts


def _half_written(path: Path, whole: Path) -> Path:
    """The first half of ``whole``'s bytes at ``path``: a trainer's writer stopped before the footer."""
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_part_being_written_is_set_aside_until_it_is_complete(tmp_path: Path) -> None:
    # A writer appends the footer last, so the newest part without one is being written: the run is the complete
    # parts (one run, not three), the part is named as not read, and once it is complete it is read.
    parts = [_write(tmp_path / "rollouts" / f"part-{lo:06d}.parquet", range(lo, lo + 5)) for lo in (0, 5)]
    whole = _write(tmp_path / "whole.parquet", range(10, 15))
    writing = _half_written(tmp_path / "rollouts" / "part-000010.parquet", whole)
    [run] = discover_runs([tmp_path / "rollouts"])
    assert run.rollout_files == parts
    assert len(run.set_aside) == 1 and run.set_aside[0].startswith(f"{writing} (no Parquet footer yet")
    writing.write_bytes(whole.read_bytes())
    [run] = discover_runs([tmp_path / "rollouts"])
    assert run.rollout_files == [*parts, writing] and run.set_aside == ()


def test_trl_completions_being_written_are_set_aside(tmp_path: Path) -> None:
    out = trl_output_dir(tmp_path / "out", events=False)
    done = sorted((out / "completions").iterdir())
    writing = _half_written(out / "completions" / "completions_00031.parquet", done[-1])
    [run] = discover_runs([out])
    assert run.rollout_files == done
    assert len(run.set_aside) == 1 and run.set_aside[0].startswith(f"{writing} (no Parquet footer yet")


def test_files_named_together_that_share_step_and_group_ids(tmp_path: Path) -> None:
    # Named together, files are one run, and rows of one step and group id in two files are one group: right for a
    # run whose groups are split across files (ranks, a shuffled export), wrong for two runs (an unquoted shell glob
    # of two seeds), whose groups would hold both runs' rollouts. With other prompts in a shared group they are
    # surely two runs: an error naming both; without prompts to tell, a warning in the run card says so.
    a = _write(tmp_path / "seed0.parquet", range(10))
    b = _write(tmp_path / "seed1.parquet", range(10))
    [run] = discover_runs([a, b])
    assert run.rollout_files == [a, b]
    assert len(run.warnings) == 1 and "both hold rollouts of step 0, group 0" in run.warnings[0]
    for path, prompt in ((a, "question A"), (b, "question B")):
        table = pq.read_table(path)
        pq.write_table(table.append_column("prompt", pa.array([prompt] * table.num_rows)), path)
    with pytest.raises(InputError, match=r"seed0.parquet and .*seed1.parquet both hold .* with other prompts"):
        discover_runs([a, b])
    table = pq.read_table(b)
    pq.write_table(table.set_column(1, "group_id", pc.add(table["group_id"], 100)), b)  # rank 1's own ids
    [run] = discover_runs([a, b])
    assert run.rollout_files == [a, b] and run.warnings == ()
    assert len(discover_runs([tmp_path])) == 2  # found in their directory: a sweep, as before
