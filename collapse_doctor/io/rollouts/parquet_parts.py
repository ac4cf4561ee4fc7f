"""Which canonical Parquet files found in one directory are parts of one run, and which are runs of their own.

A run is often written as several files (``rollouts/part-000000-000009.parquet``, ..., or one file per step), and
a folder of sample runs holds one file per run (``sample_logs/*.parquet``). Only the files' footers are read
(schema and row-group statistics), never their rows:

- files with different sets of reward columns (``reward/<channel>``; without any, different column sets) are
  different runs;
- files with the same reward columns are parts of one run when their ``step`` ranges do not overlap (parts cut
  by steps); when two of them overlap (two runs of the same channels over the same steps), each file is a run
  of its own. A file whose step range the footer does not tell (no statistics, no ``step`` column) counts as
  not overlapping, as before this rule.

A footer that cannot be read makes the file a run of its own (its reader then names the problem), except in a file
that a trainer is still writing (:func:`being_written`): discovery sets that one aside until it is complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pyarrow.parquet as pq

from collapse_doctor.io.storage.remote import RemotePath, parquet_source

MAGIC = b"PAR1"
"""The bytes a complete Parquet file ends with (after its footer)."""
REWARD_PREFIX = "reward/"
STEP = "step"

Layout = tuple[frozenset[str] | None, tuple[int, int] | None]


def _layout(path: Path) -> Layout:
    """The file's reward columns (or, without any, all its columns) and its step range; ``(None, None)`` when its
    footer cannot be read."""
    try:
        metadata = pq.read_metadata(parquet_source(path))  # an object in storage: its footer only
    except Exception:  # pyarrow raises several kinds (ArrowInvalid, OSError) for a bad footer
        return None, None
    names = metadata.schema.names
    rewards = frozenset(n for n in names if n.startswith(REWARD_PREFIX)) or frozenset(names)
    if STEP not in names or metadata.num_rows == 0:
        return rewards, None
    column = names.index(STEP)
    low: int | None = None
    high: int | None = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max or not isinstance(stats.min, int):
            return rewards, None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return rewards, (low, high) if low is not None and high is not None else None


GROUP = "group_id"
PROMPT = "prompt"


@dataclass(frozen=True)
class SharedGroups:
    """Two files named together that hold rows of the same step and group id (:func:`shared_groups`)."""

    first: Path
    second: Path
    step: int
    group: object
    other_prompts: bool
    """Whether a shared group has another prompt in the second file: then they are surely not one group."""


def shared_groups(files: Sequence[Path]) -> SharedGroups | None:
    """Two of ``files`` (named together: one run) that hold rows of the same step and group id, or None.

    Read as one run, their rows merge into the same groups: right for one run whose groups are split across files
    (ranks, a shuffled export), wrong for two runs (two seeds, an unquoted shell glob), whose groups would hold both
    runs' rollouts. Where a prompt column tells them apart (a shared group with another prompt), it is surely two
    runs. Only files whose step ranges overlap (their footers) are read, and of them the step, group and prompt
    columns.
    """
    layouts = {p: _layout(p) for p in files}
    candidates = [p for p in files if layouts[p][1] is not None]
    found: SharedGroups | None = None
    for i, a in enumerate(candidates):
        for b in candidates[i + 1 :]:
            (_, ra), (_, rb) = layouts[a], layouts[b]
            assert ra is not None and rb is not None
            if ra[1] < rb[0] or rb[1] < ra[0]:
                continue
            ka, kb = _keys(a), _keys(b)
            if ka is None or kb is None:
                continue
            shared = ka.keys() & kb.keys()
            if not shared:
                continue
            step, group = min(shared, key=lambda key: (key[0], str(key[1])))
            differ = any(ka[k] != kb[k] for k in shared if ka[k] is not None and kb[k] is not None)
            if differ:
                return SharedGroups(a, b, step, group, True)
            found = found or SharedGroups(a, b, step, group, False)
    return found


def _keys(path: Path) -> dict[tuple[int, object], object] | None:
    """The file's (step, group id) pairs, each with its first prompt (None without a prompt column); None without
    a group column or when it cannot be read."""
    try:
        names = pq.read_schema(parquet_source(path)).names
        columns = [STEP, GROUP] + ([PROMPT] if PROMPT in names else [])
        table = pq.read_table(parquet_source(path), columns=columns)
    except Exception:  # no group column (grouped by prompt or --group-size), or unreadable: its reader says
        return None
    prompts = table.column(PROMPT).to_pylist() if PROMPT in table.column_names else [None] * table.num_rows
    out: dict[tuple[int, object], object] = {}
    keys = zip(table.column(STEP).to_pylist(), table.column(GROUP).to_pylist(), strict=True)
    for key, prompt in zip(keys, prompts, strict=True):
        out.setdefault(key, prompt)
    return out


def being_written(files: Sequence[Path]) -> list[Path]:
    """The files of one set that a trainer is still writing: local Parquet files that do not end with the footer's
    magic bytes yet (a writer appends the footer last) and are the newest of the set (modified no earlier than
    any complete file of it). A set of one file has none (its reader names the problem); nor has object storage,
    where an object appears whole. An older file without a footer is damaged, not being written: it stays, and
    its reader names it.
    """
    local = [p for p in files if not isinstance(p, RemotePath)]
    if len(files) < 2 or not local:
        return []
    times: dict[Path, int] = {}
    for path in local:
        try:
            times[path] = path.stat().st_mtime_ns
        except OSError:
            continue  # unreadable: its reader names it
    pending: list[Path] = []
    for path in sorted(times, key=times.__getitem__, reverse=True):  # newest first: the tails of a few files
        if _complete(path):
            return pending  # every file before this one is newer than a complete file
        pending.append(path)
    return []  # none is complete: nothing to tell a file being written from a damaged one


def _complete(path: Path) -> bool:
    """Whether the file ends with the Parquet magic bytes (its footer is written); unreadable counts as complete
    (its reader then names the problem)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - len(MAGIC)))
            return size >= 2 * len(MAGIC) and handle.read() == MAGIC
    except OSError:
        return True


def _disjoint(ranges: Sequence[tuple[int, int] | None]) -> bool:
    known = sorted(r for r in ranges if r is not None)
    return all(a[1] < b[0] for a, b in pairwise(known))


def split_directory(files: Sequence[Path]) -> list[list[Path]]:
    """The files of one directory as runs (each a sorted list of files), in the order of their first file."""
    ordered = sorted(files)
    if len(ordered) < 2:
        return [ordered] if ordered else []
    layouts = {p: _layout(p) for p in ordered}
    clusters: dict[frozenset[str] | Path, list[Path]] = {}
    for path in ordered:
        rewards = layouts[path][0]
        clusters.setdefault(rewards if rewards is not None else path, []).append(path)
    runs: list[list[Path]] = []
    for members in clusters.values():
        if _disjoint([layouts[p][1] for p in members]):
            runs.append(members)
        else:
            runs.extend([p] for p in members)
    return sorted(runs, key=lambda run: run[0])
