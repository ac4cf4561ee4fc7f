"""A run held as one in-memory Arrow table (what the framework adapters build), read like a Parquet run.

Adapters (TRL completions, verl rollout dumps, NeMo-RL training data) turn a framework's files into the
canonical rollout table at the edge. The table is small (it was written as JSONL or a few Parquet files),
so it is serialised to an in-memory Parquet buffer and handed to the same validation, grouping and
per-step streaming as a Parquet file: one code path for every input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.schema import WEIGHTS_METADATA_KEY
from collapse_doctor.io.rollouts.parquet import ParquetRun


class TableRun(ParquetRun):
    """A :class:`ParquetRun` over an in-memory table; ``files`` names the directory it came from, ``sources``
    the files. Its ``dynamic_weight_channels`` come from the table's ``weight/<channel>`` columns, if any."""

    steps_in_tasks = False
    """Pass 1 runs here: the table lives in this process only."""
    step_digests: dict[int, str]
    """``{step: digest}`` of what an adapter read per step (TRL: one completions table per step), for
    :func:`collapse_doctor.core.reduction.without_reused_steps`; empty when the adapter gives none."""

    def __init__(
        self,
        table: pa.Table,
        *,
        label: Path,
        sources: Sequence[Path],
        step_col: str | None = None,
        group_col: str | None = None,
        reward_cols: Sequence[str] | None = None,
        group_size: int | None = None,
        weights: dict[str, float] | None = None,
        stored_weights: dict[str, float] | None = None,
        part_of_run: bool = False,
    ) -> None:
        self.part_of_run = part_of_run
        if table.num_rows == 0:
            raise InputError(f"{label}: the input has no rows", hint="point at a run that logged rollouts")
        if stored_weights:
            table = table.replace_schema_metadata({WEIGHTS_METADATA_KEY: json.dumps(stored_weights)})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.files = [label]
        self.sources = list(sources)
        self.step_digests = {}
        self._buffer = sink.getvalue()
        self._open(
            self._reopen(),
            step_col=step_col,
            group_col=group_col,
            reward_cols=reward_cols,
            group_size=group_size,
            weights=weights,
        )

    def shards(self, rows: int) -> list[tuple[int, int]]:
        """None: a trainer layout read whole is small, and its table lives in this process only."""
        return []

    def plan_shards(self, rows: int) -> list[tuple[int, int]]:
        """None, as :meth:`shards`."""
        return []

    def _reopen(self) -> list[pq.ParquetFile]:
        return [pq.ParquetFile(pa.BufferReader(self._buffer), pre_buffer=False)]


def consecutive_groups(prompts: Sequence[str], group_size: int | None = None) -> list[int]:
    """Group ids for rows where a group is a block of consecutive rows with the same prompt.

    Runs of one prompt longer than the usual block (the same prompt drawn twice in a batch) are cut into
    blocks of the most common run length, or of ``group_size`` when given.

    >>> consecutive_groups(["a", "a", "b", "b", "a", "a", "a", "a"])
    [0, 0, 1, 1, 2, 2, 3, 3]
    """
    runs: list[int] = []
    for i, prompt in enumerate(prompts):
        if i and prompt == prompts[i - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    if group_size is None and runs:
        counts: dict[int, int] = {}
        for n in runs:
            counts[n] = counts.get(n, 0) + 1
        group_size = max(counts, key=lambda n: (counts[n], -n))
    out: list[int] = []
    group = 0
    for n in runs:
        size = group_size if group_size and n > group_size and n % group_size == 0 else n
        for j in range(n):
            out.append(group + j // size)
        group += n // size if size else 1
    return out
