"""Read rollout tables from Parquet, one training step at a time, in bounded memory.

A run may be one file or many (one per step, say), rows of a step may be spread over files and need
not be sorted. Reading takes two passes over bounded record batches:

1. the ``step`` and reward columns only: validation (types, nulls, +-inf, NaN counts) and, for every
   step, the position of its last row in the whole input;
2. all needed columns: rows are buffered per step and a step is handed on as soon as its last row
   has been read. Sorted input (the usual case) keeps one step in memory; shuffled input keeps the
   steps that are still open.

Every problem is raised before the first step is handed on, except those only visible per step
(null group ids), so callers never produce half an output.

On Ray (:func:`steps_read_in_tasks`) the driver reads footers only: :meth:`ParquetRun.plan_shards` cuts the run
where row groups start, and each shard's task runs pass 1 over its own range (:meth:`ParquetRun.claim_steps`): it
owns the steps that start in its range and reads ahead past its end to finish the last one.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collapse_doctor.core.batching import StackedChunk, chunk_steps, stack_chunk
from collapse_doctor.core.errors import InputError, SchemaError
from collapse_doctor.core.reduction import IngestNotes
from collapse_doctor.core.schema import (
    AGGREGATION,
    COMPLETION_LENGTH,
    GROUND_TRUTH_METADATA_KEY,
    GROUP_ID,
    UNCHECKED_ADVANTAGE,
    ColumnMap,
    RewardColumn,
    RolloutBatch,
    check_same_layout,
    discover_columns,
    discover_reward_name,
    metadata_algorithm,
    metadata_weights,
    resolve_weights,
    unified_types,
)
from collapse_doctor.core.series import CUT_BY_FLAG
from collapse_doctor.io.storage.paths import expand_paths
from collapse_doctor.io.storage.remote import RemotePath, parquet_source

BATCH_ROWS = 262_144
BATCH_BYTES = 16 << 20
"""About the most bytes (uncompressed) a record batch of the read columns holds: long completion text is read in
batches of fewer rows, so memory does not grow with the length of the text."""
CHUNK_BYTES = 32 << 20
"""About the most bytes a chunk of whole steps holds before it is cut (besides its :data:`SCAN_CHUNK_ROWS` rows)."""
READ_BUFFER = 1 << 20
"""Bytes a local file's column chunks are read in (:func:`open_parquet`)."""
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
_MAGIC = b"PAR1"
DYNAMIC_WEIGHT_PREFIX = "weight/"
"""Per-row channel weight columns, as ``collapse-doctor retrain --algo gdpo-dynamic`` writes them."""


_STEPS_IN_TASKS: ContextVar[bool] = ContextVar("collapse_doctor_steps_in_tasks", default=False)


@contextmanager
def steps_read_in_tasks() -> Iterator[None]:
    """Runs opened in the block (with ``check_rewards_first=False``) read their footers only: pass 1 is left to
    the tasks their shards go to (:meth:`ParquetRun.plan_shards`), or runs in this process when something needs
    the steps here (a local reduction: :meth:`ParquetRun.iter_chunks` reads them first)."""
    token = _STEPS_IN_TASKS.set(True)
    try:
        yield
    finally:
        _STEPS_IN_TASKS.reset(token)


@dataclass(frozen=True)
class StepClaim:
    """What a shard's task found in its planned rows (:meth:`ParquetRun.claim_steps`), for the driver to check that
    the claims of all shards cover the run once, in order (:meth:`ParquetRun.accept_claims`)."""

    planned: tuple[int, int]
    """The rows the driver planned, ``[start, end)``: row-group boundaries."""
    rows: tuple[int, int]
    """The rows the task owns: from the first row of the first step that starts in ``planned`` to the last row of
    the last one (past ``planned``'s end when that step goes on); empty when no step starts in ``planned``."""
    before: int | None
    """The step of the row before ``planned`` (footer statistics, else read): its rows are the previous shard's."""
    last_in_range: int | None
    """The step of ``planned``'s last row; ``None`` when the steps were found out of order."""
    ascending: bool
    """Whether the steps never decrease over ``planned``, from the row before it to the row after the last step."""
    last_rows: dict[int, int] = field(default_factory=dict)
    """``{step: last row}`` of the owned steps (pass 1's result for them)."""
    labels: dict[int, str] | None = None
    """``{step: first aggregation label}`` of the owned steps, when the files have an aggregation column."""


def weights_source(channels: Sequence[str], given: Mapping[str, float], stored: Mapping[str, float]) -> str:
    """Where the channels' weights come from (``resolve_weights``' precedence): the distinct sources, in that
    order, joined by " + ".

    >>> weights_source(["a", "b"], {"b": 2.0}, {}), weights_source(["a"], {}, {"a": 0.5})
    ('--weights + default 1.0', 'file metadata')
    """
    used = {"--weights" if c in given else "file metadata" if c in stored else "default 1.0" for c in channels}
    return " + ".join(s for s in ("--weights", "file metadata", "default 1.0") if s in used) or "default 1.0"


def _parquet_kind(path: Path) -> str | None:
    return "parquet" if path.suffix in PARQUET_SUFFIXES else None


def _no_parquet_files(text: str, inside: list[Path]) -> InputError:
    return InputError(f"{text}: directory holds no Parquet files (*.parquet)")


def resolve_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Expand files, directories (recursively, ``*.parquet``) and glob patterns into a file list, each once."""
    expansion = expand_paths(paths, kind_of=_parquet_kind, empty_directory=_no_parquet_files)
    return [path for _, path in expansion.files]


def weight_channels(names: Sequence[str]) -> tuple[str, ...]:
    """Channels with a ``weight/<channel>`` column among a table's column names (dynamic channel weights).

    >>> weight_channels(["step", "weight/format", "reward/format", "weight/"])
    ('format',)
    """
    prefix = DYNAMIC_WEIGHT_PREFIX
    return tuple(n[len(prefix) :] for n in names if n.startswith(prefix) and len(n) > len(prefix))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def open_parquet(path: Path, data: bytes | None = None) -> pq.ParquetFile:
    """Open a Parquet file (``data``: its bytes, fetched already), turning pyarrow's errors into one-line
    :class:`InputError`s."""
    if data is not None or isinstance(path, RemotePath):
        # A small object in one GET; a large one through one ranged handle (footer, then one chunk per read).
        source: Any = parquet_source(path, data)
        head = source.read(4)
        source.seek(0)
    else:
        try:
            with path.open("rb") as local:
                head = local.read(4)
        except OSError as exc:
            raise InputError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
        # pyarrow takes paths as UTF-8; a name that is not (undecodable bytes on Linux) is opened by Python.
        source = path if _is_utf8(str(path)) else path.open("rb")
    if not head:
        raise InputError(
            f"{path}: the file is empty (0 bytes)",
            hint="if the trainer is still writing it, wait for it to be closed; else point at the run's rollouts",
        )
    if head != _MAGIC:
        raise InputError(
            f"{path}: not a Parquet file (it does not start with the Parquet magic bytes)",
            hint="pass a .parquet rollout table",
        )
    try:
        # pre_buffer=False: with pre-buffering, iter_batches keeps every row group it read until the file
        # is closed, so memory would grow with the run (measured in docs/benchmarks.md). A local file is read
        # through a buffer of READ_BUFFER bytes: a column chunk of long text (131 MB in a row group of 8,192
        # completions of 16 kB) is then never held whole (an object in storage is not: one ranged read a chunk).
        buffered = 0 if data is not None or isinstance(path, RemotePath) else READ_BUFFER
        return pq.ParquetFile(source, pre_buffer=False, buffer_size=buffered)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{path}: truncated or corrupt Parquet file ({_first_line(exc)})",
            hint="if the trainer is still writing it, wait for the file to be closed",
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def batch_rows(pf: pq.ParquetFile, columns: Sequence[str]) -> int:
    """Rows per record batch for ``columns`` of this file: :data:`BATCH_ROWS`, fewer where a row of them holds more
    than ``BATCH_BYTES / BATCH_ROWS`` bytes, at least 16. A row's bytes are the footer's uncompressed column chunk
    sizes (the widest row group decides) and, where a text column is read, what its first rows take once decoded:
    a dictionary-encoded column of long identical completions (a collapsed policy) is small on disk and large in
    memory.

    >>> import io
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"step": [0] * 32, "completion": [f"{i % 2}" * 20_000 for i in range(32)]}), sink)
    >>> handle = pq.ParquetFile(pa.BufferReader(sink.getvalue()))
    >>> batch_rows(handle, ["step"]), batch_rows(handle, ["step", "completion"])
    (262144, 838)
    """
    meta = pf.metadata
    names = meta.schema.names
    wanted = {i for i, name in enumerate(names) if name in set(columns) or name.split(".")[0] in set(columns)}
    widest = 0.0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows:
            size = sum(group.column(i).total_uncompressed_size for i in range(group.num_columns) if i in wanted)
            widest = max(widest, size / group.num_rows)
    schema = pf.schema_arrow
    text = [c for c in columns if c in schema.names and _is_text(schema.field(c).type)]
    if text and meta.num_rows:
        first = next(pf.iter_batches(batch_size=16, columns=text, row_groups=[0]), None)
        if first is not None and first.num_rows:
            widest = max(widest, first.nbytes / first.num_rows)
    return int(min(BATCH_ROWS, max(16, BATCH_BYTES // widest))) if widest > 0 else BATCH_ROWS


def _iter_batches(
    pf: pq.ParquetFile,
    path: Path,
    columns: list[str],
    unify: Mapping[str, pa.DataType] | None = None,
    row_groups: Sequence[int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The file's record batches of ``columns`` (of ``row_groups`` only, if given; :func:`batch_rows` rows each);
    ``unify`` casts the columns whose type differs between files."""
    try:
        size = batch_rows(pf, columns)
        for batch in pf.iter_batches(batch_size=size, columns=columns, row_groups=row_groups):
            if unify:
                for name, dtype in unify.items():
                    index = batch.schema.get_field_index(name)
                    if index >= 0 and batch.schema.field(index).type != dtype:
                        batch = batch.set_column(index, name, pc.cast(batch.column(index), dtype))
            yield batch
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{path}: cannot read data ({_first_line(exc)})", hint="the file may be truncated or corrupt"
        ) from exc


def reward_array(batch: pa.RecordBatch | pa.Table, reward: RewardColumn) -> pa.Array:
    column = batch.column(reward.column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if reward.struct_field is not None:
        column = pc.struct_field(column, reward.struct_field)
    return column


def to_float32(array: pa.Array) -> np.ndarray:
    """Numbers (nulls become NaN) as a float32 numpy array."""
    if pa.types.is_decimal(array.type) or pa.types.is_null(array.type):
        array = pc.cast(array, pa.float64())
    return np.asarray(pc.cast(array, pa.float32()).to_numpy(zero_copy_only=False), dtype=np.float32)


REWARD_MAGNITUDE_LIMIT = 1e12
"""The largest reward magnitude accepted. The engine computes in float32 (24-bit mantissa) and bins reward totals
to 1e-5 in 64-bit integers for its tie counts; beyond about 1e13 those bins overflow and float32 keeps no
digit below the unit, so the statistics would stop being the same at every scale. Advantages do not depend on
a common scale of the rewards, so dividing every channel by one power of ten loses nothing."""


def _huge_rewards(reward: RewardColumn, values: pa.Array, count: int, path: Path) -> None:
    finite = values.filter(pc.is_finite(values)) if pa.types.is_floating(values.type) else values
    largest = float(pc.max(pc.abs(pc.cast(finite, pa.float64()))).as_py() or 0.0)
    raise SchemaError(
        f"{path}: reward column {reward.label!r} has {count} row(s) with a magnitude above "
        f"{REWARD_MAGNITUDE_LIMIT:.0e} (largest {largest:.3g})",
        hint="collapse-doctor computes in float32: rescale the rewards, dividing every channel by the same power "
        "of ten (advantages do not change under a common scale)",
    )


def _missing_ids(keys: pa.Array) -> int:
    """Group ids that are missing: nulls, and NaN in a float column (a NaN id would be a group of its own per row).

    >>> _missing_ids(pa.array([1.0, float("nan"), None])), _missing_ids(pa.array(["a", None]))
    (2, 1)
    """
    if pa.types.is_floating(keys.type):
        return int(pc.sum(pc.is_null(keys, nan_is_null=True)).as_py() or 0)
    return keys.null_count


def _step_values(array: pa.Array, path: Path, column: str) -> np.ndarray:
    if array.null_count:
        raise SchemaError(
            f"{path}: step column {column!r} has {array.null_count} empty (null) values",
            hint="every rollout needs the training step that produced it",
        )
    values = array.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f" and not (np.all(np.isfinite(values)) and np.all(values == np.round(values))):
        raise SchemaError(
            f"{path}: step column {column!r} holds values that are not whole numbers",
            hint="pass --step-col with the column that holds the training step",
        )
    limit = np.iinfo(np.int64).max
    if len(values) and (
        (values.dtype.kind == "u" and int(values.max()) > limit)
        or (values.dtype.kind == "f" and float(np.abs(values).max()) >= 2.0**63)
    ):
        raise SchemaError(
            f"{path}: step column {column!r} holds a value beyond 64-bit integers ({int(values.max())})",
            hint="steps are counters of the training loop; pass --step-col with the column that holds them",
        )
    return values.astype(np.int64)


class ParquetRun:
    """A run stored as one or more Parquet files in the canonical layout (or close to it).

    Opening validates every file and scans the step and reward columns; :meth:`iter_steps` then
    yields one :class:`RolloutBatch` per training step. With ``check_rewards_first=False`` the
    opening pass reads only the step column and rewards are checked (NaN counts, +-inf rejected) as
    pass 2 reads them: less reading for callers that write nothing before the end (``scan``).
    """

    check_rewards_first: bool = True
    steps_in_tasks: bool = True
    """Whether pass 1 may be left to shards' tasks (:func:`steps_read_in_tasks`); not for a table held in memory."""
    part_of_run: bool = False
    """A part of a run (a part file the TRL callback writes): that some reward is finite is checked on the whole
    run, not on each part (a judge may return None for every completion of a few steps)."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        step_col: str | None = None,
        group_col: str | None = None,
        reward_cols: Sequence[str] | None = None,
        group_size: int | None = None,
        weights: dict[str, float] | None = None,
        check_rewards_first: bool = True,
    ) -> None:
        self.check_rewards_first = check_rewards_first
        self.files = resolve_inputs(paths)
        self._open(
            self._reopen(),
            step_col=step_col,
            group_col=group_col,
            reward_cols=reward_cols,
            group_size=group_size,
            weights=weights,
        )

    def _open(
        self,
        handles: list[pq.ParquetFile],
        *,
        step_col: str | None,
        group_col: str | None,
        reward_cols: Sequence[str] | None,
        group_size: int | None,
        weights: dict[str, float] | None,
    ) -> None:
        """Discover the columns in the first file, check the others against them, and run pass 1."""
        self._handles = handles
        first = self._handles[0]
        self.columns: ColumnMap = discover_columns(
            first.schema_arrow,
            source=str(self.files[0]),
            step_col=step_col,
            group_col=group_col,
            reward_cols=reward_cols,
            group_size=group_size,
        )
        for path, handle in zip(self.files[1:], self._handles[1:], strict=True):
            check_same_layout(handle.schema_arrow, self.columns, source=str(path))
        self._unify = unified_types([h.schema_arrow for h in self._handles], self.columns, [str(p) for p in self.files])
        self.metadata: dict[bytes, bytes] = dict(first.metadata.metadata or {}) if first.metadata else {}
        stored = metadata_weights(self.metadata, source=str(self.files[0]))
        self.channels: tuple[str, ...] = self.columns.channels
        self.weights = resolve_weights(self.channels, weights or {}, stored)
        self.weights_source = weights_source(self.channels, weights or {}, stored)
        """Where :attr:`weights` came from: "--weights", "file metadata" or "default 1.0" (joined with " + ")."""
        self.declared_algorithm = metadata_algorithm(self.metadata)
        """The estimator the writer declared (see :func:`~collapse_doctor.core.schema.metadata_algorithm`)."""
        self.dynamic_weight_channels = weight_channels(first.schema_arrow.names)
        """Channels whose per-row weights the rollouts carry (``weight/<channel>`` columns of the first file)."""
        self.notes = IngestNotes(files=len(self.files))
        self._note_layout(group_col, group_size)
        self._last_row: dict[int, int] = {}
        self._rows: tuple[int, int | None] = (0, None)
        """The rows pass 2 reads, ``[start, end)`` over the files in order (``end`` None: to the last row)."""
        self.num_rows = 0
        self.sorted_steps = True
        """Whether steps never decrease in reading order (then :meth:`iter_chunks` takes its fast path)."""
        self._labels: dict[str, dict[int, str]] = {}
        """Step labels the shards' tasks gathered (:meth:`accept_claims`), by column."""
        self._claim_pending = False
        if self.steps_in_tasks and not self.check_rewards_first and _STEPS_IN_TASKS.get():
            self._steps_read = False  # footers only: pass 1 runs in the tasks, or here when first needed
            self.num_rows = sum(h.metadata.num_rows for h in self._handles)
            if self.num_rows == 0:
                self._no_rows()
        else:
            self._scan()

    def _note_layout(self, group_col: str | None, group_size: int | None) -> None:
        """What the layout leaves unread, for the warnings: an overridden group column, reward columns that only
        later files have, and files that look like copies of each other."""
        first = self._handles[0].schema_arrow
        if group_size is not None and group_col is None and GROUP_ID in first.names:
            self.notes.group_column_ignored = GROUP_ID
        known = set(first.names)
        later: Counter[str] = Counter()
        for handle in self._handles[1:]:
            later.update(n for n in handle.schema_arrow.names if n not in known and discover_reward_name(n))
        self.notes.later_reward_columns = dict(later)
        if UNCHECKED_ADVANTAGE in first.names and self.columns.advantage is None:
            self.notes.source_notes.append(
                f"the rollouts keep the trainer's advantages as {UNCHECKED_ADVANTAGE!r}: they include a KL penalty the "
                "rows do not carry (TRL RLOOTrainer with beta != 0, through CollapseDoctorCallback), so they are not "
                "compared (CD202 skipped); with beta=0 they are"
            )
        seen: dict[tuple[int, int, int], int] = {}
        for index, handle in enumerate(self._handles):
            meta = handle.metadata
            key = (meta.num_rows, meta.num_row_groups, meta.serialized_size)
            earlier = seen.setdefault(key, index)
            if earlier != index and meta.equals(self._handles[earlier].metadata):
                self.notes.identical_files.append((str(self.files[earlier]), str(self.files[index])))

    _steps_read = True
    """Whether pass 1 ran (the steps' last rows and their order are known)."""
    _claim_pending = False
    """Whether this is a :meth:`step_shard` whose pass 1 (:meth:`claim_steps`) has not run yet."""

    def read_steps(self) -> None:
        """Pass 1, if it has not run yet: over the whole run (opened in :func:`steps_read_in_tasks` and then reduced
        here), or over a :meth:`step_shard`'s rows (:meth:`claim_steps`)."""
        if self._claim_pending:
            self.claim_steps()
        elif not self._steps_read:
            self._scan()

    @property
    def steps(self) -> list[int]:
        self.read_steps()
        return sorted(self._last_row)

    def step_labels(self, column: str) -> dict[int, str] | None:
        """``{step: value}`` of a per-step text column (the ``aggregation`` the trainer used), ``None`` when the
        run's first file has no such column; a step with several values keeps its first."""
        if column not in self._handles[0].schema_arrow.names or column in (self.columns.step, self.columns.group):
            return None
        if column in self._labels:
            return dict(self._labels[column])
        labels: dict[int, str] = {}
        for _, batch in self._range_batches([self.columns.step, column]):
            pairs = pa.table({"s": batch.column(self.columns.step), "v": pc.cast(batch.column(column), pa.string())})
            unique = pairs.group_by(["s", "v"], use_threads=False).aggregate([])
            for step, value in zip(unique.column("s").to_pylist(), unique.column("v").to_pylist(), strict=True):
                if step is not None and value is not None:
                    labels.setdefault(int(step), value)
        return labels

    def set_length_cap(self, tokens: int) -> None:
        """Tell the cut completions by the generation length cap (``--max-completion-length``): a row whose
        ``completion_length`` (tokens) reaches ``tokens`` was cut. A ``truncated`` column wins (it is the trainer's
        own word), and text lengths, in characters, are not compared with a cap in tokens: either case is a
        warning, not an error, so a sweep of runs of both kinds still scans."""
        if self.columns.truncated:
            self.notes.length_cap_unused = f"the rollouts' {self.columns.truncated!r} column says which were cut"
        elif not self.columns.completion_length:
            self.notes.length_cap_unused = (
                f"the rollouts have no {COMPLETION_LENGTH!r} column in tokens (a text's length is in characters)"
            )
        self.columns = replace(self.columns, length_cap=int(tokens))

    # --- shards: pass 2 over a range of whole steps, in another process -------------------------------------

    def shards(self, rows: int) -> list[tuple[int, int]]:
        """Row ranges ``[start, end)`` of about ``rows`` rows that cut only where a step ends, covering the run in
        order; ``[]`` when the steps are not in ascending order (a step's rows may then be anywhere)."""
        self.read_steps()
        if not self.sorted_steps:
            return []
        ends = np.array(sorted(self._last_row.values()), dtype=np.int64) + 1
        out, start = [], 0
        while start < self.num_rows:
            at = int(np.searchsorted(ends, start + rows))  # the first step end at or past the target
            end = int(ends[min(at, len(ends) - 1)])
            out.append((start, end))
            start = end
        return out

    def plan_shards(self, rows: int) -> list[tuple[int, int]]:
        """Row ranges ``[start, end)`` of at least ``rows`` rows (the last one: the rest, if at least half as many,
        else it joins the one before) that start and end where a row group does, covering the run in order, from
        the footers alone: no column is read. Each range goes to a task as :meth:`step_shard`, which finds its own
        steps. ``[]`` when the footers' step statistics (or pass 1, if it ran) show steps out of order."""
        if self._steps_read and not self.sorted_steps:
            return []
        bounds: list[int] = []
        offset = 0
        highest: int | None = None
        for handle in self._handles:
            meta = handle.metadata
            for g in range(meta.num_row_groups):
                count = meta.row_group(g).num_rows
                if not count:
                    continue
                low, high = self._group_steps(meta, g)
                if low is not None and highest is not None and low < highest:
                    return []  # a row group starts below where an earlier one reached: not in ascending order
                highest = high if high is not None else highest
                offset += count
                bounds.append(offset)
        out: list[tuple[int, int]] = []
        start = 0
        for end in bounds:
            if end - start >= rows:
                out.append((start, end))
                start = end
        if start < offset:
            if out and offset - start < rows // 2:
                out[-1] = (out[-1][0], offset)
            else:
                out.append((start, offset))
        return out

    def _group_steps(self, meta: pq.FileMetaData, group: int) -> tuple[int | None, int | None]:
        """The lowest and highest step of a row group from its footer statistics (``None`` where not told)."""
        names = meta.schema.names
        if self.columns.step not in names:
            return None, None
        stats = meta.row_group(group).column(names.index(self.columns.step)).statistics
        if stats is None or not stats.has_min_max:
            return None, None

        def whole(value: Any) -> int | None:
            if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
                return None
            return int(value) if float(value).is_integer() else None

        return whole(stats.min), whole(stats.max)

    def step_shard(self, start: int, end: int) -> ParquetRun:
        """This run's rows ``[start, end)`` (from :meth:`plan_shards`) for a task that runs pass 1 over them itself
        (:meth:`claim_steps`, which :meth:`iter_chunks` calls first): picklable, with counts of its own, like
        :meth:`shard`."""
        part = self.shard(start, end)
        part._claim_pending = True
        part._last_row = {}
        return part

    def claim_steps(self) -> StepClaim | None:
        """In a task, pass 1 over a :meth:`step_shard`'s planned rows: it owns the steps that start there and reads
        the step column past the range's end until its last step ends. The rows of the step the range opens with,
        if that step started before it (the step of the row before: footer statistics, else read), are the
        previous shard's. ``None`` for a part that has nothing to claim (a :meth:`shard` cut after pass 1)."""
        if not self._claim_pending:
            return None
        self._claim_pending = False
        start, end = self._rows
        assert end is not None
        label = AGGREGATION if self._has_labels() else None
        before = self._step_before(start) if start > 0 else None
        steps, labels = self._steps_between(start, end, label)
        ascending = bool(np.all(steps[1:] >= steps[:-1])) and (before is None or not len(steps) or steps[0] >= before)
        if not ascending or not len(steps):
            self._rows = (start, start)
            self.sorted_steps = False
            self._steps_read = True
            return StepClaim((start, end), (start, start), before, None, False)
        skip = int(np.searchsorted(steps, before, side="right")) if before is not None else 0
        last_step = int(steps[-1])
        first, stop, ahead = start + skip, start + skip, True
        last_rows: dict[int, int] = {}
        if skip < len(steps):
            stop, ahead, tail_labels = self._step_end(end, last_step, label)
            own = steps[skip:]
            ends = np.append(np.flatnonzero(own[1:] != own[:-1]), len(own) - 1)
            last_rows = dict(zip(own[ends].tolist(), (first + ends).tolist(), strict=True))
            last_rows[last_step] = stop - 1
            if labels is not None:
                owned = {s: v for s, v in labels.items() if before is None or s > before}
                for step, value in (tail_labels or {}).items():
                    owned.setdefault(step, value)
                labels = owned
        self._rows = (first, stop)
        self._last_row = last_rows
        self.sorted_steps = ascending and ahead
        self._steps_read = True
        return StepClaim((start, end), (first, stop), before, last_step, self.sorted_steps, last_rows, labels)

    def accept_claims(self, claims: Sequence[StepClaim]) -> bool:
        """In the driver, the claims of every shard of :meth:`plan_shards`, in order: whether they cover the run
        once, in order, with steps ascending (then pass 1's result and the step labels are taken from them, as if
        pass 1 had run here); ``False`` when a task found steps out of order (the run is then reduced here)."""
        position, previous = 0, None
        for k, claim in enumerate(claims):
            if (
                not claim.ascending
                or (k and claim.before != previous)
                or claim.planned[0] != (claims[k - 1].planned[1] if k else 0)
            ):
                return False
            first, stop = claim.rows
            if first < stop:
                if first != position:
                    return False
                position = stop
            previous = claim.last_in_range
        if position != self.num_rows:
            return False
        self._last_row = {}
        labels: dict[int, str] = {}
        for claim in claims:
            self._last_row.update(claim.last_rows)
            for step, value in (claim.labels or {}).items():
                labels.setdefault(step, value)
        if self._has_labels():
            self._labels[AGGREGATION] = labels
        self.sorted_steps = True
        self._steps_read = True
        return True

    def _has_labels(self) -> bool:
        names = self._handles[0].schema_arrow.names
        return AGGREGATION in names and AGGREGATION not in (self.columns.step, self.columns.group)

    def _step_before(self, row: int) -> int:
        """The step of row ``row - 1``: the highest step of the row group it ends (its footer), else read."""
        offset = 0
        for handle in self._handles:
            meta = handle.metadata
            for g in range(meta.num_row_groups):
                offset += meta.row_group(g).num_rows
                if offset == row:
                    high = self._group_steps(meta, g)[1]
                    if high is not None:
                        return high  # the last row's step when the group is in order, which its task checks
        steps, _ = self._steps_between(row - 1, row, None)
        return int(steps[-1])

    def _steps_between(self, start: int, end: int, label: str | None) -> tuple[np.ndarray, dict[int, str] | None]:
        """The steps of rows ``[start, end)`` (validated), and the first label of each step when ``label``."""
        cols = self.columns
        parts: list[np.ndarray] = []
        labels: dict[int, str] | None = {} if label else None
        for path, batch in self._batches_between(start, end, [cols.step, *([label] if label else [])]):
            steps = _step_values(batch.column(cols.step), path, cols.step)
            parts.append(steps)
            if labels is not None and label is not None:
                _first_labels(steps, batch.column(label), labels)
        return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), labels

    def _step_end(self, row: int, step: int, label: str | None) -> tuple[int, bool, dict[int, str] | None]:
        """Where ``step``, whose rows run up to ``row``, ends: the first row from ``row`` on with another step (the
        run's end if none); whether that next step is higher; the step's first label among those rows."""
        cols = self.columns
        position = row
        labels: dict[int, str] | None = {} if label else None
        for path, batch in self._batches_between(row, None, [cols.step, *([label] if label else [])]):
            steps = _step_values(batch.column(cols.step), path, cols.step)
            other = np.flatnonzero(steps != step)
            cut = int(other[0]) if len(other) else len(steps)
            if labels is not None and label is not None and cut:
                _first_labels(steps[:cut], batch.column(label).slice(0, cut), labels)
            if len(other):
                return position + cut, bool(steps[cut] > step), labels
            position += len(steps)
        return position, True, labels

    @property
    def row_range(self) -> tuple[int, int]:
        """The rows pass 2 reads, ``[start, end)`` over the files in order (a shard's; the whole run by default)."""
        start, end = self._rows
        return start, self.num_rows if end is None else end

    def shard(self, start: int, end: int) -> ParquetRun:
        """This run's pass 2 restricted to rows ``[start, end)`` (from :meth:`shards`), with counts of its own:
        picklable (files are reopened where it is read), its notes start empty (:meth:`add_notes` merges them)
        and the checks of the whole run are left to :meth:`finish_shards`."""
        part = copy.copy(self)
        part._rows = (start, end)
        part.notes = IngestNotes(files=self.notes.files)
        part._whole_run = False
        return part

    def add_notes(self, notes: IngestNotes) -> None:
        """Add a shard's counts (NaN rewards, group sizes, duplicates, repeats) to this run's."""
        self.notes.add_counts(notes)

    def finish_shards(self) -> None:
        """After every shard of pass 2 was read and its notes added: the checks of the whole run."""
        if not self.check_rewards_first:
            self._check_some_reward()

    _whole_run = True

    def _finish_pass(self) -> None:
        if self._whole_run:
            self.finish_shards()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_handles"]  # open file handles do not travel: the files are reopened where the shard is read
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handles = self._reopen()

    def _reopen(self) -> list[pq.ParquetFile]:
        return [open_parquet(p) for p in self.files]

    def _range_batches(self, columns: list[str]) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """``(file, record batch)`` of ``columns`` over the rows of :attr:`_rows`, in order: files and row groups
        outside the range are not read, batches at its edges are sliced."""
        return self._batches_between(*self._rows, columns)

    def _batches_between(
        self, start: int, end: int | None, columns: list[str]
    ) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """``(file, record batch)`` of ``columns`` over rows ``[start, end)`` (``end`` None: to the last row)."""
        if end is not None and end <= start:
            return
        whole = start == 0 and end is None
        if end is None:
            end = sum(h.metadata.num_rows for h in self._handles)
        offset = 0
        for path, handle in zip(self.files, self._handles, strict=True):
            meta = handle.metadata
            if whole:
                yield from ((path, b) for b in _iter_batches(handle, path, columns, self._unify))
                continue
            if offset >= end or offset + meta.num_rows <= start:
                offset += meta.num_rows
                continue
            group_starts = offset + np.concatenate(
                [[0], np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])]
            )
            groups = np.flatnonzero((group_starts[:-1] < end) & (group_starts[1:] > start)).tolist()
            offset += meta.num_rows
            position = int(group_starts[groups[0]])
            for batch in _iter_batches(handle, path, columns, self._unify, row_groups=groups):
                lo, hi = max(start - position, 0), min(end - position, batch.num_rows)
                position += batch.num_rows
                if hi > lo:
                    yield path, batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)
                if position >= end:
                    break

    @property
    def ground_truth(self) -> dict[str, Any] | None:
        import json

        raw = self.metadata.get(GROUND_TRUTH_METADATA_KEY.encode())
        try:
            return dict(json.loads(raw)) if raw else None
        except ValueError:
            return None

    def _scan(self) -> None:
        """Pass 1: validate steps (and rewards, unless deferred), find where each step ends."""
        cols = self.columns
        early = self.check_rewards_first
        read = list(dict.fromkeys([cols.step, *(r.column for r in cols.rewards if early)]))
        inf_rows: Counter[str] = Counter()
        inf_file: dict[str, Path] = {}
        offset = 0
        previous: int | None = None
        for path, handle in zip(self.files, self._handles, strict=True):
            for batch in _iter_batches(handle, path, read, self._unify):
                steps = _step_values(batch.column(cols.step), path, cols.step)
                if early:
                    rewards = np.stack([to_float32(reward_array(batch, r)) for r in cols.rewards], axis=1)
                    for channel, count in self._count_rewards(rewards, batch, path).items():
                        inf_rows[channel] += count
                        inf_file.setdefault(channel, path)
                if len(steps):
                    ascending = bool(np.all(steps[1:] >= steps[:-1]))
                    if ascending:  # the usual layout: each step's rows end where the next step starts
                        ends = np.append(np.flatnonzero(steps[1:] != steps[:-1]), len(steps) - 1)
                        unique, last = steps[ends], offset + ends
                    else:
                        unique, first_in_reversed = np.unique(steps[::-1], return_index=True)
                        last = offset + len(steps) - 1 - first_in_reversed
                    self.sorted_steps &= ascending and (previous is None or int(steps[0]) >= previous)
                    previous = int(steps[-1])
                    self._last_row.update(zip(unique.tolist(), last.tolist(), strict=True))
                offset += len(steps)
        self.num_rows = offset
        self._steps_read = True
        if inf_rows:
            channel, count = inf_rows.most_common(1)[0]
            self._infinite_rewards(channel, count, inf_file[channel])
        if self.num_rows == 0:
            self._no_rows()
        if early:
            self._check_some_reward()

    def _no_rows(self) -> None:
        names = ", ".join(str(f) for f in self.files[:3])
        raise InputError(f"{names}: the input has no rows", hint="point at a run that logged rollouts")

    def _check_some_reward(self) -> None:
        """A run whose every reward is NaN has nothing to judge: an error, not a healthy verdict."""
        if self.part_of_run:
            return
        if all(self.notes.nan_rewards[r.channel] >= self.num_rows for r in self.columns.rewards):
            names = ", ".join(str(f) for f in self.files[:3]) + (" ..." if len(self.files) > 3 else "")
            columns = ", ".join(r.label for r in self.columns.rewards)
            raise InputError(
                f"{names}: no finite reward in any channel ({columns}: all {self.num_rows:,} rows NaN or null)",
                hint="check that the reward functions ran (None means 'not applicable'), or pass --reward-cols",
            )

    def _count_rewards(self, rewards: np.ndarray, source: pa.RecordBatch | pa.Table, path: Path) -> dict[str, int]:
        """Add the NaN counts of a block of rewards ``[N, C]`` to the notes; return +-inf counts per channel.

        A finite reward beyond :data:`REWARD_MAGNITUDE_LIMIT` (``source`` tells it from a true infinity that the
        float32 conversion also gives) is an error naming the column and the range.
        """
        if bool((np.abs(rewards) <= REWARD_MAGNITUDE_LIMIT).all()):
            return {}  # the usual block: no NaN, nothing beyond the limit (one pass over the whole block)
        nan = np.isnan(rewards).sum(axis=0)
        beyond = (np.abs(rewards) > REWARD_MAGNITUDE_LIMIT).sum(axis=0)  # +-inf included
        found = {}
        for k, reward in enumerate(self.columns.rewards):
            self.notes.nan_rewards[reward.channel] += int(nan[k])
            if beyond[k]:
                values = reward_array(source, reward)
                infinite = int(pc.sum(pc.is_inf(values)).as_py() or 0) if pa.types.is_floating(values.type) else 0
                if infinite < beyond[k]:
                    _huge_rewards(reward, values, int(beyond[k]) - infinite, path)
                found[reward.channel] = infinite
        return found

    def _infinite_rewards(self, channel: str, count: int, path: Path) -> None:
        label = next(r.label for r in self.columns.rewards if r.channel == channel)
        raise SchemaError(
            f"{path}: reward column {label!r} has {count} row(s) with +inf or -inf",
            hint="rewards must be finite; use NaN (None in TRL) for 'not applicable'",
        )

    def _check_rewards_late(self, rewards: np.ndarray, source: pa.RecordBatch | pa.Table, path: Path) -> None:
        """With ``check_rewards_first=False``, pass 2 counts NaN and rejects +-inf as it reads."""
        if not self.check_rewards_first:
            for channel, count in self._count_rewards(rewards, source, path).items():
                self._infinite_rewards(channel, count, path)

    def iter_steps(self) -> Iterator[RolloutBatch]:
        """Pass 2: yield each step's rollouts as soon as its last row has been read."""
        self.read_steps()
        cols = self.columns
        read = cols.source_columns
        pending: dict[int, list[tuple[np.ndarray, pa.RecordBatch]]] = {}
        offset = self._rows[0]
        for path, batch in self._range_batches(read):
            n = batch.num_rows
            steps = _step_values(batch.column(cols.step), path, cols.step)
            order = np.argsort(steps, kind="stable")
            sorted_steps = steps[order]
            cuts = np.flatnonzero(np.diff(sorted_steps)) + 1
            for part in np.split(order, cuts) if n else []:
                step = int(steps[part[0]])
                contiguous = part[-1] - part[0] + 1 == len(part)
                rows = batch.slice(int(part[0]), len(part)) if contiguous else batch.take(pa.array(part))
                pending.setdefault(step, []).append((offset + part, rows))
            offset += n
            done = sorted(s for s in pending if self._last_row[s] < offset)
            for step in done:
                yield self._assemble(step, pending.pop(step), path)
        self._finish_pass()

    def iter_chunks(self, max_rows: int) -> Iterator[StackedChunk]:
        """Pass 2 in chunks of whole steps (about ``max_rows`` rows; a larger step stays whole).

        With steps in ascending order (the usual layout) a chunk is cut straight from the record batches,
        with no per-step work; otherwise steps are assembled one by one and stacked.
        """
        self.read_steps()
        if not self.sorted_steps:
            for batches in chunk_steps(self.iter_steps(), max_rows):
                yield stack_chunk(batches)
            return
        cols = self.columns
        read = cols.source_columns
        pending: list[pa.RecordBatch] = []
        rows, offset, size = 0, self._rows[0], 0
        path = self.files[-1]
        for path, batch in self._range_batches(read):
            if cols.group is not None and _missing_ids(batch.column(cols.group)):
                self._null_groups(batch, path)
            pending.append(batch)
            rows += batch.num_rows
            offset += batch.num_rows
            size += batch.nbytes
            if rows < max_rows and size < CHUNK_BYTES:
                continue
            table = pa.Table.from_batches(pending)
            steps = _step_values(table.column(cols.step).combine_chunks(), path, cols.step)
            last_step = int(steps[-1])
            cut = rows if self._last_row[last_step] < offset else int(np.searchsorted(steps, last_step))
            if cut == 0:
                continue  # one step larger than a chunk: keep reading until it is complete
            yield self._stack(table.slice(0, cut), steps[:cut], path)
            rest = table.slice(cut)
            pending, rows = rest.to_batches(), rest.num_rows
            size = sum(b.nbytes for b in pending)
        if rows:
            table = pa.Table.from_batches(pending)
            steps = _step_values(table.column(cols.step).combine_chunks(), path, cols.step)
            yield self._stack(table, steps, path)
        self._finish_pass()

    def _null_groups(self, batch: pa.RecordBatch, path: Path) -> None:
        cols = self.columns
        assert cols.group is not None
        keys = batch.column(cols.group)
        steps = batch.column(cols.step).filter(pc.is_null(keys, nan_is_null=True))
        raise SchemaError(
            f"{path}: group column {cols.group!r} has {_missing_ids(keys)} empty (null or NaN) value(s) at step "
            f"{steps[0]}",
            hint="fill the group ids, or pass --group-size N for consecutive blocks",
        )

    def _stack(self, table: pa.Table, steps: np.ndarray, path: Path) -> StackedChunk:
        """One chunk of whole steps in ascending order: dense group ids unique across the chunk."""
        cols = self.columns
        table = table.combine_chunks()
        n = table.num_rows
        step_starts = np.concatenate([[0], np.flatnonzero(steps[1:] != steps[:-1]) + 1])
        step_lengths = np.diff(np.append(step_starts, n))
        step_index = np.repeat(np.arange(len(step_starts)), step_lengths)
        if cols.group is None and cols.group_size is not None:
            size = cols.group_size
            per_step = -(-step_lengths // size)
            self.notes.ragged_blocks += int(np.count_nonzero(step_lengths % size))
            group_offsets = np.concatenate([[0], np.cumsum(per_step)[:-1]])
            position = np.arange(n) - np.repeat(step_starts, step_lengths)
            group_index = position // size + np.repeat(group_offsets, step_lengths)
        else:
            name = cols.group if cols.group is not None else cols.prompt
            assert name is not None  # discover_columns guarantees a way to group
            group_index = _group_runs(table.column(name).chunk(0), step_starts, step_index)
        num_groups = int(group_index.max()) + 1
        sizes = np.bincount(group_index, minlength=num_groups)
        self.notes.group_sizes.update(dict(zip(*np.unique(sizes, return_counts=True), strict=True)))
        codes, lengths = completion_rows(table, cols)
        if codes is not None:
            self.notes.duplicate_rows += _count_duplicates(table, group_index, cols, codes)
            self._count_repeats(table, group_index, step_index, codes)
        cut = cut_flags(table, cols)
        rewards = np.stack([to_float32(reward_array(table, r)) for r in cols.rewards], axis=1)
        self._check_rewards_late(rewards, table, path)
        logged = None
        if cols.advantage:  # writable: torch wants to own what it wraps
            logged = np.require(to_float32(table.column(cols.advantage).chunk(0)), requirements="W")
        return StackedChunk(
            rewards=rewards,
            group_index=group_index,
            step_index=step_index,
            steps=steps[step_starts],
            num_groups=num_groups,
            logged=logged,
            completion_codes=codes,
            completion_lengths=lengths,
            completion_cut=cut,
            completion_cut_rule=cols.cut_rule or CUT_BY_FLAG,
            completion_tokens=cols.completion_length is not None,
        )

    def _assemble(self, step: int, parts: list[tuple[np.ndarray, pa.RecordBatch]], path: Path) -> RolloutBatch:
        cols = self.columns
        row_ids = np.concatenate([ids for ids, _ in parts])
        table = pa.Table.from_batches([b for _, b in parts]).combine_chunks()
        rewards = np.stack([to_float32(reward_array(table, r)) for r in cols.rewards], axis=1)
        self._check_rewards_late(rewards, table, path)
        group_keys, group_index = self._groups(table, step, path)
        num_groups = int(group_index.max()) + 1 if len(group_index) else 0
        sizes = np.bincount(group_index, minlength=num_groups)
        self.notes.group_sizes.update(dict(zip(*np.unique(sizes, return_counts=True), strict=True)))
        advantage = to_float32(table.column(cols.advantage).combine_chunks()) if cols.advantage else None
        extra_names = [c for c in (cols.prompt, cols.completion, cols.completion_length, cols.truncated) if c]
        extra = table.select(extra_names) if extra_names else None
        codes, lengths = completion_rows(table, cols)
        if codes is not None:
            self.notes.duplicate_rows += _count_duplicates(table, group_index, cols, codes)
            self._count_repeats(table, group_index, np.zeros(len(group_index), dtype=np.int64), codes)
        return RolloutBatch(
            step=step,
            rewards=rewards,
            group_index=group_index,
            num_groups=num_groups,
            row_ids=row_ids,
            group_keys=group_keys,
            advantage=advantage,
            extra=extra,
            completion_codes=codes,
            completion_lengths=lengths,
            completion_cut=cut_flags(table, cols),
            completion_cut_rule=cols.cut_rule or CUT_BY_FLAG,
            completion_tokens=cols.completion_length is not None,
        )

    def _count_repeats(
        self, table: pa.Table, group_index: np.ndarray, step_index: np.ndarray, completion_codes: np.ndarray
    ) -> None:
        checked, repeated, rows = _repeated_groups(table, group_index, step_index, self.columns, completion_codes)
        self.notes.groups_checked += checked
        self.notes.repeated_groups += repeated
        self.notes.repeated_group_rows += rows

    def _groups(self, table: pa.Table, step: int, path: Path) -> tuple[pa.Array, np.ndarray]:
        cols = self.columns
        n = table.num_rows
        if cols.group is not None:
            keys = table.column(cols.group).combine_chunks()
            if missing := _missing_ids(keys):
                raise SchemaError(
                    f"{path}: group column {cols.group!r} has {missing} empty (null or NaN) value(s) at step {step}",
                    hint="fill the group ids, or pass --group-size N for consecutive blocks",
                )
            return keys, dense_codes(keys)
        if cols.group_size is not None:
            index = np.arange(n, dtype=np.int64) // cols.group_size
            if n % cols.group_size:
                self.notes.ragged_blocks += 1
            return pa.array(index), index
        assert cols.prompt is not None  # discover_columns guarantees a way to group
        prompts = table.column(cols.prompt).combine_chunks()
        index = dense_codes(prompts)
        return pa.array(index), index


def _first_labels(steps: np.ndarray, values: pa.Array, labels: dict[int, str]) -> None:
    """Add each step's first non-null label (as text) among these rows to ``labels`` (a step already there keeps
    its own), as :meth:`ParquetRun.step_labels` reads them."""
    present = np.flatnonzero(np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False)))
    if not len(present):
        return
    unique, first = np.unique(steps[present], return_index=True)
    texts = pc.cast(values, pa.string()).take(pa.array(present[first])).to_pylist()
    for step, text in zip(unique.tolist(), texts, strict=True):
        if text is not None:
            labels.setdefault(int(step), text)


def _group_runs(keys: pa.Array, step_starts: np.ndarray, step_index: np.ndarray) -> np.ndarray:
    """Dense group ids for rows sorted by step: a group is the rows of one step sharing a key.

    Groups usually come as runs of consecutive rows; then ids are run numbers. When a key comes back
    later in its step, fall back to encoding each step's keys.
    """
    n = len(keys)
    new_run = np.zeros(n, dtype=bool)
    new_run[step_starts] = True
    if n > 1:
        new_run[1:] |= np.asarray(pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False))
    run_starts = np.flatnonzero(new_run)
    runs = pa.table({"step": step_index[run_starts], "key": keys.take(pa.array(run_starts))})
    if runs.group_by(["step", "key"]).aggregate([]).num_rows == len(run_starts):
        return np.cumsum(new_run) - 1
    ends = np.append(step_starts[1:], n)
    codes, offset = [], 0
    for start, end in zip(step_starts.tolist(), ends.tolist(), strict=True):
        local = dense_codes(keys.slice(start, end - start))
        codes.append(local + offset)
        offset += int(local.max()) + 1
    return np.concatenate(codes)


def dense_codes(keys: pa.Array) -> np.ndarray:
    """Dense int64 codes ``0..K-1`` in order of first appearance, for any hashable Arrow type.

    >>> dense_codes(pa.array(["b", "a", "b", "c"])).tolist()
    [0, 1, 0, 2]
    """
    encoded = pc.dictionary_encode(keys)
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def completion_rows(table: pa.Table, cols: ColumnMap) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per row of ``table``, the completion's code and its length: what the engine knows of the completions.

    Codes come from one ``dictionary_encode`` of the completion column (equal text, equal code ``0..K-1`` in order
    of first appearance; -1 for a null text, a value of its own); None without a completion column. Lengths
    (float64) are the ``completion_length`` column (tokens) where there is one, else each text's length in
    characters (taken from the dictionary, so no second pass over the text), NaN where unknown; None with
    neither.

    >>> t = pa.table({"completion": ["ab", None, "ab", "xyz"]})
    >>> codes, lengths = completion_rows(t, ColumnMap("s", None, (), completion="completion"))
    >>> codes.tolist(), lengths.tolist()
    ([0, -1, 0, 1], [2.0, nan, 2.0, 3.0])
    """
    codes = lengths = None
    if cols.completion:
        column = table.column(cols.completion).combine_chunks()
        if not _is_text(column.type):  # chat messages (lists of structs) and the like: compared as their JSON
            column = pa.array(
                [None if v is None else json.dumps(v, sort_keys=True, default=str) for v in column.to_pylist()],
                type=pa.string(),
            )
    if cols.completion and column.null_count < len(column):  # an all-null column carries no text
        encoded = pc.dictionary_encode(column)
        codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        dictionary = encoded.dictionary
        if cols.completion_length is None and _is_text(column.type):
            per_text = np.append(_as_float64(pc.utf8_length(dictionary)), np.nan)
            lengths = per_text[np.where(codes >= 0, codes, len(dictionary))]
    if cols.completion_length:
        lengths = _as_float64(table.column(cols.completion_length).combine_chunks())
    return codes, lengths


def cut_flags(table: pa.Table, cols: ColumnMap) -> np.ndarray | None:
    """Per row, 1.0 where the completion was cut at the length cap, 0.0 where it ended on its own, NaN where that
    is unknown (a null); by the ``truncated`` column, else (``cols.length_cap``) by whether the ``completion_length``
    in tokens reached the cap; None with neither (:attr:`ColumnMap.cut_rule`).

    >>> cols = ColumnMap("s", None, (), truncated="truncated")
    >>> cut_flags(pa.table({"truncated": [True, False, None]}), cols).tolist()
    [1.0, 0.0, nan]
    >>> cols = ColumnMap("s", None, (), completion_length="n", length_cap=8)
    >>> cut_flags(pa.table({"n": [8, 3, None]}), cols).tolist()
    [1.0, 0.0, nan]
    """
    if cols.truncated:
        values = _as_float64(pc.cast(table.column(cols.truncated).combine_chunks(), pa.float64()))
        return np.where(np.isfinite(values), (values != 0).astype(np.float64), np.nan)
    if cols.cut_rule is None:
        return None
    assert cols.completion_length is not None and cols.length_cap is not None
    lengths = _as_float64(table.column(cols.completion_length).combine_chunks())
    return np.where(np.isfinite(lengths), (lengths >= cols.length_cap).astype(np.float64), np.nan)


def _is_text(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))


def _as_float64(values: pa.Array) -> np.ndarray:
    """Numbers as float64 (nulls, and values that are not numbers, NaN)."""
    try:
        values = pc.cast(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.full(len(values), np.nan)
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)


def _count_duplicates(table: pa.Table, group_index: np.ndarray, cols: ColumnMap, completion_codes: np.ndarray) -> int:
    """Rows whose prompt and completion repeat an earlier row of their group (completions compared by code)."""
    keys: dict[str, Any] = {"_group": pa.array(group_index)}
    if cols.prompt:
        keys[cols.prompt] = table.column(cols.prompt)
    keys["_completion"] = pa.array(completion_codes)
    counts = pa.table(keys).group_by(list(keys)).aggregate([([], "count_all")])
    repeated = counts.column("count_all").to_numpy()
    return int(np.maximum(repeated - 1, 0).sum())


def _mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: well-spread 64-bit hashes of integers (wrapping uint64 arithmetic)."""
    x = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _repeated_groups(
    table: pa.Table, group_index: np.ndarray, step_index: np.ndarray, cols: ColumnMap, completion_codes: np.ndarray
) -> tuple[int, int, int]:
    """``(groups checked, groups repeating an earlier one, their rows)`` among the runs of consecutive rows of one
    group: a run counts as a repeat when an earlier run of the same step has the same prompt and completion texts
    in the same order. Runs of one row or of one distinct completion (a collapsed policy repeats itself) are not
    checked: only whole groups read twice are meant."""
    n = len(group_index)
    if n < 2:
        return 0, 0, 0
    codes = np.zeros(n, dtype=np.int64)
    if cols.prompt:
        encoded = pc.dictionary_encode(table.column(cols.prompt).combine_chunks())
        indices = pc.fill_null(encoded.indices, -1)  # an empty text is a value of its own
        codes = np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64) + 1
    codes = codes * (int(completion_codes.max()) + 2) + completion_codes + 1  # completion codes: -1 for a null
    starts = np.concatenate([[0], np.flatnonzero(np.diff(group_index) != 0) + 1])
    lengths = np.diff(np.append(starts, n))
    position = np.arange(n) - np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        weighted = _mix64(codes) * _mix64(position + np.int64(1 << 40))
    digest = np.add.reduceat(weighted, starts)
    varied = np.minimum.reduceat(codes, starts) != np.maximum.reduceat(codes, starts)
    eligible = (lengths >= 2) & varied
    if not eligible.any():
        return 0, 0, 0
    with np.errstate(over="ignore"):
        keys = digest ^ _mix64(step_index[starts]) ^ (_mix64(lengths) * np.uint64(0xD6E8FEB86659FD93))
    _, first, counts = np.unique(keys[eligible], return_index=True, return_counts=True)
    repeats = counts - 1
    return int(eligible.sum()), int(repeats.sum()), int((repeats * lengths[eligible][first]).sum())
