"""The monitor's files: rollout parts, the synchronous TensorBoard writer, resumes, and every process's count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from collapse_doctor.integrations.rollouts import RolloutMonitor, StepRecord

CHANNELS = ("a", "b")


def record(step: int, rows: int = 4, offset: float = 0.0) -> StepRecord:
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, float("nan")]] * (rows // 4)) + offset
    return StepRecord(step, rewards, torch.zeros(rows), 2, ["p"] * rows, ["c"] * rows, list(range(rows)))


def monitor(root: Path, **kwargs: object) -> RolloutMonitor:
    return RolloutMonitor(root, CHANNELS, {"a": 1.0, "b": 0.5}, "grpo", **kwargs)  # type: ignore[arg-type]


def scalars(root: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(root / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_parts_and_per_step_events(tmp_path: Path) -> None:
    m = monitor(tmp_path, write_every=3)
    for step in range(7):
        m.record(record(step))
        m.flush_if_full()
    m.close()
    parts = sorted(p.name for p in m.rollouts_dir.iterdir())
    assert parts == ["part-000000-000002.parquet", "part-000003-000005.parquet", "part-000006-000006.parquet"]
    table = pq.read_table(m.rollouts_dir / parts[0])
    assert table.column_names[:5] == ["step", "group_id", "reward/a", "reward/b", "advantage"]
    assert table.schema.metadata[b"collapse_doctor.weights"] == b'{"a": 1.0, "b": 0.5}'
    # rel_gain of `a`: groups [1, 0] and [1, 0] span 1; of `b`: [0, 1] spans 1, [1, NaN] has one value
    assert scalars(tmp_path, "collapse_doctor/rel_gain/a") == [(s, 1.0) for s in range(7)]
    assert scalars(tmp_path, "collapse_doctor/rel_gain/b") == [(s, 1.0) for s in range(7)]
    assert m.series().steps.tolist() == list(range(7))
    merged = m.reduction()
    assert merged is not None
    assert (merged.rollouts, merged.groups, max(merged.notes.group_sizes)) == (28, 14, 2)
    assert merged.weights_source == "file metadata", "read from the part's metadata, as scan reads it"


def test_a_second_batch_of_a_step_joins_it(tmp_path: Path) -> None:
    m = monitor(tmp_path, write_every=10)
    m.record(record(0))
    m.record(record(0))
    m.record(record(1))
    m.close()
    table = pq.read_table(m.rollouts_dir)
    steps = table["step"].to_numpy()
    assert np.bincount(steps).tolist() == [8, 4]
    assert table["group_id"].to_numpy()[steps == 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_resume_purges_the_later_events_and_rows(tmp_path: Path) -> None:
    first = monitor(tmp_path, write_every=2)
    for step in range(6):
        first.record(record(step))
        first.flush_if_full()
    first.close()
    again = monitor(tmp_path, write_every=2)
    again.truncate_from(3)  # checkpoint-2 (2 optimizer steps done): TRL's steps 3.. are trained again
    for step in range(3, 6):
        again.record(record(step, offset=1.0))
        again.flush_if_full()
    again.close()
    rows = pq.read_table(tmp_path / "rollouts")
    assert np.bincount(rows["step"].to_numpy()).tolist() == [4] * 6, "no step twice"
    assert again.series().steps.tolist() == list(range(6)), "the steps before the resume are judged too"
    weights = scalars(tmp_path, "collapse_doctor/weight/a")
    assert [s for s, _ in weights] == list(range(6)), "each step once, the purged session's later events dropped"
    # the project's own reader sees the SessionLog START of the resumed file and drops the first session's 3..5
    from collapse_doctor.io.logs.tensorboard import merge_reads, read_event_file

    files = sorted((tmp_path / "tensorboard").iterdir(), key=lambda f: f.stat().st_mtime_ns)
    assert len(files) == 2
    log = merge_reads([read_event_file(f) for f in files])
    tags = len(log.tags)
    assert log.purged == 3 * tags and log.duplicates == 0
    assert log.tags["collapse_doctor/weight/a"].steps.tolist() == list(range(6))


def test_every_process_counts_the_same_parts(tmp_path: Path) -> None:
    main, other = monitor(tmp_path / "main", write_every=3), monitor(tmp_path / "other", write_every=3, enabled=False)
    due_main, due_other = [], []
    for step in range(10):
        main.record(record(step))
        other.note_step(step)
        due_main.append(main.flush_if_full())
        due_other.append(other.flush_if_full())
    assert due_main == due_other == [s % 3 == 2 for s in range(10)]
    assert main.files_written == 3 and other.files_written == 0
    assert not (tmp_path / "other").exists()


def test_log_scalars_are_the_mean_over_the_steps_since_the_last_log(tmp_path: Path) -> None:
    m = monitor(tmp_path, write_every=2, tensorboard=False)
    assert m.take_log_scalars() == {}
    m.record(record(0))
    m.record(record(1, offset=0.5))
    m.flush_if_full()
    logged = m.take_log_scalars()
    assert logged["collapse_doctor/rel_gain/a"] == 1.0
    assert logged["collapse_doctor/zero_advantage_share"] == 0.0
    assert m.take_log_scalars() == {}
    assert not (tmp_path / "tensorboard").exists()


def test_no_scalar_key_is_a_path_prefix_of_another(tmp_path: Path) -> None:
    """MLflow's file store keeps a metric as a file at its key's path: a key that is a directory of another
    (``a`` and ``a/b``) fails the whole logged batch, the user's own metrics with it."""
    m = monitor(tmp_path, write_every=1, tensorboard=False)
    m.record(record(0))
    m.record(record(1))
    keys = set(m.take_log_scalars())
    assert keys and not [k for k in keys for other in keys if other.startswith(k + "/")]


def test_a_part_whose_rewards_are_all_none_keeps_the_monitor_on(tmp_path: Path) -> None:
    """Steps 0-2 have no finite reward (a judge that returned None for every completion), steps 3-5 do: the first part
    reduces to steps with no valid rows instead of failing (the check that some reward is finite belongs to the
    whole run, as `scan` makes it), so the monitor stays on and its reduction covers all six steps; the scan of the
    rollouts directory reads the same 12 valid rollouts."""
    from collapse_doctor import diagnose
    from collapse_doctor.core.options import ScanOptions

    m = monitor(tmp_path, write_every=3)
    for step in range(6):
        r = record(step)
        if step < 3:
            r.rewards = torch.full_like(r.rewards, float("nan"))
        m.record(r)
        m.flush_if_full()
    m.close()
    assert m.enabled
    merged = m.reduction()
    assert merged is not None and merged.series.steps.tolist() == list(range(6))
    assert merged.series["valid_rows"].tolist() == [0, 0, 0, 4, 4, 4]
    scanned = diagnose([m.rollouts_dir], ScanOptions.of(device="cpu"))
    assert scanned.run.steps == 6 and float(np.nansum(scanned.series["valid_rows"])) == 12
