"""Cost linear in the channels (issue 26, items 6 and 7): no pairwise statistics beyond MAX_PAIRED_CHANNELS (said,
never silent), text tables of at most TABLE_CHANNELS rows, long text read in bounded batches and chunks. The
measured bounds are benchmarks/bench_bounds.py's; these tests pin the behaviour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.series import MAX_PAIRED_CHANNELS, channel_pairs
from collapse_doctor.io.rollouts.parquet import BATCH_BYTES, ParquetRun
from collapse_doctor.report.text import TABLE_CHANNELS
from tests.helpers.scalar_runs import trl_series, write_events

runner = CliRunner()


def _wide(path: Path, channels: int, steps: int = 12) -> Path:
    rng = np.random.default_rng(0)
    n = steps * 4 * 8
    columns = {"step": np.repeat(np.arange(steps), 32), "group_id": np.tile(np.repeat(np.arange(4), 8), steps)}
    for k in range(channels):
        columns[f"reward/c{k:03d}"] = (rng.random(n) < 0.5).astype(np.float32)
    pq.write_table(pa.table(columns), path)
    return path


def test_pairwise_statistics_stop_at_the_cap_and_say_so(tmp_path: Path) -> None:
    assert len(channel_pairs([f"c{k}" for k in range(MAX_PAIRED_CHANNELS)])) == MAX_PAIRED_CHANNELS * 63 // 2
    source = _wide(tmp_path / "wide.parquet", MAX_PAIRED_CHANNELS + 6)
    out = tmp_path / "scan.json"
    result = runner.invoke(app, ["scan", str(source), "--json", str(out), "--device", "cpu"])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(out.read_text())
    reason = data["detectors"]["CD401"]["reason"]
    assert data["detectors"]["CD401"]["status"] == "skipped"
    assert reason.startswith(f"not judged: {MAX_PAIRED_CHANNELS + 6} channels; pairwise statistics")
    assert any("no collinearity check (CD401) and no weight inference" in w for w in data["run"]["warnings"])
    assert not any(name.startswith(("corr_", "wfit_")) for name in data["series"])  # nothing C x C in the JSON
    assert len(data["channels"]) == MAX_PAIRED_CHANNELS + 6  # every per-channel statistic is still there


def test_text_tables_list_at_most_table_channels_rows(tmp_path: Path) -> None:
    source = _wide(tmp_path / "wide.parquet", TABLE_CHANNELS + 9)
    result = runner.invoke(app, ["scan", str(source), "--device", "cpu"], env={"COLUMNS": "200"})
    rows = [line for line in result.stdout.splitlines() if re.match(r"c\d{3} +1 ", line)]
    assert len(rows) == TABLE_CHANNELS, result.stdout
    assert f"c011 (w=1), ... ({TABLE_CHANNELS + 9} channels in all)" in result.stdout  # the run card's line
    assert "... and 9 more channels (every channel is in --json and report --html)" in result.stdout
    tags = {f"train/rewards/r{k:03d}/mean": np.full(200, 0.5) for k in range(TABLE_CHANNELS + 3)}
    write_events(tmp_path / "events", trl_series() | tags)
    scalar = runner.invoke(app, ["scan", str(tmp_path / "events")], env={"COLUMNS": "200"})
    assert "... and 5 more channels" in scalar.stdout, scalar.stdout  # TRL's 2 channels and the 43 tags


def test_long_text_is_read_in_batches_of_bounded_bytes(tmp_path: Path) -> None:
    # 128 rows of 600 kB completions, three distinct texts (dictionary-encoded: 2 MB on disk, 77 MB decoded): a
    # batch holds about BATCH_BYTES of them, not the whole row group, a chunk of whole steps stops growing at
    # CHUNK_BYTES, and the completions are still compared (codes for every row).
    steps, size = 16, 8
    n = steps * size
    text = [f"{k % 3}" * 600_000 for k in range(n)]
    table = pa.table(
        {
            "step": np.repeat(np.arange(steps), size),
            "group_id": np.zeros(n, dtype=np.int64),
            "reward/a": np.tile([0.0, 1.0], n // 2),
            "completion": text,
        }
    )
    source = tmp_path / "text.parquet"
    pq.write_table(table, source, row_group_size=n)
    run = ParquetRun([source])
    batches = list(run._range_batches(run.columns.source_columns))
    assert len(batches) > 1 and max(b.nbytes for _, b in batches) <= 2 * BATCH_BYTES
    chunks = list(run.iter_chunks(1 << 18))
    assert len(chunks) > 1 and sum(len(c.steps) for c in chunks) == steps
    assert all(c.completion_codes is not None for c in chunks)
