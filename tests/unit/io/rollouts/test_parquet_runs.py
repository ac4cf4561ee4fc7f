"""Canonical Parquet files found in a directory: sibling runs apart, the part files of one run together."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.rollouts.parquet_parts import split_directory
from tests.helpers.scalar_runs import trl_series, write_events


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


def test_an_unreadable_footer_is_a_run_of_its_own(tmp_path: Path) -> None:
    good = [_write(tmp_path / f"part-{lo}.parquet", range(lo, lo + 5)) for lo in (0, 5)]
    bad = tmp_path / "part-9.parquet"
    bad.write_bytes(b"PAR1 not really")
    assert split_directory([*good, bad]) == [good, [bad]]
