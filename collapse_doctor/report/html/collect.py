"""What the HTML report shows beyond the per-step series, gathered during the scan.

The report renders a :class:`~collapse_doctor.core.result.Diagnosis` and computes nothing of its own;
what the series do not hold is gathered here, bounded in memory whatever the run's length:

- :class:`ReportCollector` is a :class:`~collapse_doctor.pipeline.scan.RunCollector` (pass the class as
  ``ScanHooks(collector=ReportCollector)``: it is built per run from the run's inputs and read options).
  ``collect()`` sees every chunk: per step it bins the GRPO and GDPO advantages into fixed bins (one
  ``bincount`` per chunk), keeping at most :data:`MAX_HISTOGRAM_STEPS` steps (every 2nd, 4th... step once a
  run is longer), and it keeps a bounded, evenly spread sample of (logged, recomputed) advantage pairs when
  the run logged them. ``finish()`` returns the :class:`ReportExtras`.
- :func:`read_example_groups` re-reads the few steps around a finding's onset from the run's inputs after the
  detectors ran (the chunks carry no text) and recomputes those groups' advantages, for the example-groups
  table.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collapse_doctor.core.options import ReadOptions
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.core.schema import RolloutBatch
    from collapse_doctor.engine.stats import ChunkInput, DenseChunk
    from collapse_doctor.io.discovery import RunInputs

HISTOGRAM_LIMIT = 4.0
"""Advantage bins cover [-4, 4]: a group z-score of a group of 8 stays within 2.47, of 16 within 3.75."""
HISTOGRAM_BINS = 64
MAX_HISTOGRAM_STEPS = 2048
"""Steps whose histograms are kept; a longer run keeps every 2nd (4th, ...) step it reads."""
MAX_LOGGED_SAMPLE = 800
"""Rollouts kept for the logged-vs-recomputed scatter: every k-th row of the run, k a power of 2."""
EXAMPLE_GROUPS_PER_STEP = 2
EXAMPLE_ROWS_PER_GROUP = 16
MAX_TEXT_CHARS = 2000
"""Prompt and completion text kept per row; the report shows a shorter preview and expands to this."""


@dataclass(frozen=True)
class AdvantageHistograms:
    """Per-step counts of GRPO and GDPO advantages in fixed bins (values beyond the edges in the end bins)."""

    edges: np.ndarray
    """``[B + 1]`` bin edges."""
    steps: np.ndarray
    """``[H]`` steps with a histogram, ascending (every step, or every k-th step of a long run)."""
    grpo: np.ndarray
    """``[H, B]`` row counts."""
    gdpo: np.ndarray
    """``[H, B]`` row counts."""
    stride: int = 1
    """1 when every step has a histogram, else the k of "every k-th step read"."""

    def nearest(self, step: int) -> int:
        """Index of the histogram whose step is closest to ``step``."""
        return int(np.argmin(np.abs(self.steps - step)))


@dataclass(frozen=True)
class LoggedSample:
    """An evenly spread sample of rows: the advantage the trainer logged next to both recomputations."""

    steps: np.ndarray
    logged: np.ndarray
    grpo: np.ndarray
    gdpo: np.ndarray


@dataclass(frozen=True)
class ExampleGroup:
    """One group of rollouts shown in the report, with its rewards and both advantages."""

    step: int
    group: str
    label: str
    """Why it is shown, e.g. "onset of CD101"."""
    prompt: str | None
    completions: tuple[str | None, ...]
    rewards: np.ndarray
    """``[n, C]`` (NaN where a reward does not apply)."""
    grpo: np.ndarray
    gdpo: np.ndarray
    more_rows: int = 0
    """Rows of the group not shown."""


@dataclass(frozen=True)
class ReportExtras:
    """Everything the report shows that the Diagnosis does not hold (all parts optional)."""

    histograms: AdvantageHistograms | None = None
    logged_sample: LoggedSample | None = None
    examples: tuple[ExampleGroup, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ChunkSummary:
    """What the report keeps of one chunk: per-step histograms and the chunk's rows of the logged sample."""

    grpo: np.ndarray
    """``[S, B]`` counts of the chunk's steps."""
    gdpo: np.ndarray
    sample: np.ndarray | None
    """``[5, k]``: row number in the run, step, logged, GRPO, GDPO of every ``sample_every``-th row (``None``:
    the run logged no advantages)."""
    sample_every: int
    rows: int
    """Rows of the chunk."""


def summarize_chunk(
    steps: np.ndarray, chunk: ChunkInput | DenseChunk, first_row: int, *, limit: float, bins: int, sample_every: int
) -> ChunkSummary:
    """Bin a chunk's GRPO and GDPO advantages per step, and take the rows ``r`` (numbered in the run from the
    chunk's ``first_row``) with ``r % sample_every == 0`` for the logged-vs-recomputed sample."""
    from collapse_doctor.engine.stats import DenseChunk
    from collapse_doctor.engine.stats.kernels import to_host as host

    adv = chunk.row_advantages() if isinstance(chunk, DenseChunk) else chunk.advantages
    grpo, gdpo = host(adv.grpo), host(adv.gdpo)
    rewards, step_index = host(chunk.rewards), host(chunk.step_index)
    valid = ~np.isnan(rewards).all(axis=1)
    width = 2 * limit / bins
    counts = []
    for values in (grpo, gdpo):
        x = np.clip(np.nan_to_num(values.astype(np.float64), nan=0.0), -limit, limit)
        bin_index = np.clip(np.floor((x + limit) / width).astype(np.int64), 0, bins - 1)
        key = (step_index * bins + bin_index)[valid]
        hist = np.bincount(key, minlength=chunk.num_steps * bins)
        counts.append(hist.reshape(chunk.num_steps, bins).astype(np.int32))
    n = rewards.shape[0]
    sample = None
    if chunk.logged is not None:
        logged = host(chunk.logged)
        rows = np.arange((-first_row) % sample_every, n, sample_every)
        columns = ((rows + first_row), np.asarray(steps)[step_index[rows]], logged[rows], grpo[rows], gdpo[rows])
        sample = np.stack([np.asarray(c, dtype=np.float64) for c in columns])
    return ChunkSummary(grpo=counts[0], gdpo=counts[1], sample=sample, sample_every=sample_every, rows=n)


class ReportCollector:
    """The report's run collector: per-step advantage histograms, a logged-vs-recomputed sample, example groups.

    ``inputs`` and ``read`` are the run's (the pipeline passes them); the example groups are re-read from them
    by :meth:`finish`. Without ``inputs`` there are no example groups.
    """

    def __init__(
        self,
        inputs: RunInputs | None = None,
        read: ReadOptions | None = None,
        *,
        limit: float = HISTOGRAM_LIMIT,
        bins: int = HISTOGRAM_BINS,
    ) -> None:
        self.inputs = inputs
        self.read = read
        self.edges = np.linspace(-limit, limit, bins + 1)
        self._limit = limit
        self._bins = bins
        self._keep_every = 1
        self._seen = 0
        self._arrival: list[int] = []
        self._steps: list[int] = []
        self._grpo: list[np.ndarray] = []
        self._gdpo: list[np.ndarray] = []
        self._sample = np.zeros((5, 0))  # rows: row number in the run, step, logged, grpo, gdpo
        self._sample_every = 1
        self._rows_seen = 0

    def collect(self, steps: np.ndarray, chunk: ChunkInput | DenseChunk) -> None:
        """Bin one chunk's advantages per step (``steps``: the chunk's step numbers) and sample its rows."""
        every = self._sample_every
        if chunk.logged is not None:
            n = chunk.rewards.shape[0]
            first = (-self._rows_seen) % every
            while len(self._sample[0]) + len(range(first, n, every)) > MAX_LOGGED_SAMPLE:
                every *= 2
                self._sample = self._sample[:, self._sample[0] % every == 0]
                first = (-self._rows_seen) % every
        summary = summarize_chunk(steps, chunk, self._rows_seen, limit=self._limit, bins=self._bins, sample_every=every)
        self.absorb(steps, summary)

    def summarizer(self, num_rows: int) -> functools.partial[ChunkSummary]:
        """What :meth:`collect` computes of a chunk, as a picklable function of ``(steps, chunk, first_row)``
        for a worker that reads one shard of a run of ``num_rows`` rows (in order): :meth:`absorb` takes its
        result. The sample keeps every k-th row with the k that reading all ``num_rows`` rows ends with, so the
        collected parts equal those of :meth:`collect` on every chunk."""
        every = 1
        while -(-num_rows // every) > MAX_LOGGED_SAMPLE:
            every *= 2
        return functools.partial(summarize_chunk, limit=self._limit, bins=self._bins, sample_every=every)

    def absorb(self, steps: np.ndarray, summary: ChunkSummary) -> None:
        """Keep a chunk's histograms (thinned by arrival) and its sampled rows."""
        for k, step in enumerate(np.asarray(steps).tolist()):
            if self._seen % self._keep_every == 0:
                self._arrival.append(self._seen)
                self._steps.append(int(step))
                self._grpo.append(summary.grpo[k])
                self._gdpo.append(summary.gdpo[k])
            self._seen += 1
        if len(self._steps) > MAX_HISTOGRAM_STEPS:
            self._thin()
        if summary.sample is not None:
            if summary.sample_every > self._sample_every:
                self._sample_every = summary.sample_every
                self._sample = self._sample[:, self._sample[0] % self._sample_every == 0]
            self._rows_seen += summary.rows
            self._sample = np.concatenate([self._sample, summary.sample], axis=1)

    def _thin(self) -> None:
        """Keep every other stored step (by arrival), and from now on every ``2 * keep_every``-th."""
        self._keep_every *= 2
        keep = [i for i, seen in enumerate(self._arrival) if seen % self._keep_every == 0]
        self._arrival = [self._arrival[i] for i in keep]
        self._steps = [self._steps[i] for i in keep]
        self._grpo = [self._grpo[i] for i in keep]
        self._gdpo = [self._gdpo[i] for i in keep]

    def histograms(self) -> AdvantageHistograms | None:
        if not self._steps:
            return None
        order = np.argsort(np.asarray(self._steps), kind="stable")
        return AdvantageHistograms(
            edges=self.edges,
            steps=np.asarray(self._steps, dtype=np.int64)[order],
            grpo=np.stack(self._grpo)[order],
            gdpo=np.stack(self._gdpo)[order],
            stride=self._keep_every,
        )

    def logged_sample(self) -> LoggedSample | None:
        if not self._sample.shape[1]:
            return None
        sample = self._sample[:, np.isfinite(self._sample[2])]
        return LoggedSample(steps=sample[1].astype(np.int64), logged=sample[2], grpo=sample[3], gdpo=sample[4])

    def finish(self, diagnosis: Diagnosis) -> ReportExtras:
        """The collected parts plus example groups re-read from the run's inputs around the main finding's onset."""
        from collapse_doctor.core.errors import CollapseDoctorError

        wanted = example_steps(diagnosis) if diagnosis.run.rollouts and self.inputs is not None else {}
        examples: tuple[ExampleGroup, ...] = ()
        notes: list[str] = []
        if wanted and self.inputs is not None:
            try:
                examples = read_example_groups(self.inputs, wanted, self.read)
            except CollapseDoctorError as exc:  # the rest of the report stands without the examples
                notes.append(f"example groups could not be re-read: {exc.one_line()}")
        return ReportExtras(
            histograms=self.histograms(),
            logged_sample=self.logged_sample(),
            examples=examples,
            notes=tuple(notes),
        )


def example_steps(diagnosis: Diagnosis) -> dict[int, str]:
    """Steps to show example groups of: one persistence window before the main finding's onset, at it, and after.

    The main finding is the most severe one with an onset; without one, the first and the middle step.
    Early steps keep the re-read short: it stops after the last of them.
    """
    steps = diagnosis.series.steps
    if len(steps) == 0:
        return {}
    main = next((f for f in diagnosis.findings if f.onset_step is not None), None)
    if main is None or main.onset_step is None:
        return dict(sorted({int(steps[0]): "first step", int(steps[len(steps) // 2]): "middle of the run"}.items()))
    at = min(int(np.searchsorted(steps, main.onset_step)), len(steps) - 1)
    window = max(1, diagnosis.config.persistence_steps(len(steps)))
    chosen = {int(steps[max(0, at - window)]): f"before the onset of {main.code}"}
    chosen[int(steps[at])] = f"onset of {main.code}"
    chosen.setdefault(int(steps[min(len(steps) - 1, at + window)]), f"after the onset of {main.code}")
    return dict(sorted(chosen.items()))


def read_example_groups(
    inputs: RunInputs,
    wanted: dict[int, str],
    read: ReadOptions | None = None,
    *,
    per_step: int = EXAMPLE_GROUPS_PER_STEP,
) -> tuple[ExampleGroup, ...]:
    """Re-read the ``wanted`` steps of a run and pick the groups where GRPO and GDPO disagree most.

    ``inputs`` are the run's files as the scan found them (nothing is discovered again), ``read`` its read
    options. Reading stops once every wanted step has been seen (steps come in order for sorted input).
    """
    from collapse_doctor.io.open import open_rollouts

    run: Any = open_rollouts(inputs, read)
    if run is None:
        return ()
    remaining = dict(wanted)
    found: list[ExampleGroup] = []
    for batch in run.iter_steps():
        label = remaining.pop(batch.step, None)
        if label is not None:
            found.extend(_pick_groups(batch, run.channels, run.weights, label, per_step))
        if not remaining:
            break
    return tuple(sorted(found, key=lambda g: g.step))


def _step_advantages(
    batch: RolloutBatch, channels: Sequence[str], weights: dict[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """GRPO and GDPO advantages of one step's rows (float64), by the scan's own engine."""
    from collapse_doctor.core.batching import stack_chunk
    from collapse_doctor.engine.reduce import row_advantages

    return row_advantages(stack_chunk([batch]), channels, weights)


def _pick_groups(
    batch: RolloutBatch, channels: Sequence[str], weights: dict[str, float], label: str, per_step: int
) -> list[ExampleGroup]:
    grpo, gdpo = _step_advantages(batch, channels, weights)
    sizes = np.bincount(batch.group_index, minlength=batch.num_groups)
    gap = np.bincount(batch.group_index, weights=np.abs(grpo - gdpo), minlength=batch.num_groups)
    score = np.where(sizes >= 2, gap / np.maximum(sizes, 1), -1.0)
    order = np.argsort(-score, kind="stable")[:per_step]
    extra = batch.extra
    prompts = _texts(extra, "prompt")
    completions = _texts(extra, "completion")
    picked = []
    for g in order.tolist():
        rows = np.flatnonzero(batch.group_index == g)
        shown = rows[:EXAMPLE_ROWS_PER_GROUP]
        picked.append(
            ExampleGroup(
                step=batch.step,
                group=str(batch.group_keys[int(rows[0])].as_py()),
                label=label,
                prompt=prompts[int(rows[0])] if prompts is not None else None,
                completions=tuple(completions[int(r)] for r in shown) if completions is not None else (),
                rewards=batch.rewards[shown].astype(np.float64),
                grpo=grpo[shown],
                gdpo=gdpo[shown],
                more_rows=len(rows) - len(shown),
            )
        )
    return picked


def _texts(extra: Any, name: str) -> list[str | None] | None:
    """A text column of the step, each value cut to :data:`MAX_TEXT_CHARS`, or None when absent."""
    if extra is None or name not in extra.column_names:
        return None
    values = extra.column(name).to_pylist()
    return [None if v is None else str(v)[:MAX_TEXT_CHARS] for v in values]
