"""Scalar-only runs in the scan pipeline: a rollout source with no rollouts, and the summary fields.

When a run has only a scalar log, :class:`ScalarOnlyRun` stands in for the rollout reader: it yields no
steps, so the statistics pass does nothing and the rollout detectors are skipped, while the reward
channels found in the scalar log (TRL ``rewards/<name>/mean``, verl GDPO ``gdpo/<name>/...``) become the
run's channels. :func:`summary_extras` adds the scalar log to the run summary (points read, framework,
step range for scalar-only runs, notes) and :func:`scalar_channel_table` fills the channel table from the
per-channel reward series.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_doctor.io import tags as T
from collapse_doctor.io.parquet import IngestNotes
from collapse_doctor.schema import RolloutBatch, resolve_weights

if TYPE_CHECKING:
    from collapse_doctor.batching import StackedChunk
    from collapse_doctor.diagnosis import Diagnosis, RunSummary
    from collapse_doctor.io.sources import RunInputs
    from collapse_doctor.scalars import ScalarSeries


@dataclass
class _NoColumns:
    advantage: str | None = None


@dataclass
class ScalarOnlyRun:
    """The rollout-reader interface of ``diagnose()`` for a run that logged scalars only."""

    files: list[Path]
    channels: tuple[str, ...]
    weights: dict[str, float]
    num_rows: int = 0
    notes: IngestNotes = field(default_factory=IngestNotes)
    columns: _NoColumns = field(default_factory=_NoColumns)
    ground_truth: dict[str, Any] | None = None

    @classmethod
    def build(cls, inputs: RunInputs, scalars: ScalarSeries | None, weights: dict[str, float] | None) -> ScalarOnlyRun:
        channels = scalars.channels if scalars is not None else ()
        return cls(
            files=inputs.scalar_files(),
            channels=channels,
            weights=resolve_weights(channels, weights or {}, {}),
        )

    def iter_steps(self) -> Iterator[RolloutBatch]:
        return iter(())

    def iter_chunks(self, max_rows: int) -> Iterator[StackedChunk]:
        return iter(())


def summary_extras(
    summary: RunSummary,
    inputs: RunInputs,
    run: Any,
    scalars: ScalarSeries | None,
    *,
    multiple: bool,
) -> tuple[RunSummary, ScalarSeries | None]:
    """The run summary with the scalar log's share: points, framework, notes, and steps for scalar-only runs."""
    changes: dict[str, Any] = {"name": inputs.name if multiple else None}
    if scalars is not None:
        warnings = list(summary.warnings) + scalars.notes
        if scalars.framework is None:
            shown = ", ".join(scalars.raw_tags[:8]) + (" ..." if len(scalars.raw_tags) > 8 else "")
            warnings.append(
                f"scalar log: no TRL, verl, OpenRLHF or NeMo-RL tags recognised (tags: {shown}); "
                "the CD5xx detectors had nothing to read"
            )
        changes |= {
            "scalar_points": scalars.points,
            "scalar_framework": scalars.framework,
            "warnings": tuple(warnings),
        }
        if isinstance(run, ScalarOnlyRun):
            steps = scalars.steps()
            changes |= {
                "steps": len(steps),
                "first_step": int(steps[0]) if len(steps) else None,
                "last_step": int(steps[-1]) if len(steps) else None,
                "algorithm_source": "no rollouts (scalar log only)",
            }
        else:
            known = set(summary.sources)
            changes["sources"] = summary.sources + tuple(str(p) for p in scalars.sources if str(p) not in known)
    return replace(summary, **changes), scalars


def _tail_median(values: np.ndarray) -> float | None:
    if not len(values):
        return None
    tail = values[len(values) - max(1, len(values) // 10) :]
    finite = tail[np.isfinite(tail)]
    return float(np.median(finite)) if len(finite) else None


def _peak(points: Any) -> tuple[float | None, int | None]:
    if points is None or not np.isfinite(points.values).any():
        return None, None
    at = int(np.nanargmax(points.values))
    return float(points.values[at]), int(points.steps[at])


def scalar_channel_table(diagnosis: Diagnosis) -> list[dict[str, Any]]:
    """Channel rows of a scalar-only run: reward mean now and reward std at its peak and now.

    A collapse-doctor retrain log adds rel_gain at its peak and now and the share of constant groups.
    """
    rows = []
    scalars = diagnosis.scalars
    for channel in diagnosis.run.channels:
        mean = scalars.get(T.CHANNEL_MEAN + channel) if scalars is not None else None
        std = scalars.get(T.CHANNEL_STD + channel) if scalars is not None else None
        rel = scalars.get(T.CHANNEL_REL_GAIN + channel) if scalars is not None else None
        constant = scalars.get(T.CHANNEL_ZERO_VAR_SHARE + channel) if scalars is not None else None
        peak, peak_step = _peak(std)
        rel_peak, rel_peak_step = _peak(rel)
        rows.append(
            {
                "channel": channel,
                "weight": diagnosis.run.weights.get(channel, 1.0),
                "rel_gain_peak": rel_peak,
                "rel_gain_peak_step": rel_peak_step,
                "rel_gain_now": _tail_median(rel.values) if rel is not None else None,
                "signal_share_grpo": None,
                "signal_share_gdpo": None,
                "zero_variance_share": _tail_median(constant.values) if constant is not None else None,
                "reward_mean": _tail_median(mean.values) if mean is not None else None,
                "reward_std_peak": peak,
                "reward_std_peak_step": peak_step,
                "reward_std_now": _tail_median(std.values) if std is not None else None,
            }
        )
    return rows
