"""Find the runs in what the user pointed at: files, directories (sniffed recursively) and globs.

Every file is classified by its name (and, for ambiguous JSONL, its first line):

================================  =====================================================
kind                              recognised as
================================  =====================================================
``parquet``                       ``*.parquet``, ``*.pq``, ``*.parq`` (canonical rollout table)
``trl_completions``               ``completions/completions_<step>.parquet`` (TRL ``log_completions``)
``verl_rollouts``                 ``<rollout_data_dir>/<step>.jsonl`` (verl rollout dumps)
``nemo_rl``                       ``train_data_step<N>.jsonl`` (NeMo-RL GRPO training data)
``events``                        ``*tfevents*`` (TensorBoard event files)
``trainer_state``                 ``trainer_state.json`` (transformers / TRL ``log_history``)
``verl_file_log``                 other ``*.jsonl`` whose lines are ``{"step": N, "data": {...}}``
================================  =====================================================

A directory (named alone) that holds one set of rollouts is one run: every scalar log under it belongs to
it (a TRL output dir: ``completions/`` + ``runs/<date>/events...`` + ``checkpoint-N/trainer_state.json``,
or several event dirs of one training run). Otherwise files of one kind are grouped by directory; each group
has a root (its directory, or the parent of ``completions/`` or ``checkpoint-N/``), groups whose roots are
nested in one another are one run, and event files in sibling directories are separate runs, as TensorBoard
shows them. All canonical Parquet files named are one run, as before.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collapse_doctor.errors import InputError, UsageError
from collapse_doctor.io.parquet import PARQUET_SUFFIXES

if TYPE_CHECKING:
    from collapse_doctor.io.tensorboard import EventFileRead, ScalarLog
    from collapse_doctor.scalars import ScalarSeries

ROLLOUT_KINDS = ("parquet", "trl_completions", "verl_rollouts", "nemo_rl")
SCALAR_KINDS = ("events", "trainer_state", "verl_file_log")
_TRL_COMPLETIONS = re.compile(r"completions_(\d+)\.parquet")
_VERL_ROLLOUT = re.compile(r"(\d+)\.jsonl")
_NEMO_RL = re.compile(r"train_data_step(\d+)\.jsonl")
_CHECKPOINT = re.compile(r"checkpoint-\d+")
FORMATS_HINT = (
    "collapse-doctor reads Parquet rollout tables, TRL completions/completions_<step>.parquet, verl "
    "<rollout_data_dir>/<step>.jsonl, NeMo-RL train_data_step<N>.jsonl, TensorBoard event files, "
    "trainer_state.json and verl file-logger JSONL (docs/input-formats.md); rename rollout dumps to those "
    "names, and map a Parquet table's own column names with --step-col, --group-col or --group-size, and "
    "--reward-cols"
)


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            return handle.readline()
    except OSError:
        return ""


def classify(path: Path) -> str | None:
    """The kind of one file, or ``None`` when collapse-doctor does not read it."""
    from collapse_doctor.io.scalar_logs import looks_like_verl_file_log

    name = path.name
    if "tfevents" in name:
        return "events"
    if name == "trainer_state.json":
        return "trainer_state"
    if path.suffix in PARQUET_SUFFIXES:
        return "trl_completions" if _TRL_COMPLETIONS.fullmatch(name) else "parquet"
    if _NEMO_RL.fullmatch(name):
        return "nemo_rl"
    if path.suffix == ".jsonl":
        first = _first_line(path)
        if looks_like_verl_file_log(first):
            return "verl_file_log"
        if _VERL_ROLLOUT.fullmatch(name):
            return "verl_rollouts"
    return None


@dataclass
class RunInputs:
    """The files of one run: at most one rollout source and any scalar sources."""

    name: str
    root: Path
    rollout_kind: str | None = None
    rollout_files: list[Path] = field(default_factory=list)
    event_files: list[Path] = field(default_factory=list)
    trainer_states: list[Path] = field(default_factory=list)
    file_logs: list[Path] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [*self.rollout_files, *self.event_files, *self.trainer_states, *self.file_logs]

    @property
    def has_scalars(self) -> bool:
        return bool(self.event_files or self.trainer_states or self.file_logs)

    def scalar_files(self) -> list[Path]:
        """Event files win; without them the latest trainer_state.json, or the verl file logs."""
        if self.event_files:
            return list(self.event_files)
        if self.trainer_states:
            return [_latest_trainer_state(self.trainer_states)]
        return list(self.file_logs)


def _latest_trainer_state(paths: Sequence[Path]) -> Path:
    """The output dir's own trainer_state.json, else the highest checkpoint's (its log_history is longest)."""

    def rank(p: Path) -> tuple[int, int]:
        found = re.fullmatch(r"checkpoint-(\d+)", p.parent.name)
        return (0, int(found.group(1))) if found else (1, 0)

    return max(paths, key=rank)


def _expand(paths: Sequence[str | Path]) -> tuple[list[tuple[str, Path]], list[Path], Path | None]:
    """Classified files, unrecognised files found in directories, and the directory to name runs from."""
    if not paths:
        raise InputError("no input given", hint="pass a Parquet file, a log directory or a glob")
    found: list[tuple[str, Path]] = []
    ignored: list[Path] = []
    base: Path | None = None
    for raw in paths:
        text = str(raw)
        path = Path(text)
        if path.is_dir():
            base = base or path
            inside = sorted(p for p in path.rglob("*") if p.is_file())
            kinds = [(classify(p), p) for p in inside]
            usable = [(k, p) for k, p in kinds if k is not None]
            ignored += [p for k, p in kinds if k is None]
            if not usable:
                shown = ", ".join(str(p.relative_to(path)) for p in inside[:8])
                more = f" and {len(inside) - 8} more" if len(inside) > 8 else ""
                raise InputError(
                    f"{text}: no run found in this directory (it holds {len(inside)} file(s)"
                    + (f": {shown}{more}" if inside else "")
                    + ")",
                    hint=FORMATS_HINT,
                )
            found += usable
        elif path.exists():
            # A file named explicitly is read even when its name says nothing (as Parquet, the default).
            found.append((classify(path) or "parquet", path))
        elif glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            if not matched:
                raise InputError(f"{text}: pattern matches no file")
            found += [(classify(p) or "parquet", p) for p in matched]
        else:
            raise InputError(f"{text}: no such file or directory")
    unique: dict[Path, tuple[str, Path]] = {}
    for kind, p in found:
        unique.setdefault(p.resolve(), (kind, p))
    return list(unique.values()), ignored, base


def _root(kind: str, directory: Path) -> Path:
    if kind == "trl_completions" and directory.name == "completions":
        return directory.parent
    if kind == "trainer_state" and _CHECKPOINT.fullmatch(directory.name):
        return directory.parent
    return directory


def _related(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def discover_runs(paths: Sequence[str | Path]) -> list[RunInputs]:
    """Group the inputs into runs (see the module docstring); at least one run or an InputError."""
    files, _, base = _expand(paths)
    groups: dict[tuple[str, Path], list[Path]] = {}
    for kind, p in files:
        key = (kind, Path("<parquet>") if kind == "parquet" else _root(kind, p.parent))
        groups.setdefault(key, []).append(p)
    rollout_sets = [key for key in groups if key[0] in ROLLOUT_KINDS]
    if len(rollout_sets) == 1 and base is not None and len(paths) == 1:
        return [_one_output_dir(groups, rollout_sets[0], base)]
    order = {k: i for i, k in enumerate(("events", "parquet", "trl_completions", "verl_rollouts", "nemo_rl"))}
    runs: list[RunInputs] = []
    for (kind, root), members in sorted(groups.items(), key=lambda item: (order.get(item[0][0], 9), str(item[0][1]))):
        if kind == "parquet":
            root = Path(os.path.commonpath([str(p.resolve().parent) for p in members]))
        related = [r for r in runs if _related(r.root, root)]
        target = related[0] if len(related) == 1 else None
        if kind in ROLLOUT_KINDS:
            if target is None or target.rollout_kind is not None:
                target = RunInputs(name="", root=root)
                runs.append(target)
            target.rollout_kind = kind
            target.rollout_files = sorted(members)
            continue
        if kind != "events" and len(related) > 1 and all(r.has_scalars for r in related):
            continue  # e.g. a trainer_state.json above several event dirs: their events say more
        if target is None or (kind == "events" and target.event_files):
            target = RunInputs(name="", root=root)
            runs.append(target)
        {"events": target.event_files, "trainer_state": target.trainer_states, "verl_file_log": target.file_logs}[
            kind
        ].extend(sorted(members))
    for run in runs:
        run.name = _name(run.root, base, len(runs))
    return runs


def _one_output_dir(groups: dict[tuple[str, Path], list[Path]], rollouts: tuple[str, Path], base: Path) -> RunInputs:
    """A directory with one set of rollouts is one run: every scalar log under it belongs to that run.

    A trainer's output dir often holds several event dirs of one run (TRL's ``runs/<date>_<host>/``, a
    callback's own ``tensorboard/``): their tags differ, and they are read as one scalar log.
    """
    run = RunInputs(name=base.name or str(base), root=base)
    run.rollout_kind = rollouts[0]
    run.rollout_files = sorted(groups[rollouts])
    for (kind, _), members in sorted(groups.items(), key=lambda item: str(item[0][1])):
        target = {"events": run.event_files, "trainer_state": run.trainer_states, "verl_file_log": run.file_logs}
        if kind in target:
            target[kind].extend(sorted(members))
    return run


def _name(root: Path, base: Path | None, count: int) -> str:
    if base is not None:
        try:
            relative = root.resolve().relative_to(base.resolve())
            return str(relative) if str(relative) != "." else (base.name or str(base))
        except ValueError:
            pass
    return root.name or str(root)


def choose_run(runs: Sequence[RunInputs], name: str | None) -> RunInputs:
    """The run named ``name`` (exact, or its last path part), or the only run."""
    if name is None:
        if len(runs) == 1:
            return runs[0]
        raise UsageError(
            f"found {len(runs)} runs: {', '.join(r.name for r in runs)}",
            hint="pick one with --run NAME (scan reports them all)",
        )
    for run in runs:
        if name in (run.name, run.root.name, str(run.root)):
            return run
    raise UsageError(f"--run {name!r} matches no run; found: {', '.join(r.name for r in runs)}")


def open_rollouts(run: RunInputs, *, check_rewards_first: bool = True, **options: object) -> object | None:
    """The run's rollouts as a ParquetRun-like object (``iter_steps()`` per step), or ``None``.

    ``check_rewards_first=False`` lets a canonical Parquet run check its rewards while it streams
    them (see :class:`ParquetRun`); the other layouts are read whole and checked when opened.
    """
    kind = run.rollout_kind
    if kind is None:
        return None
    if kind == "parquet":
        from collapse_doctor.io.parquet import ParquetRun

        return ParquetRun(run.rollout_files, check_rewards_first=check_rewards_first, **options)  # type: ignore[arg-type]
    if kind == "trl_completions":
        from collapse_doctor.io.trl import open_trl_completions

        return open_trl_completions(run.rollout_files, **options)  # type: ignore[arg-type]
    if kind == "verl_rollouts":
        from collapse_doctor.io.verl import open_verl_rollouts

        return open_verl_rollouts(run.rollout_files, **options)  # type: ignore[arg-type]
    from collapse_doctor.io.nemo_rl import open_nemo_rl

    return open_nemo_rl(run.rollout_files, **options)  # type: ignore[arg-type]


DYNAMIC_WEIGHT_PREFIX = "weight/"
"""Per-row channel weight columns, as ``collapse-doctor retrain --algo gdpo-dynamic`` writes them."""
DYNAMIC_WEIGHTS_SOURCE = "dynamic channel weights"
"""How a run summary's ``algorithm_source`` starts when the rollouts carry ``weight/<channel>`` columns."""


def dynamic_weight_channels(files: Sequence[str | Path]) -> tuple[str, ...]:
    """Channels with a ``weight/<channel>`` column in the first Parquet rollout file (dynamic weights).

    Reads only the file's schema; files that are not Parquet, or cannot be read, give ``()``.
    """
    parquet = [Path(f) for f in files if Path(f).suffix.lower() in PARQUET_SUFFIXES]
    if not parquet:
        return ()
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(parquet[0]).names
    except (OSError, ValueError):
        return ()
    prefix = DYNAMIC_WEIGHT_PREFIX
    return tuple(n[len(prefix) :] for n in names if n.startswith(prefix) and len(n) > len(prefix))


def read_scalar_log(run: RunInputs, cache: ScalarCache | None = None) -> ScalarSeries | None:
    """The run's scalar log in canonical names (event files, else trainer_state.json, else verl file logs)."""
    from collapse_doctor.io.scalar_logs import read_trainer_state
    from collapse_doctor.scalars import scalar_series

    files = run.scalar_files()
    if not files:
        return None
    log = (cache or ScalarCache()).read(files) if run.event_files or run.file_logs else read_trainer_state(files[0])
    return scalar_series(log.tags, points=log.points, sources=log.files, notes=log.notes())


class ScalarCache:
    """Remembers what was read of each growing scalar file; a new read parses only the bytes added since.

    Event files and verl file logs only grow (a record or line at a time), so ``watch`` keeps one cache and
    calls :meth:`read` every poll. A file that shrank (rotated, rewritten) is read again from the start.
    """

    def __init__(self) -> None:
        self._reads: dict[Path, list[EventFileRead]] = {}

    def read(self, files: Sequence[Path]) -> ScalarLog:
        from collapse_doctor.io.scalar_logs import read_verl_file_log
        from collapse_doctor.io.tensorboard import merge_reads, read_event_file

        ordered = sorted(files, key=lambda p: (p.name, str(p)))
        parts: list[EventFileRead] = []
        for path in ordered:
            done = self._reads.setdefault(path, [])
            offset = done[-1].end if done else 0
            try:
                size = path.stat().st_size
            except OSError:
                size = offset
            if size < offset:
                done.clear()
                offset = 0
            if size > offset or not done:
                reader = read_event_file if "tfevents" in path.name else read_verl_file_log
                part = reader(path, start=offset)
                if part.records or not done:
                    done.append(part)
            parts.extend(_renumbered(done))
        return merge_reads(parts)


def _renumbered(reads: list[EventFileRead]) -> list[EventFileRead]:
    """One read per file: the parts of a file read at different times, concatenated in order."""
    import numpy as np

    from collapse_doctor.io.tensorboard import EventFileRead

    if len(reads) == 1:
        return reads
    names: dict[str, int] = {}
    tag_index, order, session_starts = [], [], []
    offset = 0
    for part in reads:
        remap = np.asarray([names.setdefault(n, len(names)) for n in part.tag_names], dtype=np.int32)
        tag_index.append(remap[part.tag_index] if len(part.tag_index) else part.tag_index)
        order.append(part.order + offset)
        session_starts += [(r + offset, s) for r, s in part.session_starts]
        offset += part.records
    last = reads[-1]
    return [
        EventFileRead(
            path=last.path,
            start=reads[0].start,
            end=last.end,
            records=offset,
            truncated=last.truncated,
            tag_names=list(names),
            tag_index=np.concatenate(tag_index),
            steps=np.concatenate([p.steps for p in reads]),
            values=np.concatenate([p.values for p in reads]),
            wall_times=np.concatenate([p.wall_times for p in reads]),
            order=np.concatenate(order),
            session_starts=session_starts,
        )
    ]
