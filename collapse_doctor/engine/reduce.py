"""Rollouts to per-step series: the only place that builds the engine's inputs (:class:`ChunkInput`).

A reader's chunks of whole steps go through the advantage engine and the statistics on one thread per core
(:class:`~collapse_doctor.engine.workers.ChunkWorkers`); collectors see every chunk (the HTML report keeps
histograms), and the per-step statistics are gathered into a :class:`~collapse_doctor.core.series.RunSeries`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from collapse_doctor.core.series import RunSeries, SeriesBuilder, channel_pairs
from collapse_doctor.engine.memory import release_free_memory

if TYPE_CHECKING:
    from collapse_doctor.core.batching import StackedChunk
    from collapse_doctor.engine.cluster import Executor
    from collapse_doctor.engine.stats import ChunkInput, DenseChunk

SCAN_CHUNK_ROWS = 1 << 18
"""Rows per statistics pass: the statistics make many temporaries, so smaller chunks keep the peak low."""
TRIM_EVERY_ROWS = 1 << 20
"""Give freed heap memory back to the OS this often (see collapse_doctor.engine.memory)."""


class ChunkCollector(Protocol):
    """Sees every chunk of a run (the HTML report's collector); one that also has ``summarizer(num_rows)`` (a
    picklable ``(steps, chunk, first_row) -> summary``) and ``absorb(steps, summary)`` lets the chunks be
    reduced elsewhere (Ray shards), with only the summaries coming back."""

    def collect(self, steps: np.ndarray, chunk: ChunkInput | DenseChunk) -> None: ...


class RolloutSource(Protocol):
    """What the engine reads from a rollout reader (ParquetRun and the framework adapters)."""

    channels: tuple[str, ...]
    weights: dict[str, float]
    num_rows: int

    def iter_chunks(self, max_rows: int) -> Iterator[StackedChunk]: ...


READ_AHEAD = 2
"""Chunks a :class:`ReadAhead` holds ready: reading (Parquet decoding, grouping) overlaps the computing."""


class ReadAhead:
    """A reader's chunks pulled on a thread of their own, up to :data:`READ_AHEAD` ahead of the consumer.

    Started before torch is imported (:func:`collapse_doctor.pipeline.scan.scan_run`), it reads the first chunks while
    the import runs (pyarrow decodes without the GIL); afterwards it keeps reading while the chunks are computed.
    An error while reading is raised where the chunk it stopped at would have come; :meth:`close` stops the
    thread (a consumer that stops early, Ctrl-C).
    """

    def __init__(self, chunks: Iterator[StackedChunk], depth: int = READ_AHEAD) -> None:
        import queue
        import threading

        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._chunks = chunks
        self._thread = threading.Thread(target=self._fill, daemon=True, name="collapse-doctor-read")
        self._thread.start()

    def _put(self, item: tuple[str, Any]) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            for chunk in self._chunks:
                if not self._put(("chunk", chunk)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(("error", exc))
        finally:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[StackedChunk]:
        while self._last is None:
            kind, value = self._queue.get()
            if kind == "chunk":
                yield value
            else:
                self._last = (kind, value)
        if self._last[0] == "error":
            raise self._last[1]  # again, to a consumer that iterates once more

    _last: tuple[str, Any] | None = None
    """How reading ended (``("end", None)`` or ``("error", exc)``), once the consumer has seen it."""

    def close(self) -> None:
        import queue

        if self._last is None:
            self._last = ("end", None)  # iterating after close ends at once
        self._stop.set()
        while True:  # free a producer blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()


SHARDS_PER_WORKER = 4
"""Shards of one run per Ray worker: a slow worker holds up the in-order merge by at most a quarter of its share."""
MIN_SHARD_ROWS = 4 * SCAN_CHUNK_ROWS
"""Fewer rows per task and the task's start-up (imports, opening the files) would outweigh its reading."""


@dataclass(frozen=True)
class ShardResult:
    """One shard reduced in a worker: per chunk its steps, statistics and the collectors' summaries, plus the
    reader's counts (NaN rewards, group sizes ...) for the run's warnings, and what the task's own pass 1 found
    (``claim``: the rows and steps it owned, for a shard planned from the footers)."""

    chunks: list[tuple[np.ndarray, dict[str, np.ndarray], tuple[Any, ...]]]
    notes: Any
    rows: int
    claim: Any = None


def empty_series(channels: tuple[str, ...]) -> RunSeries:
    """The series of a run without rollouts (a scalar log only)."""
    return SeriesBuilder(channels, channel_pairs(channels)).build()


def reduce_rollouts(
    run: RolloutSource,
    device: str,
    *,
    collectors: Sequence[ChunkCollector] = (),
    on_progress: Callable[[int, int], None] | None = None,
    executor: Executor | None = None,
    chunks: ReadAhead | None = None,
) -> RunSeries:
    """Stream a rollout reader's chunks through the advantage engine and the statistics: per-step series.

    The chunks are read ahead on a thread (``chunks``: a :class:`ReadAhead` of ``run.iter_chunks(SCAN_CHUNK_ROWS)`` the
    caller started earlier, else one started here). With an ``executor`` (Ray) a reader that plans shards from its
    footers (``plan_shards``/``step_shard``, as :class:`~collapse_doctor.io.rollouts.parquet.ParquetRun` does) is
    reduced shard by shard on the executor's workers, each task reading its own steps; the series is assembled here
    in shard order, as from local chunks. When a task finds the steps out of order the run is reduced here.
    """
    try:
        builder = SeriesBuilder(run.channels, channel_pairs(run.channels))
        shards = planned_shards(run, executor.workers) if executor is not None else []
        if executor is not None and len(shards) > 1 and all(hasattr(c, "summarizer") for c in collectors):
            if chunks is not None:
                chunks.close()
                chunks = None
            if _reduce_shards(run, shards, builder, device, collectors, on_progress, executor):
                return builder.build()
        if chunks is None:
            chunks = ReadAhead(run.iter_chunks(SCAN_CHUNK_ROWS))
        _reduce_local(run, device, collectors, on_progress, builder, chunks)
        return builder.build()
    finally:
        if chunks is not None:
            chunks.close()  # a second close does nothing


def _reduce_local(
    run: RolloutSource,
    device: str,
    collectors: Sequence[ChunkCollector],
    on_progress: Callable[[int, int], None] | None,
    builder: SeriesBuilder,
    chunks: ReadAhead,
) -> None:
    done = trimmed_at = 0
    with _chunk_workers(device) as workers:
        for stacked, chunk_input, stats in workers.map(
            functools.partial(_reduce_chunk, channels=run.channels, weights=run.weights, device=device), chunks
        ):
            for collector in collectors:
                collector.collect(stacked.steps, chunk_input)
            builder.add(stacked.steps, dict(stats))
            del chunk_input, stats
            done += len(stacked.rewards)
            if done - trimmed_at >= TRIM_EVERY_ROWS:
                release_free_memory()
                trimmed_at = done
            if on_progress is not None:
                on_progress(done, run.num_rows)


def _chunk_workers(device: str) -> Any:
    from collapse_doctor.engine.workers import ChunkWorkers

    return ChunkWorkers(device)


def _reduce_chunk(
    stacked: StackedChunk, *, channels: tuple[str, ...], weights: Mapping[str, float], device: str
) -> tuple[StackedChunk, ChunkInput | DenseChunk, Mapping[str, np.ndarray]]:
    """One chunk through the advantage engine and the statistics (numpy results)."""
    from collapse_doctor.engine.stats import DenseChunk, step_statistics

    chunk = engine_chunk(stacked, channels, weights, device)
    if isinstance(chunk, DenseChunk):
        stats = step_statistics(chunk)
        chunk.release()
        return stacked, chunk, stats
    # not the dense path: the chunk is on another device, or dense_layout already said no
    return stacked, chunk, step_statistics(chunk, allow_dense=False)


def engine_chunk(
    stacked: StackedChunk, channels: Sequence[str], weights: Mapping[str, float], device: str
) -> ChunkInput | DenseChunk:
    """A chunk's rows with their GRPO and GDPO advantages: the one place that picks the engine.

    On CPU a chunk in the dense layout runs on NumPy (:class:`~collapse_doctor.engine.stats.dense.DenseChunk`: no
    torch import); any other chunk, or another device, on torch.
    """
    from collapse_doctor.engine.stats import CompletionRows, DenseChunk, dense_layout

    num_steps = len(stacked.steps)
    completions = CompletionRows.of(
        stacked.completion_codes,
        stacked.completion_lengths,
        stacked.completion_cut,
        stacked.completion_cut_rule,
        stacked.completion_tokens,
    )
    if device == "cpu":
        g = dense_layout(stacked.rewards, stacked.group_index, stacked.num_groups, stacked.step_index, num_steps)
        if g is not None:
            row_weights = [weights[c] for c in channels]
            return DenseChunk.from_rows(
                stacked.rewards, g, stacked.step_index, row_weights, num_steps, stacked.logged, completions
            )
    from collapse_doctor.engine.advantages import compute_advantages
    from collapse_doctor.engine.stats import ChunkInput
    from collapse_doctor.engine.workers import torch_for_workers

    torch_for_workers()
    rewards, group_index, step_index, weight_t, logged = stacked.tensors(channels, weights, device)
    adv = compute_advantages(rewards, group_index, weights=weight_t, step_index=step_index)
    return ChunkInput(
        rewards, group_index, step_index, weight_t, adv, stacked.num_groups, num_steps, logged, completions
    )


def row_advantages(
    stacked: StackedChunk, channels: Sequence[str], weights: Mapping[str, float], device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """GRPO and GDPO advantages of a chunk's rows, in row order (float64), as ``scan`` computes them."""
    from collapse_doctor.engine.stats import DenseChunk
    from collapse_doctor.engine.stats.kernels import to_host

    chunk = engine_chunk(stacked, channels, weights, device)
    adv = chunk.row_advantages() if isinstance(chunk, DenseChunk) else chunk.advantages
    return to_host(adv.grpo).astype(np.float64), to_host(adv.gdpo).astype(np.float64)


def shard_rows(run: Any, workers: int) -> int:
    """Rows per shard of ``run`` for ``workers`` workers: :data:`SHARDS_PER_WORKER` each, :data:`MIN_SHARD_ROWS` at
    least."""
    return max(MIN_SHARD_ROWS, -(-run.num_rows // (workers * SHARDS_PER_WORKER)))


def planned_shards(run: Any, workers: int) -> list[tuple[int, int]]:
    """The row ranges, on row-group boundaries, to cut ``run`` into for ``workers`` workers from its footers alone
    (``plan_shards``; ``[]``: the reader cannot be cut): each shard's task finds its own steps."""
    plan = getattr(run, "plan_shards", None)
    if plan is None:
        return []
    return list(plan(shard_rows(run, workers)))


def describe_shard(shard: Any) -> str:
    """``FILE rows A-B``: where a shard's rows are (for the error of a task that died)."""
    start, end = shard.row_range
    files = shard.files
    where = str(files[0]) if len(files) == 1 else f"{files[0]} ... ({len(files)} files)"
    return f"{where} rows {start:,}-{end:,}"


def _reduce_shards(
    run: RolloutSource,
    shards: list[tuple[int, int]],
    builder: SeriesBuilder,
    device: str,
    collectors: Sequence[ChunkCollector],
    on_progress: Callable[[int, int], None] | None,
    executor: Executor,
) -> bool:
    """The shards reduced on the executor and merged here in shard order; ``False`` (nothing merged) when their
    tasks found the steps out of order, so that the run is reduced here instead.

    The results are held until every task has answered: only then is it known that the claims cover the run once,
    in order (``accept_claims``), and the collectors cannot take back what they absorbed.
    """
    summarizers = tuple(c.summarizer(run.num_rows) for c in collectors)  # type: ignore[attr-defined]
    work = functools.partial(reduce_shard, device=device, summarizers=summarizers)
    parts = [run.step_shard(start, end) for start, end in shards]  # type: ignore[attr-defined]
    results: list[ShardResult] = []
    done = 0
    for result in executor.map(work, parts, describe_shard):
        assert isinstance(result, ShardResult)  # errors are raised (no keep_going)
        results.append(result)
        done += result.rows
        if on_progress is not None:
            on_progress(done, run.num_rows)
    if not run.accept_claims([r.claim for r in results]):  # type: ignore[attr-defined]
        return False
    for result in results:
        for steps, stats, summaries in result.chunks:
            builder.add(steps, stats)
            for collector, summary in zip(collectors, summaries, strict=True):
                collector.absorb(steps, summary)  # type: ignore[attr-defined]
        run.add_notes(result.notes)  # type: ignore[attr-defined]
    run.finish_shards()  # type: ignore[attr-defined]
    return True


def reduce_shard(shard: Any, *, device: str, summarizers: Sequence[Callable[..., Any]] = ()) -> ShardResult:
    """A worker's part of :func:`reduce_rollouts`: one shard of a run (``ParquetRun.step_shard``: pass 1 over its
    rows first, ``claim_steps``; or ``ParquetRun.shard``) to its steps' statistics and the collectors' summaries of
    each chunk. A shard whose steps are out of order is not reduced: its claim says so."""
    chunks: list[tuple[np.ndarray, dict[str, np.ndarray], tuple[Any, ...]]] = []
    claim_steps = getattr(shard, "claim_steps", None)
    claim = claim_steps() if claim_steps is not None else None
    if claim is not None and not claim.ascending:
        return ShardResult(chunks=chunks, notes=shard.notes, rows=0, claim=claim)
    first_row = shard.row_range[0]
    with _chunk_workers(device) as workers:
        for stacked, chunk_input, stats in workers.map(
            functools.partial(_reduce_chunk, channels=shard.channels, weights=shard.weights, device=device),
            shard.iter_chunks(SCAN_CHUNK_ROWS),
        ):
            summaries = tuple(summarize(stacked.steps, chunk_input, first_row) for summarize in summarizers)
            chunks.append((stacked.steps, dict(stats), summaries))
            first_row += len(stacked.rewards)
            del chunk_input
    return ShardResult(chunks=chunks, notes=shard.notes, rows=first_row - shard.row_range[0], claim=claim)
