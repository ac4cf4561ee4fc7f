"""Rollouts to per-step series: the only place that builds the engine's inputs (:class:`ChunkInput`).

A reader's chunks of whole steps go through the advantage engine and the statistics on one thread per core
(:class:`~collapse_doctor.workers.ChunkWorkers`); collectors see every chunk (the HTML report keeps
histograms), and the per-step statistics are gathered into a :class:`~collapse_doctor.series.RunSeries`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from collapse_doctor.memory import release_free_memory
from collapse_doctor.series import RunSeries, SeriesBuilder, channel_pairs

if TYPE_CHECKING:
    from collapse_doctor.batching import StackedChunk
    from collapse_doctor.stats import ChunkInput

SCAN_CHUNK_ROWS = 1 << 18
"""Rows per statistics pass: the statistics make many temporaries, so smaller chunks keep the peak low."""
TRIM_EVERY_ROWS = 1 << 20
"""Give freed heap memory back to the OS this often (see collapse_doctor.memory)."""

ChunkCollector = Callable[[np.ndarray, "ChunkInput"], None]
"""Called once per chunk with the chunk's step numbers ``[S]`` (ascending) and its ChunkInput."""


class RolloutSource(Protocol):
    """What the engine reads from a rollout reader (ParquetRun and the framework adapters)."""

    channels: tuple[str, ...]
    weights: dict[str, float]
    num_rows: int

    def iter_chunks(self, max_rows: int) -> Iterator[StackedChunk]: ...


def empty_series(channels: tuple[str, ...]) -> RunSeries:
    """The series of a run without rollouts (a scalar log only)."""
    return SeriesBuilder(channels, channel_pairs(channels)).build()


def reduce_rollouts(
    run: RolloutSource,
    device: str,
    *,
    collectors: Sequence[ChunkCollector] = (),
    on_progress: Callable[[int, int], None] | None = None,
) -> RunSeries:
    """Stream a rollout reader's chunks through the advantage engine and the statistics: per-step series."""
    from collapse_doctor.advantages import compute_advantages
    from collapse_doctor.stats import ChunkInput, step_statistics
    from collapse_doctor.workers import ChunkWorkers

    channels = run.channels
    builder = SeriesBuilder(channels, channel_pairs(channels))
    done = trimmed_at = 0

    def reduce_chunk(stacked: StackedChunk) -> tuple[StackedChunk, ChunkInput, Mapping[str, Any]]:
        rewards, group_index, step_index, weight_t, logged = stacked.tensors(channels, run.weights, device)
        adv = compute_advantages(rewards, group_index, weights=weight_t, step_index=step_index)
        num = stacked.num_groups, len(stacked.steps)
        chunk_input = ChunkInput(rewards, group_index, step_index, weight_t, adv, *num, logged)
        return stacked, chunk_input, {k: v.cpu().numpy() for k, v in step_statistics(chunk_input).items()}

    with ChunkWorkers(device) as workers:
        for stacked, chunk_input, stats in workers.map(reduce_chunk, run.iter_chunks(SCAN_CHUNK_ROWS)):
            for collect in collectors:
                collect(stacked.steps, chunk_input)
            builder.add(stacked.steps, dict(stats))
            del chunk_input, stats
            done += len(stacked.rewards)
            if done - trimmed_at >= TRIM_EVERY_ROWS:
                release_free_memory()
                trimmed_at = done
            if on_progress is not None:
                on_progress(done, run.num_rows)
    return builder.build()
