"""A run's reduction: what every entry point keeps of a run's rollouts (the per-step series and the counts
that reading them made), and how the reductions of parts of a run merge.

``scan`` reduces a run's rollouts in one pass; ``watch`` reduces each per-step rollout file once, when it appears;
the TRL callback reduces each part it writes. All three merge their parts into one :class:`RunReduction` and hand
it to the one function that judges a run (:func:`collapse_doctor.pipeline.scan.diagnose_reduction`), so weight
inference, algorithm detection, support minima and skips apply everywhere alike.

Values only: no I/O, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from collapse_doctor.core.series import RunSeries


@dataclass
class IngestNotes:
    """Counts behind the warnings (and the information) that reading a run may produce (never errors)."""

    nan_rewards: Counter[str] = field(default_factory=Counter)
    group_sizes: Counter[int] = field(default_factory=Counter)
    duplicate_rows: int = 0
    """Rows with the same step, group, prompt and completion text as another row: normal GRPO (a group's short
    completions often coincide), so information, not a warning."""
    ragged_blocks: int = 0
    repeated_groups: int = 0
    """Groups whose rows (prompt and completion, in order) repeat another group of the same step exactly: the same
    rollouts read twice (a file given twice under two names), a warning."""
    repeated_group_rows: int = 0
    groups_checked: int = 0
    """Groups the repeat check looked at (two or more rows with two or more different completions)."""
    group_column_ignored: str | None = None
    """The group column that ``--group-size`` overrode (its blocks win over the column)."""
    later_reward_columns: dict[str, int] = field(default_factory=dict)
    """Reward-like columns the first file lacks, with how many later files have them (not read)."""
    files: int = 0
    length_cap_unused: str | None = None
    """Why ``--max-completion-length`` told no cut (a ``truncated`` column does, or the lengths are not tokens)."""
    identical_files: list[tuple[str, str]] = field(default_factory=list)
    """Input pairs with the same size and Parquet footer: most likely one file copied under two names."""
    source_notes: list[str] = field(default_factory=list)
    """What an adapter learnt from the trainer's own files that changes what is checked (a tracker's completions
    table whose advantages hold a KL penalty the rows lack), said once."""

    def merged(self, other: IngestNotes) -> IngestNotes:
        """These notes and those of another part of the same run (another file), as one run's: counts added,
        lists joined (a copy; neither is changed)."""
        out = IngestNotes(
            nan_rewards=Counter(self.nan_rewards),
            group_sizes=Counter(self.group_sizes),
            group_column_ignored=self.group_column_ignored or other.group_column_ignored,
            length_cap_unused=self.length_cap_unused or other.length_cap_unused,
            later_reward_columns=dict(self.later_reward_columns),
            files=self.files + other.files,
            identical_files=[*self.identical_files, *other.identical_files],
            source_notes=list(dict.fromkeys([*self.source_notes, *other.source_notes])),
        )
        for name in ("duplicate_rows", "ragged_blocks", "repeated_groups", "repeated_group_rows", "groups_checked"):
            setattr(out, name, getattr(self, name))
        out.add_counts(other)
        for column, count in other.later_reward_columns.items():
            out.later_reward_columns[column] = out.later_reward_columns.get(column, 0) + count
        return out

    def add_counts(self, other: IngestNotes) -> None:
        """Add the counts that reading pass 2 makes (of a shard of the same run) to these."""
        self.nan_rewards.update(other.nan_rewards)
        self.group_sizes.update(other.group_sizes)
        for name in ("duplicate_rows", "ragged_blocks", "repeated_groups", "repeated_group_rows", "groups_checked"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def warnings(self) -> list[str]:
        out = list(self.source_notes)
        out += [
            f"reward/{channel}: {count} NaN value(s), kept as 'not applicable' (ignored by the baselines)"
            for channel, count in sorted(self.nan_rewards.items())
            if count
        ]
        if self.group_column_ignored:
            out.append(
                f"--group-size overrides the {self.group_column_ignored!r} column: groups are consecutive blocks of "
                f"rows (pass --group-col {self.group_column_ignored} to use the column)"
            )
        if self.length_cap_unused:
            out.append(f"--max-completion-length is not used: {self.length_cap_unused}")
        for column, count in sorted(self.later_reward_columns.items()):
            out.append(
                f"{column!r} is in {count} of {self.files} files but not in the first one: not read (scan those "
                "files on their own, or put the column in every file)"
            )
        for first, twin in self.identical_files:
            out.append(f"{twin} has the same size and Parquet footer as {first}: the same file given twice?")
        singletons = self.group_sizes.get(1, 0)
        if singletons:
            out.append(f"{singletons} group(s) of size 1: they carry no ranking signal (advantage 0)")
        sizes = sorted(self.group_sizes)
        if len(sizes) > 1:
            common = self.group_sizes.most_common(1)[0][0]
            odd = sum(n for size, n in self.group_sizes.items() if size != common)
            out.append(
                f"ragged group sizes: {odd} group(s) differ from the usual size {common} "
                f"(sizes {sizes[0]}..{sizes[-1]})"
            )
        if self.ragged_blocks:
            out.append(
                f"{self.ragged_blocks} step(s) whose row count is not a multiple of --group-size: "
                "their last block is a smaller group"
            )
        if self.repeated_groups:
            out.append(
                f"{self.repeated_groups} group(s) ({self.repeated_group_rows} rows) repeat an earlier group of the "
                f"same step row for row (same prompt and completions in the same order; {self.groups_checked} "
                "checked): the same rollouts given twice? (a file passed under two names)"
            )
        return out

    def info(self) -> list[str]:
        """What reading found that is normal and changes nothing (for the run summary, not its warnings)."""
        if not self.duplicate_rows:
            return []
        return [
            f"{self.duplicate_rows} duplicate row(s): same step, group and completion text as another row "
            "(identical completions within a group; normal for short completions)"
        ]


@dataclass(frozen=True)
class RunReduction:
    """A run's rollouts reduced: per-step series plus what reading them found (sizes, weights, notes, labels).

    The summary, the algorithm, inferred weights and the diagnosis are all computed from this value, by one
    function, whichever entry point reduced the rollouts.
    """

    series: RunSeries
    channels: tuple[str, ...]
    weights: dict[str, float]
    weights_source: str
    sources: tuple[str, ...]
    """The files the rollouts were read from."""
    rollouts: int
    notes: IngestNotes
    """Counts behind the reading warnings: NaN rewards, group sizes, duplicates, ragged steps..."""
    logged_advantage: bool
    """Whether the rollouts carry the advantage the trainer used."""
    dynamic_weight_channels: tuple[str, ...] = ()
    declared_algorithm: tuple[str, str] | None = None
    """``(estimator, how it is known)`` as the trainer's own files declare it (the callback's Parquet metadata, a
    tracker's config), for a run whose logged advantages cannot decide."""
    step_labels: Mapping[int, str] = field(default_factory=dict)
    """``{step: aggregation}`` from the rollouts' ``aggregation`` column (a hybrid switch); empty without one."""
    step_active: Mapping[int, str] = field(default_factory=dict)
    """``{step: "a,b"}`` from the rollouts' ``active_channels`` column (``channel_start``); empty without one."""
    ground_truth: dict[str, Any] | None = None
    device: str = "cpu"
    step_digests: Mapping[int, str] = field(default_factory=dict)
    """``{step: digest}`` of the rows a step logged (TRL completions): equal digests of consecutive steps are one
    generation batch logged twice (:func:`without_reused_steps`)."""

    @property
    def groups(self) -> int:
        return int(sum(self.notes.group_sizes.values()))

    def with_series(self, series: RunSeries) -> RunReduction:
        return replace(self, series=series)


def merge_series(parts: Sequence[RunSeries]) -> RunSeries | None:
    """One series from the series of disjoint step sets, in step order (``None`` when their layouts differ).

    >>> a = RunSeries(np.array([2]), ("x",), [], {"v": np.array([2.0])})
    >>> b = RunSeries(np.array([1]), ("x",), [], {"v": np.array([1.0])})
    >>> merge_series([a, b]).values["v"].tolist()
    [1.0, 2.0]
    """
    first = parts[0]
    if any(p.channels != first.channels or p.values.keys() != first.values.keys() for p in parts):
        return None
    steps = np.concatenate([p.steps for p in parts])
    order = np.argsort(steps, kind="stable")
    values = {name: np.concatenate([p.values[name] for p in parts])[order] for name in first.values}
    return RunSeries(steps=steps[order], channels=first.channels, pairs=first.pairs, values=values)


def merge_reductions(parts: Sequence[RunReduction]) -> RunReduction | None:
    """The reduction of a run read part by part (files, or a trainer's parts), as one pass over them all would
    make it; ``None`` when the parts disagree on channels, weights or series (the run must be read whole)."""
    if not parts:
        return None
    first = parts[0]
    if any(p.channels != first.channels or p.weights != first.weights for p in parts[1:]):
        return None
    series = merge_series([p.series for p in parts]) if len(parts) > 1 else first.series
    if series is None:
        return None
    notes = first.notes
    for part in parts[1:]:
        notes = notes.merged(part.notes)
    sources = set(p.weights_source for p in parts)
    return RunReduction(
        series=series,
        channels=first.channels,
        weights=dict(first.weights),
        weights_source=first.weights_source if len(sources) == 1 else " + ".join(sorted(sources)),
        sources=tuple(s for p in parts for s in p.sources),
        rollouts=sum(p.rollouts for p in parts),
        notes=notes,
        logged_advantage=all(p.logged_advantage for p in parts),
        dynamic_weight_channels=tuple(dict.fromkeys(c for p in parts for c in p.dynamic_weight_channels)),
        declared_algorithm=next((p.declared_algorithm for p in parts if p.declared_algorithm is not None), None),
        step_labels={step: label for p in parts for step, label in p.step_labels.items()},
        step_active={step: active for p in parts for step, active in p.step_active.items()},
        ground_truth=first.ground_truth,
        device=first.device,
        step_digests={step: digest for p in parts for step, digest in p.step_digests.items()},
    )


def without_reused_steps(reduction: RunReduction) -> tuple[RunReduction, tuple[str, ...]]:
    """The reduction with each generation batch counted once, and a note when some were logged again.

    With TRL's ``num_iterations`` (or ``steps_per_generation``) above 1 the trainer optimises on one generation
    batch for several steps and logs it at each: a step whose rows equal the previous step's (same digest) is the
    same rollouts, not new ones. Its series row is dropped (the batch stays at the step it was generated) and its
    rollouts and groups are not counted again.

    >>> series = RunSeries(np.array([1, 2, 3]), ("x",), [], {"rollouts": np.array([4.0, 4.0, 4.0]),
    ...     "groups": np.array([1.0, 1.0, 1.0]), "group_size_min": np.full(3, 4.0), "group_size_max": np.full(3, 4.0)})
    >>> notes = IngestNotes(group_sizes=Counter({4: 3}), files=3)
    >>> run = RunReduction(series, ("x",), {"x": 1.0}, "default 1.0", (), 12, notes, True,
    ...     step_digests={1: "a", 2: "a", 3: "b"})
    >>> once, note = without_reused_steps(run)
    >>> once.series.steps.tolist(), once.rollouts, once.groups
    ([1, 3], 8, 2)
    """
    digests = reduction.step_digests
    series = reduction.series
    if len(digests) < 2 or series.num_steps < 2:
        return reduction, ()
    steps = [int(s) for s in series.steps]
    reused = np.zeros(len(steps), dtype=bool)
    for i in range(1, len(steps)):
        digest = digests.get(steps[i])
        reused[i] = digest is not None and digest == digests.get(steps[i - 1])
    count = int(reused.sum())
    if not count:
        return reduction, ()
    keep = ~reused
    values = {name: array[keep] for name, array in series.values.items()}
    kept = RunSeries(steps=series.steps[keep], channels=series.channels, pairs=series.pairs, values=values)
    notes = reduction.notes.merged(IngestNotes())
    for i in np.flatnonzero(reused).tolist():
        low, high = series.values["group_size_min"][i], series.values["group_size_max"][i]
        if low == high and np.isfinite(high):  # groups of one size (TRL's): take them back out of the count
            notes.group_sizes[int(high)] -= int(series.values["groups"][i])
    notes.group_sizes = Counter({size: n for size, n in notes.group_sizes.items() if n > 0})
    rollouts = reduction.rollouts - int(np.nansum(series.values["rollouts"][reused]))
    unique = len(steps) - count
    note = (
        f"advantages reused: {count} of {len(steps)} logged steps repeat the previous step's generation batch row "
        f"for row (TRL num_iterations or steps_per_generation above 1, about {len(steps) / unique:.3g} optimizer "
        f"steps per batch): each of the {rollouts:,} rollouts is counted once, at the step it was generated"
    )
    return replace(reduction, series=kept, rollouts=rollouts, notes=notes), (note,)
