"""``collapse-doctor advantages``: recompute GRPO/GDPO advantages of every rollout and write them out.

Steps stream in from the reader; several small steps are computed together (one engine call per
~1M rows, with a step index so batch statistics stay per step), and rows are written back in input
order through :class:`OrderedParquetWriter`, which only buffers rows that arrive ahead of their turn.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.core.batching import chunk_steps, stack_chunk
from collapse_doctor.core.errors import InputError, SchemaError, UsageError
from collapse_doctor.core.options import ReadOptions
from collapse_doctor.core.schema import (
    ADVANTAGE,
    GROUND_TRUTH_METADATA_KEY,
    GROUP_ID,
    STEP,
    WEIGHTS_METADATA_KEY,
    RolloutBatch,
    channel_column,
)
from collapse_doctor.engine.advantages import (
    CONVENTIONS,
    SCALES,
    compute_advantages,
    gdpo_advantages,
    grpo_advantages,
    resolve_device,
)
from collapse_doctor.engine.memory import release_free_memory
from collapse_doctor.engine.reduce import describe_shard, planned_shards
from collapse_doctor.io.rollouts.parquet import ParquetRun, StepClaim
from collapse_doctor.io.storage.atomic import atomic_path
from collapse_doctor.judge.algorithm import SCALE_OF, match_logged

if TYPE_CHECKING:
    from collapse_doctor.engine.cluster import Executor

ADVANTAGES_METADATA_KEY = "collapse_doctor.advantages"
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class ExportSummary:
    """What :func:`export_advantages` wrote."""

    output: Path
    rows: int
    steps: int
    channels: tuple[str, ...]
    weights: dict[str, float]
    convention: str
    scale: str
    device: str
    scale_source: str
    """Why ``scale`` was used: "--scale", "detected: ..." (from the logged advantages) or "default: ..."."""
    warnings: tuple[str, ...]
    seconds: float


class OrderedParquetWriter:
    """Write row chunks that arrive out of order as one Parquet file in row-id order.

    Chunks carry the global row ids of their rows; a row is written once every row before it has
    arrived, so sorted input streams straight through and shuffled input buffers only the rows
    that came early.
    """

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self.schema = schema
        self._next = 0
        self._ids: list[np.ndarray] = []
        self._tables: list[pa.Table] = []

    def write(self, row_ids: np.ndarray, table: pa.Table) -> None:
        self._ids.append(row_ids)
        self._tables.append(table)
        self._flush()

    def _flush(self) -> None:
        ids = np.concatenate(self._ids)
        table = pa.concat_tables(self._tables) if len(self._tables) > 1 else self._tables[0]
        if len(ids) and ids[0] == self._next and np.array_equal(ids, np.arange(self._next, self._next + len(ids))):
            ready, keep = len(ids), np.empty(0, dtype=np.int64)
            out = table
        else:
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            gaps = np.flatnonzero(ids != self._next + np.arange(len(ids)))
            ready = int(gaps[0]) if len(gaps) else len(ids)
            out = table.take(pa.array(order[:ready]))
            keep = order[ready:]
        if ready:
            self._writer.write_table(out.cast(self.schema))
            self._next += ready
        if len(keep):
            self._tables = [table.take(pa.array(keep))]
            self._ids = [np.concatenate(self._ids)[keep] if len(self._ids) > 1 else self._ids[0][keep]]
        else:
            self._tables, self._ids = [], []

    def close(self) -> int:
        self._writer.close()
        if self._ids:
            raise RuntimeError("rows are missing from the output: the reader skipped some row ids")
        return self._next

    def abort(self) -> None:
        self._writer.close()


def _output_schema(run: ParquetRun, first: RolloutBatch) -> pa.Schema:
    fields = [pa.field(STEP, pa.int64()), pa.field(GROUP_ID, first.group_keys.type)]
    if first.extra is not None:
        fields += list(first.extra.schema)
    if first.advantage is not None:
        fields.append(pa.field(ADVANTAGE, pa.float32()))
    fields += [pa.field(channel_column(c), pa.float32()) for c in run.channels]
    fields += [pa.field("adv/grpo", pa.float32()), pa.field("adv/gdpo", pa.float32())]
    fields += [pa.field(f"adv/{c}", pa.float32()) for c in run.channels]
    return pa.schema(fields)


def _chunk_table(
    chunk: list[RolloutBatch], run: ParquetRun, schema: pa.Schema, *, device: str, scale: str, convention: str
) -> tuple[np.ndarray, pa.Table]:
    stacked = stack_chunk(chunk)
    rewards_t, group_t, step_t, weights_t, _ = stacked.tensors(run.channels, run.weights, device)
    result = compute_advantages(
        rewards_t,
        group_t,
        weights=weights_t,
        step_index=step_t,
        scale=scale,  # type: ignore[arg-type]
        convention=convention,  # type: ignore[arg-type]
    )
    rewards = stacked.rewards
    grpo, gdpo, z = (t.cpu().numpy() for t in (result.grpo, result.gdpo, result.zscores))
    key_type = schema.field(GROUP_ID).type
    try:
        keys = pa.concat_arrays([b.group_keys.cast(key_type) for b in chunk])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(
            f"group ids change type between steps ({exc})", hint="use one type for group ids in all files"
        ) from exc
    columns: dict[str, pa.Array | np.ndarray] = {
        STEP: np.repeat(np.array([b.step for b in chunk], dtype=np.int64), [b.num_rows for b in chunk]),
        GROUP_ID: keys,
    }
    if chunk[0].extra is not None:
        extra = pa.concat_tables([b.extra for b in chunk if b.extra is not None])
        for name in extra.column_names:
            columns[name] = extra.column(name).combine_chunks()
    if chunk[0].advantage is not None:
        columns[ADVANTAGE] = np.concatenate([b.advantage for b in chunk if b.advantage is not None])
    for k, c in enumerate(run.channels):
        columns[channel_column(c)] = rewards[:, k]
    columns["adv/grpo"], columns["adv/gdpo"] = grpo, gdpo
    for k, c in enumerate(run.channels):
        columns[f"adv/{c}"] = z[:, k]
    row_ids = np.concatenate([b.row_ids for b in chunk])
    return row_ids, pa.table(columns)


def _metadata(run: ParquetRun, *, convention: str, scale: str, scale_source: str) -> dict[str, str]:
    """The output's key-value metadata: the weights, how the advantages were computed, the ground truth."""
    metadata = {
        WEIGHTS_METADATA_KEY: json.dumps(run.weights),
        ADVANTAGES_METADATA_KEY: json.dumps(
            {
                "convention": convention,
                "scale": scale,
                "scale_source": scale_source,
                "channels": list(run.channels),
                "sources": len(run.files),
            }
        ),
    }
    truth = run.metadata.get(GROUND_TRUTH_METADATA_KEY.encode())
    if truth is not None:
        metadata[GROUND_TRUTH_METADATA_KEY] = truth.decode()
    return metadata


def detect_scale(chunk: list[RolloutBatch], run: ParquetRun, *, device: str, convention: str) -> tuple[str, str]:
    """The GRPO scaling the logged advantages of ``chunk`` match, and why (the source line).

    The logged column is compared with GRPO under each scale and with GDPO, as ``scan`` does
    (:func:`collapse_doctor.judge.algorithm.match_logged`), on this one chunk (the export's first: up to ~1M rows), so
    the export reads nothing twice. Without a logged column, or when it matches GDPO (which no scale changes) or
    nothing, the scale is ``group``.
    """
    stacked = stack_chunk(chunk)
    if stacked.logged is None:
        return "group", "default: no logged advantage column"
    rewards, groups, steps, weights, logged = stacked.tensors(run.channels, run.weights, device)
    import torch

    has = ~torch.isnan(logged) & ~torch.isnan(rewards).all(dim=1)
    if not bool(has.any()):
        return "group", "default: the logged advantage column holds no values"
    recomputed = {
        name: grpo_advantages(rewards, groups, weights=weights, step_index=steps, scale=s, convention=convention)  # type: ignore[arg-type]
        for name, s in SCALE_OF.items()
    }
    recomputed["gdpo"] = gdpo_advantages(rewards, groups, weights=weights, step_index=steps, convention=convention)  # type: ignore[arg-type]
    mae = {name: float((logged[has] - adv[has]).abs().double().mean()) for name, adv in recomputed.items()}
    match, _ = match_logged(mae)
    if match is None:
        closest = min(mae, key=lambda k: mae[k] if np.isfinite(mae[k]) else np.inf)
        return "group", (
            f"default: the logged advantages match no recomputation, closest {closest} at a mean difference of "
            f"{mae[closest]:.3g}; other channel weights (--weights)?"
        )
    if match == "gdpo":
        return "group", "default: the logged advantages match GDPO, which --scale does not change"
    return SCALE_OF[match], f"detected: the logged advantages match GRPO with --scale {SCALE_OF[match]}"


@dataclass(frozen=True)
class ShardExport:
    """One shard's output rows, computed in a worker: ``(row ids, table)`` per chunk, the reader's counts, and what
    the shard's pass 1 claimed (``None`` for a part cut after pass 1)."""

    tables: list[tuple[np.ndarray, pa.Table]]
    notes: Any
    rows: int
    steps: int
    claim: StepClaim | None = None


def export_shard(shard: ParquetRun, *, schema: pa.Schema, scale: str, convention: str) -> ShardExport:
    """A worker's part of :func:`export_advantages`: the output rows of one shard of the run (on CPU). A
    ``step_shard`` runs pass 1 over its own rows first (``claim_steps``); one whose steps are out of order exports
    nothing and says so in its claim (the run is then exported in the driver)."""
    claim = shard.claim_steps()
    if claim is not None and not claim.ascending:
        return ShardExport(tables=[], notes=shard.notes, rows=0, steps=0, claim=claim)
    tables, rows, steps = [], 0, 0
    for chunk in chunk_steps(shard.iter_steps()):
        row_ids, table = _chunk_table(chunk, shard, schema, device="cpu", scale=scale, convention=convention)
        tables.append((row_ids, table))
        rows += table.num_rows
        steps += len(chunk)
    return ShardExport(tables=tables, notes=shard.notes, rows=rows, steps=steps, claim=claim)


@contextmanager
def _cluster(ray: str | None) -> Iterator[Executor | None]:
    if ray is None:
        yield None
        return
    from collapse_doctor.engine.cluster import ray_session

    with ray_session(ray) as executor:
        yield executor


def _open_rollouts(
    paths: Sequence[str | Path], read: ReadOptions, *, footers_only: bool = False
) -> tuple[ParquetRun, list[Path]]:
    """The rollouts of the one run in ``paths`` (canonical Parquet or a sniffed trainer layout), and their files.

    Trainer layouts (TRL completions, verl rollout JSONL, NeMo-RL JSONL, TRL's table in a tracker) are found the way
    ``scan`` finds them (:func:`collapse_doctor.io.discovery.discover_runs`); scalar logs next to the rollouts are
    ignored. ``footers_only`` (``--ray``): a Parquet run reads its footers only, and pass 1 runs in the tasks.
    """
    from collapse_doctor.io.discovery import discover_runs
    from collapse_doctor.io.open import open_rollouts
    from collapse_doctor.io.rollouts.parquet import steps_read_in_tasks

    runs = [r for r in discover_runs(paths) if r.rollout_kind is not None]
    if not runs:
        shown = ", ".join(str(p) for p in paths)
        raise InputError(
            f"{shown}: no rollouts found (only scalar logs), so there are no advantages to recompute",
            hint="point at the rollout files: Parquet tables, TRL completions, verl or NeMo-RL JSONL",
        )
    if len(runs) > 1:
        raise UsageError(
            f"found {len(runs)} runs with rollouts: {', '.join(r.name for r in runs)}",
            hint="export one run at a time: pass that run's directory or files",
        )
    if footers_only:
        # The rewards are then checked while the tasks stream them (finish_shards checks the whole run's).
        with steps_read_in_tasks():
            run = open_rollouts(runs[0], read, check_rewards_first=False)
    else:
        run = open_rollouts(runs[0], read, check_rewards_first=True)
    assert run is not None  # the run has rollouts
    return run, list(runs[0].rollout_files)


@dataclass
class _Exported:
    """What an export wrote: rows, steps, and the GRPO scaling it used (and why)."""

    rows: int
    steps: int
    scale: str
    scale_source: str


def export_advantages(
    paths: Sequence[str | Path],
    output: str | Path,
    *,
    convention: str = "trl",
    scale: str | None = None,
    weights: dict[str, float] | None = None,
    device: str = "auto",
    step_col: str | None = None,
    group_col: str | None = None,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    on_progress: ProgressCallback | None = None,
    ray: str | None = None,
) -> ExportSummary:
    """Recompute GRPO/GDPO advantages of a run and write them, one row per input row, to ``output``.

    Without ``scale``, the GRPO scaling is the one the run's logged advantages match (compared on the first
    chunk, see :func:`detect_scale`), else ``group``; :attr:`ExportSummary.scale_source` says which and why.
    With ``ray`` (an address, or ``"local"``) the run's shards are computed as Ray tasks (on the workers' CPUs),
    each running pass 1 over its own rows, and written here in row order.
    """
    if convention not in CONVENTIONS:
        raise UsageError(f"--convention {convention!r} is not one of {', '.join(CONVENTIONS)}")
    if scale is not None and scale not in SCALES:
        raise UsageError(f"--scale {scale!r} is not one of {', '.join(SCALES)}")
    started = time.perf_counter()
    if ray is not None and device not in ("auto", "cpu"):
        raise UsageError(f"--ray computes on the workers' CPUs: --device {device} cannot be used with it")
    dev = "cpu" if ray is not None else str(resolve_device(device))
    read = ReadOptions.of(
        step_col=step_col, group_col=group_col, reward_cols=reward_cols, group_size=group_size, weights=weights
    )
    run, inputs = _open_rollouts(paths, read, footers_only=ray is not None)
    with atomic_path(output, inputs=inputs) as tmp, _cluster(ray) as executor:
        exported = None
        if executor is not None:
            exported = _export_shards(run, tmp, executor, scale=scale, convention=convention, on_progress=on_progress)
        if exported is None:
            exported = _export_here(run, tmp, device=dev, scale=scale, convention=convention, on_progress=on_progress)
    assert exported.rows == run.num_rows, (exported.rows, run.num_rows)
    return ExportSummary(
        output=Path(output),
        rows=exported.rows,
        steps=exported.steps,
        channels=run.channels,
        weights=run.weights,
        convention=convention,
        scale=exported.scale,
        device=dev,
        scale_source=exported.scale_source,
        warnings=tuple(run.notes.warnings()),
        seconds=time.perf_counter() - started,
    )


def _first_scale(
    chunk: list[RolloutBatch], run: ParquetRun, scale: str | None, *, device: str, convention: str
) -> tuple[str, str]:
    if scale is not None:
        return scale, "--scale"
    return detect_scale(chunk, run, device=device, convention=convention)


def _writer(
    tmp: Path, run: ParquetRun, chunk: list[RolloutBatch], *, scale: str, source: str, convention: str
) -> OrderedParquetWriter:
    metadata = _metadata(run, convention=convention, scale=scale, scale_source=source)
    return OrderedParquetWriter(tmp, _output_schema(run, chunk[0]).with_metadata(metadata))


def _export_here(
    run: ParquetRun,
    tmp: Path,
    *,
    device: str,
    scale: str | None,
    convention: str,
    on_progress: ProgressCallback | None,
) -> _Exported:
    """The run exported in this process, chunk by chunk (pass 1 here first, when the run has not run it)."""
    writer: OrderedParquetWriter | None = None
    source = "--scale" if scale is not None else "default: no rows"
    done = steps = 0
    try:
        for chunk in chunk_steps(run.iter_steps()):
            if writer is None:
                scale, source = _first_scale(chunk, run, scale, device=device, convention=convention)
                writer = _writer(tmp, run, chunk, scale=scale, source=source, convention=convention)
            assert scale is not None  # chosen with the writer, on the first chunk
            row_ids, table = _chunk_table(chunk, run, writer.schema, device=device, scale=scale, convention=convention)
            writer.write(row_ids, table)
            done += table.num_rows
            del table
            release_free_memory()
            steps += len(chunk)
            if on_progress is not None:
                on_progress(done, run.num_rows)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    run.finish_shards()  # a run opened for the tasks checks its rewards as it streams: the whole run's check
    return _Exported(writer.close() if writer is not None else 0, steps, scale or "group", source)


def _export_shards(
    run: ParquetRun,
    tmp: Path,
    executor: Executor,
    *,
    scale: str | None,
    convention: str,
    on_progress: ProgressCallback | None,
) -> _Exported | None:
    """The run exported as Ray tasks, one per planned shard, each running pass 1 over its own rows; ``None`` when
    the run cannot be cut (one shard, a trainer layout) or a task found its steps out of order (then nothing is
    kept and the run is exported here).

    The scaling and the output schema come from the first chunk, read here by pass 1 over the first shard's rows
    only; the tasks' rows are written as they arrive, and their counts taken once the claims cover the run."""
    shards = planned_shards(run, executor.workers)
    if len(shards) < 2:
        return None
    first = next(chunk_steps(run.step_shard(*shards[0]).iter_steps()), None)
    if first is None:
        return None  # the first shard's steps are out of order
    scale, source = _first_scale(first, run, scale, device="cpu", convention=convention)
    writer = _writer(tmp, run, first, scale=scale, source=source, convention=convention)
    work = functools.partial(export_shard, schema=writer.schema, scale=scale, convention=convention)
    results: list[ShardExport] = []
    done = 0
    try:
        for result in executor.map(work, [run.step_shard(a, b) for a, b in shards], describe_shard):
            assert isinstance(result, ShardExport)  # errors are raised
            for row_ids, table in result.tables:
                writer.write(row_ids, table)
            results.append(replace(result, tables=[]))
            done += result.rows
            if on_progress is not None:
                on_progress(done, run.num_rows)
    except BaseException:
        writer.abort()
        raise
    claims = [r.claim for r in results]
    if any(c is None for c in claims) or not run.accept_claims([c for c in claims if c is not None]):
        writer.abort()
        return None
    for result in results:
        run.add_notes(result.notes)
    run.finish_shards()
    return _Exported(writer.close(), sum(r.steps for r in results), scale, source)
