"""Monitoring of a retrain run: the canonical rollout table and TensorBoard scalars, as it trains.

Every generation batch (one training step) becomes rows of the canonical table (``step``,
``group_id``, ``reward/<channel>``, ``advantage`` as the trainer used it, ``prompt``, ``completion``,
``completion_length``; ``weight/<channel>`` for gdpo-dynamic). Rows are buffered and written every
``write_every`` steps as ``OUTPUT/rollouts/part-<first>-<last>.parquet``, each file atomically, so
``collapse-doctor scan OUTPUT/rollouts`` works while the run goes on. With each part, the per-step
statistics that ``scan`` computes (``collapse_doctor.stats.step_statistics``) of its steps are written
as TensorBoard scalars under ``collapse_doctor/`` into ``OUTPUT/tensorboard``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapse_doctor.io.atomic import atomic_path
from collapse_doctor.schema import WEIGHTS_METADATA_KEY, channel_column

ROLLOUTS_DIR = "rollouts"
TENSORBOARD_DIR = "tensorboard"
ALGO_METADATA_KEY = "collapse_doctor.retrain.algo"
_PART = re.compile(r"part-(\d+)-(\d+)\.parquet$")


@dataclass
class StepRecord:
    """One generation batch as the trainer scored it (all processes gathered)."""

    step: int
    rewards: torch.Tensor
    """``[N, C]`` float32, NaN where a reward function returned None."""
    advantages: torch.Tensor
    """``[N]`` the advantages the loss used."""
    group_size: int
    prompts: list[str]
    completions: list[str]
    completion_lengths: list[int]
    weights: torch.Tensor | None = None
    """``[C]`` this step's dynamic weights (gdpo-dynamic only)."""


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclass
class RolloutMonitor:
    """Buffers step records, writes Parquet parts and TensorBoard scalars (main process only)."""

    output_dir: Path
    channels: tuple[str, ...]
    weights: dict[str, float]
    algo: str
    write_every: int = 10
    enabled: bool = True
    purge_step: int | None = None
    _rows: list[StepRecord] = field(default_factory=list)
    _writer: Any = None
    files_written: int = 0
    last_step: int | None = None

    @property
    def rollouts_dir(self) -> Path:
        return self.output_dir / ROLLOUTS_DIR

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / TENSORBOARD_DIR

    def _tb(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.tensorboard_dir), purge_step=self.purge_step)
        return self._writer

    def record(self, record: StepRecord) -> bool:
        """Keep one step; write its scalars; returns True when a Parquet part was written."""
        if not self.enabled:
            return False
        self._rows.append(record)
        self.last_step = record.step
        if len({r.step for r in self._rows}) >= self.write_every:
            return self.flush()
        return False

    def _write_scalars(self, records: list[StepRecord]) -> None:
        """The scan's per-step statistics of the buffered steps, as TensorBoard scalars.

        One ``step_statistics`` call for all of them: per call, its cost is mostly fixed overhead.
        """
        from collapse_doctor.advantages import compute_advantages
        from collapse_doctor.stats import ChunkInput, step_statistics

        rewards = torch.cat([r.rewards.float().cpu() for r in records])
        sizes = [r.rewards.shape[0] for r in records]
        step_index = torch.repeat_interleave(torch.arange(len(records)), torch.tensor(sizes))
        offsets = [0]
        for r, n in zip(records, sizes, strict=True):
            offsets.append(offsets[-1] + -(-n // r.group_size))
        groups = torch.cat(
            [torch.arange(n) // r.group_size + offsets[i] for i, (r, n) in enumerate(zip(records, sizes, strict=True))]
        )
        weights = torch.tensor([self.weights.get(c, 1.0) for c in self.channels], dtype=torch.float32)
        adv = compute_advantages(rewards, groups, weights=weights, step_index=step_index)
        stats = step_statistics(ChunkInput(rewards, groups, step_index, weights, adv, offsets[-1], len(records)))
        share_key = "signal_share_grpo" if self.algo == "grpo" else "signal_share_gdpo"
        table = {
            "rel_gain": stats["rel_gain"].tolist(),
            "signal_share": stats[share_key].tolist(),
            "zero_variance_share": stats["channel_zero_var_share"].tolist(),
        }
        combined = stats["zero_var_share"].tolist()
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._tb()._get_file_writer()
        for s, record in enumerate(records):
            values: dict[str, float] = {}
            for k, channel in enumerate(self.channels):
                for name, per_step in table.items():
                    values[f"collapse_doctor/{name}/{channel}"] = per_step[s][k]
                weight = float(record.weights[k]) if record.weights is not None else self.weights.get(channel, 1.0)
                values[f"collapse_doctor/weight/{channel}"] = weight
            values["collapse_doctor/zero_variance_share"] = combined[s]
            values["collapse_doctor/advantage_std"] = float(record.advantages.float().std())
            # One event per step holding every scalar: a queue hand-off per scalar costs more than the math.
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
            writer.add_summary(summary, record.step)

    def _table(self, records: list[StepRecord]) -> Any:
        import pyarrow as pa

        steps, groups, lengths = [], [], []
        prompts: list[str] = []
        completions: list[str] = []
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
        columns["advantage"] = advantages
        if all(r.weights is not None for r in records):
            for k, channel in enumerate(self.channels):
                columns[f"weight/{channel}"] = np.concatenate(
                    [np.full(r.rewards.shape[0], float(r.weights[k]), dtype=np.float32) for r in records]  # type: ignore[index]
                )
        columns["prompt"] = prompts
        columns["completion"] = completions
        columns["completion_length"] = np.asarray(lengths, dtype=np.int64)
        metadata = {
            WEIGHTS_METADATA_KEY: json.dumps({c: self.weights.get(c, 1.0) for c in self.channels}),
            ALGO_METADATA_KEY: self.algo,
        }
        return pa.table(columns).replace_schema_metadata(metadata)

    def flush(self) -> bool:
        """Write the buffered steps as one Parquet part (atomically); False when nothing was buffered."""
        if not self.enabled or not self._rows:
            return False
        import pyarrow.parquet as pq

        records, self._rows = self._rows, []
        self._write_scalars(records)
        first, last = min(r.step for r in records), max(r.step for r in records)
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        target = self.rollouts_dir / f"part-{first:06d}-{last:06d}.parquet"
        with atomic_path(target) as tmp:
            pq.write_table(self._table(records), tmp, compression="zstd")
        self.files_written += 1
        if self._writer is not None:
            self._writer.flush()
        return True

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

    def close(self) -> None:
        """Write what is buffered and close the TensorBoard writer."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
