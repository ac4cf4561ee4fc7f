"""What a monitored training run writes: the canonical rollout table, per-step scalars, and their series.

Every generation batch (one training step) becomes rows of the canonical table (``step``,
``group_id``, ``reward/<channel>``, ``advantage`` as the trainer used it, ``prompt``, ``completion``,
``completion_length``; ``weight/<channel>`` when the step carries its own weights, as gdpo-dynamic does).
Rows are buffered and written every ``write_every`` steps as ``OUTPUT/rollouts/part-<first>-<last>.parquet``,
each file atomically, so ``collapse-doctor scan OUTPUT`` works while the run goes on.

With each part, the part's table is reduced once by ``scan``'s own path (read as a
:class:`~collapse_doctor.io.rollouts.table_run.TableRun`, reduced by
:func:`~collapse_doctor.engine.reduce.reduce_rollouts`, kept as a
:class:`~collapse_doctor.core.reduction.RunReduction`).
The per-step values feed three things: TensorBoard scalars under ``collapse_doctor/`` in ``OUTPUT/tensorboard``
(one event per step), the scalars handed to the trainer's own logger (:meth:`RolloutMonitor.take_log_scalars`),
and the run's reduction, which the live diagnosis (:mod:`collapse_doctor.integrations.live`) judges through the
same pipeline as ``scan`` of the parts: nothing is read back from disk, and both give one answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapse_doctor.core.estimators import ALGORITHMS, family_of
from collapse_doctor.core.reduction import RunReduction, merge_reductions
from collapse_doctor.core.schema import ALGO_METADATA_KEY, WEIGHTS_METADATA_KEY, channel_column
from collapse_doctor.core.series import RunSeries
from collapse_doctor.engine.reduce import empty_series
from collapse_doctor.integrations.events import ScalarEventWriter
from collapse_doctor.io.storage.atomic import atomic_path
from collapse_doctor.pipeline.scan import reduction_of

ROLLOUTS_DIR = "rollouts"
TENSORBOARD_DIR = "tensorboard"
SCALAR_PREFIX = "collapse_doctor/"
_PART = re.compile(r"part-(\d+)-(\d+)\.parquet$")


@dataclass
class StepExtras:
    """What a scheduled retrain adds to a step (:mod:`collapse_doctor.retrain.recipes`)."""

    rewards: torch.Tensor | None = None
    """``[N, C]`` the rewards the advantages came from (conditioned rewards), written as ``reward/<channel>``."""
    raw_rewards: dict[str, torch.Tensor] = field(default_factory=dict)
    """``[N]`` per conditioned channel: the reward function's own value, written as ``raw_reward/<channel>``."""
    columns: dict[str, Any] = field(default_factory=dict)
    """One value per step (the aggregation, the temperature, the active channels), repeated on its rows."""
    scalars: dict[str, float] = field(default_factory=dict)
    """``collapse_doctor/recipe/*`` scalars of the step (the same keys every step)."""


@dataclass
class StepRecord:
    """One generation batch as the trainer scored it (all processes gathered)."""

    step: int
    rewards: torch.Tensor
    """``[N, C]`` float32, NaN where a reward function returned None."""
    advantages: torch.Tensor
    """``[N]`` the advantages the loss used."""
    group_size: int
    prompts: list[Any]
    completions: list[Any]
    completion_lengths: list[int]
    weights: torch.Tensor | None = None
    """``[C]`` this step's own weights (gdpo-dynamic only)."""
    extras: StepExtras | None = None
    truncated: list[bool] | None = None
    """Per completion: cut at ``max_completion_length`` without its end-of-sequence token (None: unknown)."""

    def extend(self, other: StepRecord) -> None:
        """Append a second generation batch of the same step (its groups follow this one's)."""
        self.rewards = torch.cat([self.rewards, other.rewards])
        if self.extras is not None and other.extras is not None:
            for channel, raw in other.extras.raw_rewards.items():
                self.extras.raw_rewards[channel] = torch.cat([self.extras.raw_rewards[channel], raw])
        self.advantages = torch.cat([self.advantages, other.advantages])
        self.prompts = [*self.prompts, *other.prompts]
        self.completions = [*self.completions, *other.completions]
        self.completion_lengths = [*self.completion_lengths, *other.completion_lengths]
        if self.truncated is not None and other.truncated is not None:
            self.truncated = [*self.truncated, *other.truncated]
        else:
            self.truncated = None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str) or value is None:  # None: not logged (never the same text as another)
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclass
class RolloutMonitor:
    """Buffers step records; writes Parquet parts and TensorBoard scalars (on the main process only).

    Every process records (``enabled=False`` off the main process: nothing is kept or written), so each
    knows when a part is due: :meth:`record` returns True at the same steps everywhere.
    """

    output_dir: Path
    channels: tuple[str, ...]
    weights: dict[str, float]
    algo: str
    write_every: int = 10
    enabled: bool = True
    purge_step: int | None = None
    tensorboard: bool = True
    """Also write the per-step scalars to ``OUTPUT/tensorboard`` (one event per step)."""
    advantage_column: str = "advantage"
    """The column the trainer's advantages go to: :data:`UNCHECKED_ADVANTAGE` where they hold a term the rollouts do
    not carry (TRL's RLOO with ``beta != 0`` subtracts a per-row KL from the reward), so no scan compares them."""
    files_written: int = 0
    parts_due: int = 0
    """Parts due so far (counted on every process, written only where ``enabled``)."""
    last_step: int | None = None
    reductions: list[RunReduction] = field(default_factory=list)
    """One per part written (or found on disk when a run resumed), in step order: what ``scan`` reduces."""
    _rows: list[StepRecord] = field(default_factory=list, repr=False)
    _buffered_steps: int = field(default=0, repr=False)
    _writer: ScalarEventWriter | None = field(default=None, repr=False)
    _to_log: list[dict[str, float]] = field(default_factory=list, repr=False)
    _extremes: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    """Each channel's largest and smallest reward so far (``None``: not yet taken from the parts reduced)."""

    @property
    def rollouts_dir(self) -> Path:
        return self.output_dir / ROLLOUTS_DIR

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / TENSORBOARD_DIR

    def _events(self) -> ScalarEventWriter:
        if self._writer is None:
            self._writer = ScalarEventWriter(self.tensorboard_dir, purge_step=self.purge_step)
        return self._writer

    def record(self, record: StepRecord) -> bool:
        """Keep one generation batch; True when the steps buffered before it made a part (see :meth:`note_step`).

        A second batch of the step recorded last (several generation batches per optimizer step) joins it.
        """
        if record.step == self.last_step:
            if self._rows:
                self._rows[-1].extend(record)
            return False
        written = self.note_step(record.step)
        if self.enabled:
            self._rows.append(record)
        return written

    def note_step(self, step: int) -> bool:
        """Count a step without keeping it (what every process does, so all know when a part is due).

        A full buffer is written first; True when that made a part due.
        """
        if step == self.last_step:
            return False
        written = self.flush_if_full()
        self.last_step = step
        self._buffered_steps += 1
        return written

    def flush_if_full(self) -> bool:
        """Write a part when ``write_every`` steps are buffered; True when one was due (on every process alike)."""
        if self._buffered_steps < self.write_every:
            return False
        self.parts_due += 1
        self.flush()
        return True

    def _reduce(self, records: list[StepRecord], table: Any, target: Path) -> None:
        """The part's reduction (``scan``'s path over the part's table): into the run's reductions, TensorBoard
        and the trainer's next log."""
        reduction = reduce_part(table, target)
        self.reductions.append(reduction)
        # retrain's aggregations (grpo, gdpo, gdpo-dynamic, ...) and the catalogue's estimators (rloo: GRPO's family)
        algo = "grpo" if self.algo == "grpo" or (self.algo in ALGORITHMS and family_of(self.algo) == "grpo") else "gdpo"
        stats = reduction.series.values
        row = {int(step): i for i, step in enumerate(reduction.series.steps)}
        if self._extremes is None:
            self._extremes = _extremes_of(self.reductions[:-1], len(self.channels))
        per_step = [self._step_scalars(r, row[r.step], stats, algo) for r in records]
        self._to_log.extend(per_step)
        if self.tensorboard:
            self._events().write([(r.step, values) for r, values in zip(records, per_step, strict=True)])

    def _step_scalars(self, record: StepRecord, s: int, stats: Mapping[str, np.ndarray], algo: str) -> dict[str, float]:
        """One step's ``collapse_doctor/*`` scalars from the part's statistics (row ``s``)."""
        values: dict[str, float] = {}
        for k, channel in enumerate(self.channels):
            values[f"{SCALAR_PREFIX}rel_gain/{channel}"] = float(stats["rel_gain"][s][k])
            values[f"{SCALAR_PREFIX}signal_share/{channel}"] = float(stats[f"signal_share_{algo}"][s][k])
            values[f"{SCALAR_PREFIX}zero_variance_share/{channel}"] = float(stats["channel_zero_var_share"][s][k])
            weight = float(record.weights[k]) if record.weights is not None else self.weights.get(channel, 1.0)
            values[f"{SCALAR_PREFIX}weight/{channel}"] = weight
        values.update(self._channel_checks_scalars(s, stats, algo))
        values[f"{SCALAR_PREFIX}aggregation_gdpo"] = 1.0 if algo == "gdpo" else 0.0
        # not ``zero_variance_share``: a key that is a path prefix of another (``.../zero_variance_share/<c>``) makes
        # MLflow's file store fail the whole batch ("Is a directory") and drop the user's own metrics with it
        values[f"{SCALAR_PREFIX}zero_variance_group_share"] = float(stats["zero_var_share"][s])
        rollouts = float(stats["rollouts"][s])
        values[f"{SCALAR_PREFIX}zero_advantage_share"] = float(stats[f"zero_adv_rows_{algo}"][s]) / max(rollouts, 1.0)
        values[f"{SCALAR_PREFIX}advantage_std"] = float(record.advantages.float().std())
        if record.extras is not None:
            values.update(record.extras.scalars)
        return values

    def _channel_checks_scalars(self, s: int, stats: Mapping[str, np.ndarray], algo: str) -> dict[str, float]:
        """What the per-group channel checks (CD101, CD402) read, so a scan of the tracker's files alone judges the
        channels from the same numbers (:mod:`collapse_doctor.judge.logged_channels`): the share of advantage signs
        each channel decides, its groups constant at its maximum and minimum so far (as ``scan`` counts them against
        the run-wide extremes: a step whose largest reward is the channel's largest so far, and the rule for a
        channel that never varied), its support and its range. Steps must come in order (they do)."""
        assert self._extremes is not None
        top, bottom = self._extremes
        high, low = stats["reward_max"][s], stats["reward_min"][s]
        top[:], bottom[:] = np.fmax(top, high), np.fmin(bottom, low)
        never_varied = top == bottom
        at_max = (high == top) & ~(never_varied & (top <= 0))
        at_min = (low == bottom) & ~(never_varied & (top > 0))
        groups = stats["channel_groups"][s]
        with np.errstate(invalid="ignore", divide="ignore"):
            ceiling = np.where(groups > 0, np.where(at_max, stats["channel_at_max_groups"][s] / groups, 0.0), np.nan)
            floor = np.where(groups > 0, np.where(at_min, stats["channel_at_min_groups"][s] / groups, 0.0), np.nan)
            scored = stats["channel_rows"][s] / stats["valid_rows"][s]
        per_channel = {
            "dominance": stats[f"dominance_{algo}"][s],
            "ceiling_share": ceiling,
            "floor_share": floor,
            "groups": groups,
            "scored_share": scored,
            "reward_min": low,
            "reward_max": high,
            "group_std": stats["reward_std"][s],
        }
        return {
            f"{SCALAR_PREFIX}{name}/{channel}": float(array[k])
            for name, array in per_channel.items()
            for k, channel in enumerate(self.channels)
        }

    def take_log_scalars(self) -> dict[str, float]:
        """The mean of each scalar over the steps reduced since the last call, NaN left out (``{}`` when none were).

        A scalar that is NaN at every step stays NaN (a channel with no group of two or more values).
        """
        pending, self._to_log = self._to_log, []
        if not pending:
            return {}
        out = {}
        for key in pending[0]:
            values = np.asarray([p[key] for p in pending])
            kept = values[~np.isnan(values)]
            out[key] = float(kept.mean()) if len(kept) else float("nan")
        return out

    def reduction(self) -> RunReduction | None:
        """The reduction of every part so far, merged (``None`` before the first part)."""
        return merge_reductions(self.reductions)

    def series(self) -> RunSeries:
        """The per-step series of every step reduced so far (what ``scan`` computes from the parts)."""
        merged = self.reduction()
        return merged.series if merged is not None else empty_series(self.channels)

    def _table(self, records: list[StepRecord]) -> Any:
        import pyarrow as pa

        steps, groups, lengths = [], [], []
        prompts: list[str | None] = []
        completions: list[str | None] = []
        for r in records:
            n = r.rewards.shape[0]
            steps.append(np.full(n, r.step, dtype=np.int64))
            groups.append(np.arange(n, dtype=np.int64) // r.group_size)
            prompts.extend(_as_text(p) for p in r.prompts)
            completions.extend(_as_text(c) for c in r.completions)
            lengths.extend(r.completion_lengths)
        rewards = torch.cat([r.rewards.float().cpu() for r in records]).numpy()
        advantages = torch.cat([r.advantages.float().cpu() for r in records]).numpy()
        columns: dict[str, Any] = {"step": np.concatenate(steps), "group_id": np.concatenate(groups)}
        for k, channel in enumerate(self.channels):
            columns[channel_column(channel)] = rewards[:, k]
        columns[self.advantage_column] = advantages
        if all(r.weights is not None for r in records):
            for k, channel in enumerate(self.channels):
                columns[f"weight/{channel}"] = np.concatenate(
                    [np.full(r.rewards.shape[0], float(r.weights[k]), dtype=np.float32) for r in records]  # type: ignore[index]
                )
        if records and all(r.extras is not None for r in records):
            columns.update(self._extra_columns(records))
        columns["prompt"] = prompts
        columns["completion"] = completions
        columns["completion_length"] = np.asarray(lengths, dtype=np.int64)
        if records and all(r.truncated is not None for r in records):
            columns["truncated"] = np.concatenate([np.asarray(r.truncated, dtype=bool) for r in records])
        metadata = {
            WEIGHTS_METADATA_KEY: json.dumps({c: self.weights.get(c, 1.0) for c in self.channels}),
            ALGO_METADATA_KEY: self.algo,
        }
        return pa.table(columns).replace_schema_metadata(metadata)

    def _extra_columns(self, records: list[StepRecord]) -> dict[str, Any]:
        """``raw_reward/<channel>`` and the per-step recipe columns of a scheduled retrain."""
        extras = [r.extras for r in records if r.extras is not None]
        out: dict[str, Any] = {}
        for channel in extras[0].raw_rewards:
            out[f"raw_reward/{channel}"] = torch.cat([e.raw_rewards[channel].float() for e in extras]).numpy()
        for name in extras[0].columns:
            values: list[Any] = []
            for r, e in zip(records, extras, strict=True):
                values.extend([e.columns[name]] * r.rewards.shape[0])
            out[name] = values
        return out

    def flush(self) -> bool:
        """Reduce and write the buffered steps as one Parquet part (atomically); False when none were buffered."""
        self._buffered_steps = 0
        if not self.enabled or not self._rows:
            return False
        import pyarrow.parquet as pq

        records, self._rows = self._rows, []
        first, last = min(r.step for r in records), max(r.step for r in records)
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        target = self.rollouts_dir / f"part-{first:06d}-{last:06d}.parquet"
        table = self._table(records)
        self._reduce(records, table, target)
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self.files_written += 1
        return True

    def holds_rollouts(self) -> bool:
        """Whether the rollouts directory already holds parts (of this run before a resume, or of another run)."""
        return self.rollouts_dir.is_dir() and any(self.rollouts_dir.glob("part-*.parquet"))

    def truncate_from(self, step: int) -> None:
        """Forget rollouts of steps >= ``step`` (a resumed run regenerates them)."""
        if not self.enabled or not self.rollouts_dir.is_dir():
            return
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for part in sorted(self.rollouts_dir.glob("part-*.parquet")):
            match = _PART.search(part.name)
            if not match:
                continue
            first, last = int(match.group(1)), int(match.group(2))
            if last < step:
                continue
            if first >= step:
                part.unlink()
                continue
            table = pq.read_table(part)
            kept = table.filter(pc.less(table["step"], step))
            target = part.with_name(f"part-{first:06d}-{step - 1:06d}.parquet")
            with atomic_path(target) as tmp:
                pq.write_table(kept.replace_schema_metadata(table.schema.metadata), tmp, compression="zstd")
            part.unlink()
        self.purge_step = step
        self._extremes = None
        # The steps before the resume are the run's too: the live diagnosis judges them, as scan of the parts does.
        self.reductions = [
            reduce_part(pq.read_table(part), part) for part in sorted(self.rollouts_dir.glob("part-*.parquet"))
        ]

    def close(self) -> None:
        """Write what is buffered and close the TensorBoard writer."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _extremes_of(reductions: list[RunReduction], channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Each channel's largest and smallest reward over ``reductions`` (NaN where none had a value)."""
    top, bottom = np.full(channels, np.nan), np.full(channels, np.nan)
    for reduction in reductions:
        values = reduction.series.values
        if len(reduction.series.steps):
            top = np.fmax(top, np.fmax.reduce(values["reward_max"], axis=0))
            bottom = np.fmin(bottom, np.fmin.reduce(values["reward_min"], axis=0))
    return top, bottom


def reduce_part(table: Any, path: Path) -> RunReduction:
    """One rollout part (the canonical table the monitor writes) reduced as ``scan`` reduces it: read through
    :class:`~collapse_doctor.io.rollouts.table_run.TableRun` (the same validation, grouping and weights metadata
    as the Parquet file), reduced on the CPU."""
    from collapse_doctor.engine.reduce import reduce_rollouts
    from collapse_doctor.io.rollouts.table_run import TableRun

    reader = TableRun(table, label=path, sources=[path], part_of_run=True)
    return reduction_of(reader, reduce_rollouts(reader, "cpu"), "cpu")
