"""The input formats collapse-doctor reads: one registry entry per format, everything else derived from it.

Each :class:`Format` says how a file of that kind is recognised (its name and, for JSONL, its first line),
what it holds (``rollouts`` or ``scalars``), where its run's root is, how :mod:`collapse_doctor.io.discovery`
orders it, whether it is written one file per training step, how it is opened or read, and how the
"formats we read" hint names it. :func:`classify`, :data:`ROLLOUT_KINDS`, :data:`PER_STEP_KINDS`,
:data:`FORMATS_HINT` and the discovery order all come from the registry (:data:`FORMATS`).

Recognition tries the formats in registration order; the first that recognises a file wins, so a format
whose files also look like a more general one is registered before it (TRL completions before Parquet, the
verl file logger, sniffed by its first line, before verl's ``<step>.jsonl`` rollout dumps).

To add an input format:

1. Write its reader in its own module under ``collapse_doctor/io/``: for rollouts a function
   ``(files, **ReadOptions.reader_kwargs()) -> ParquetRun`` that builds the canonical rollout table and hands
   it to :class:`~collapse_doctor.io.rollouts.table_run.TableRun` (see ``io/verl.py``); for a scalar log a function
   ``(path, *, start) -> EventFileRead`` (see ``io/scalar_logs.py``).
2. Register one :class:`Format` below: its ``kind``, ``role``, ``recognise``, ``hint``, ``rank``, the
   ``open`` (rollouts) or ``read`` (scalars) function that calls the reader, and ``root``/``per_step``/
   ``appends``/``precedence``/``pick``/``own_run``/``aliases``/``self_contained`` where the defaults do not fit; a
   file that holds several runs (a tracker's database) also lists them (``members``) and reads one
   (``read_member``), and where its runs may log their rollouts into it, names the rollout format that reads them
   (``tables``; that format opens them with ``open_member``). The reader
   must not import this module (the registry imports the readers; tests/unit/test_layers.py forbids import
   cycles).
3. Add a row to the table in docs/input-formats.md, and tests under tests/unit/io/.

Nothing else changes: discovery, opening, ``watch`` and the hint read the registry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.options import ReadOptions
from collapse_doctor.io.logs import mlflow_store, trackio_db, wandb_log
from collapse_doctor.io.logs.tensorboard import EventFileRead, read_event_file
from collapse_doctor.io.logs.trainer_logs import looks_like_verl_file_log, read_verl_file_log, trainer_state_records
from collapse_doctor.io.rollouts import nemo_rl, parquet_parts, tracker_tables, trl, verl
from collapse_doctor.io.rollouts.parquet import PARQUET_SUFFIXES, ParquetRun

ROLLOUTS = "rollouts"
SCALARS = "scalars"
TRACKIO_TABLE = "trackio_table"
CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")

FirstLine = Callable[[], str]
"""The file's first line, read on the first call (only formats that sniff the content call it)."""
Opener = Callable[[Sequence[Path], ReadOptions, bool], ParquetRun]
"""``open(files, read, check_rewards_first)``: a rollout reader (``ParquetRun``'s interface) over the files."""
MemberOpener = Callable[[Path, str, ReadOptions], ParquetRun]
"""``open_member(path, key, read)``: the rollouts one of the runs a tracker database holds logged into it."""
ScalarReader = Callable[[Path, int], EventFileRead]
"""``read(path, start)``: the scalars of one file from byte ``start`` on (0 unless the format ``appends``)."""


MemberReader = Callable[[Path, str], EventFileRead]
"""``read_member(path, key)``: the scalars of one of the runs a file holds (see :attr:`Format.members`)."""


def _parent(path: Path) -> Path:
    return path.parent


def _no_aliases(path: Path) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Member:
    """One of the runs a file holds (a run of a Trackio project database or of an MLflow store)."""

    key: str
    """What the format's ``read_member`` selects the run by (an MLflow run id, a Trackio run name)."""
    name: str
    """The run's name, relative to the file's run root (``<file stem>/<run name>``); ``--run`` also takes
    ``alias``."""
    alias: str
    """The bare run name, which ``--run`` matches too."""


@dataclass(frozen=True)
class Format:
    """One input format: how its files are recognised, grouped into runs, and opened or read."""

    kind: str
    role: str
    """``rollouts`` (one row per sampled completion) or ``scalars`` (a scalar log)."""
    recognise: Callable[[Path, FirstLine], bool]
    hint: str
    """How the formats hint (:data:`FORMATS_HINT`) names it."""
    rank: int
    """Discovery handles the file sets in rank order (ties by directory): lower ranks found runs first."""
    root: Callable[[Path], Path] | None = _parent
    """The root of a file's run (files of one kind with one root are one set); ``None``: the files of this kind
    named explicitly are one set, rooted at their common directory, and those found in directories are split
    into runs per directory by ``split``."""
    per_step: bool = False
    """Written one file per training step (``watch`` reduces each file once)."""
    open: Opener | None = None
    """Rollouts: opens the files of one run."""
    open_member: MemberOpener | None = None
    """Rollouts kept inside a tracker database (see ``tables``): opens what one of its runs logged."""
    read: ScalarReader | None = None
    """Scalars: reads one file."""
    appends: bool = False
    """Scalars: the file only grows, so a :class:`~collapse_doctor.io.logs.scalar_cache.ScalarCache` resumes where it
    stopped; otherwise the file is read whole every time."""
    precedence: int = 0
    """Scalars: a run with several kinds of scalar log reads only the kind with the lowest precedence."""
    pick: Callable[[Sequence[Path]], list[Path]] = list
    """Scalars: which of a run's files of this kind are read."""
    own_run: bool = False
    """Scalars: a set never joins a run that already has files of this kind, and is always kept (event files in
    sibling directories are separate runs, as TensorBoard shows them). Otherwise a set joins the one run it is
    nested with, and is dropped when it is nested with several runs that have scalar logs already."""
    split: Callable[[Sequence[Path]], list[list[Path]]] | None = None
    """Rollouts without a ``root``: how the files found in one directory (a named directory's subdirectory, Hive
    partition folders ``key=value/`` included) divide into runs; default: one run. Files named explicitly are
    one run."""
    members: Callable[[Path], list[Member]] | None = None
    """Scalars: the runs one file holds (a Trackio project, an MLflow store). Discovery makes each its own run
    (joined to a directory's one set of rollouts only when it is the directory's only tracker run) and
    ``read_member`` reads it; ``read`` reads a file that holds one run."""
    read_member: MemberReader | None = None
    self_contained: bool = False
    """Rollouts: the root is the whole run (a W&B run directory, which holds its own scalar log): discovery never
    widens it to the directories above, so runs beside it stay runs of their own."""
    tables: Callable[[Path, str], str | None] | None = None
    """Scalars with ``members``: the rollout kind that reads the trainer's completions table a member logged into
    the database (TRL's ``log_completions`` to Trackio), or ``None`` when it logged none. Discovery makes that the
    member's rollouts when no rollout files join it."""
    aliases: Callable[[Path], tuple[str, ...]] = _no_aliases
    """Scalars: other names ``--run`` picks the file's run by (a W&B run's id and display name)."""

    def __post_init__(self) -> None:
        if self.role == ROLLOUTS and self.open is None and self.open_member is None:
            raise ValueError(f"rollout format {self.kind!r} needs `open` (or `open_member`)")
        if self.role == SCALARS and self.read is None:
            raise ValueError(f"scalar format {self.kind!r} needs `read`")
        if (self.members is None) != (self.read_member is None):
            raise ValueError(f"format {self.kind!r}: `members` and `read_member` go together")
        if self.role not in (ROLLOUTS, SCALARS):
            raise ValueError(f"format {self.kind!r}: role must be {ROLLOUTS!r} or {SCALARS!r}")


FORMATS: dict[str, Format] = {}
"""Every input format by kind, in recognition order."""


def register(fmt: Format) -> Format:
    """Add a format to the registry (recognised after the ones registered before it)."""
    if fmt.kind in FORMATS:
        raise ValueError(f"input format {fmt.kind!r} is already registered")
    FORMATS[fmt.kind] = fmt
    return fmt


def classify(path: Path) -> str | None:
    """The kind of one file, or ``None`` when collapse-doctor does not read it."""
    cache: list[str] = []

    def first_line() -> str:
        if not cache:
            cache.append(_first_line(path))
        return cache[0]

    return next((fmt.kind for fmt in FORMATS.values() if fmt.recognise(path, first_line)), None)


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            return handle.readline()
    except OSError:
        return ""


def is_rollouts(kind: str) -> bool:
    return FORMATS[kind].role == ROLLOUTS


def is_per_step(kind: str) -> bool:
    """Whether files of this kind are written one per training step (``watch`` reduces each once)."""
    return FORMATS[kind].per_step


def scalar_format(kind: str | None, path: Path) -> Format:
    """The scalar format ``kind`` (or, without one, the file's own), or an InputError naming the file."""
    fmt = FORMATS.get(kind or classify(path) or "")
    if fmt is None or fmt.role != SCALARS:
        raise InputError(f"{path}: not a scalar log", hint=formats_hint())
    return fmt


def formats_hint() -> str:
    """What collapse-doctor reads: the rollout formats, then the scalar logs, each in discovery order."""
    ordered = [
        f for role in (ROLLOUTS, SCALARS) for f in sorted(FORMATS.values(), key=lambda f: f.rank) if f.role == role
    ]
    names = [f.hint for f in ordered]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
    return (
        f"collapse-doctor reads {listed} (docs/input-formats.md); rename rollout dumps to those names, and map a "
        "Parquet table's own column names with --step-col, --group-col or --group-size, and --reward-cols"
    )


# How each reader is called: the registry's uniform signatures onto the readers' own.


def _open_parquet(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    return ParquetRun(files, check_rewards_first=check_rewards_first, **read.reader_kwargs())


def _open_trl(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    return trl.open_trl_completions(files, **read.reader_kwargs())


def _open_verl(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    return verl.open_verl_rollouts(files, **read.reader_kwargs())


def _open_nemo_rl(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    return nemo_rl.open_nemo_rl(files, **read.reader_kwargs())


def _open_wandb_tables(files: Sequence[Path], read: ReadOptions, check_rewards_first: bool) -> ParquetRun:
    return tracker_tables.open_wandb_tables(files, **read.reader_kwargs())


def _open_trackio_tables(path: Path, run: str, read: ReadOptions) -> ParquetRun:
    return tracker_tables.open_trackio_tables(path, run, **read.reader_kwargs())


def _trackio_tables(path: Path, run: str) -> str | None:
    return TRACKIO_TABLE if tracker_tables.has_trackio_table(path, run) else None


def _read_events(path: Path, start: int) -> EventFileRead:
    return read_event_file(path, start=start)


def _read_trainer_state(path: Path, start: int) -> EventFileRead:
    return trainer_state_records(path)  # rewritten in place, so always read whole


def _read_verl_file_log(path: Path, start: int) -> EventFileRead:
    return read_verl_file_log(path, start=start)


def _read_wandb(path: Path, start: int) -> EventFileRead:
    return wandb_log.read_wandb_log(path, start=start)


def _wandb_aliases(path: Path) -> tuple[str, ...]:
    return wandb_log.run_names(path)


def _named(runs: Sequence[tuple[str, str, str]], prefix: str) -> list[Member]:
    return [Member(key=key, name=f"{prefix}/{name}", alias=bare) for key, name, bare in runs]


def _trackio_members(path: Path) -> list[Member]:
    return [Member(key=name, name=f"{path.stem}/{name}", alias=name) for name in trackio_db.trackio_runs(path)]


def _read_trackio(path: Path, start: int) -> EventFileRead:
    return trackio_db.read_trackio_db(path)


def _mlflow_db_members(path: Path) -> list[Member]:
    return _named(mlflow_store.mlflow_db_runs(path), path.stem)


def _read_mlflow_db(path: Path, start: int) -> EventFileRead:
    return mlflow_store.read_mlflow_db(path)


def _file_store_members(path: Path) -> list[Member]:
    return _named(mlflow_store.file_store_runs(path), path.parent.parent.name)


def _read_file_store(path: Path, start: int) -> EventFileRead:
    return mlflow_store.read_file_store(path)


def _looks_like_verl_file_log(path: Path, first_line: FirstLine) -> bool:
    return path.suffix == ".jsonl" and looks_like_verl_file_log(first_line())


def _trl_root(path: Path) -> Path:
    """``<output_dir>/completions/completions_<step>.parquet`` belongs to ``<output_dir>``."""
    return path.parent.parent if path.parent.name == "completions" else path.parent


def _checkpoint_root(path: Path) -> Path:
    """``<output_dir>/checkpoint-N/trainer_state.json`` belongs to ``<output_dir>``."""
    return path.parent.parent if CHECKPOINT_DIR.fullmatch(path.parent.name) else path.parent


def _latest_trainer_state(paths: Sequence[Path]) -> list[Path]:
    """The output dir's own trainer_state.json, else the highest checkpoint's (its log_history is longest)."""

    def rank(p: Path) -> tuple[int, int]:
        found = CHECKPOINT_DIR.fullmatch(p.parent.name)
        return (0, int(found.group(1))) if found else (1, 0)

    return [max(paths, key=rank)]


# Registration order is recognition order: the first format that recognises a file wins.
register(
    Format(
        kind="events",
        role=SCALARS,
        recognise=lambda path, _: "tfevents" in path.name,
        hint="TensorBoard event files",
        rank=0,
        read=_read_events,
        appends=True,
        precedence=0,
        own_run=True,
    )
)
register(
    Format(
        kind="trainer_state",
        role=SCALARS,
        recognise=lambda path, _: path.name == "trainer_state.json",
        hint="trainer_state.json",
        rank=9,
        root=_checkpoint_root,
        read=_read_trainer_state,
        precedence=1,
        pick=_latest_trainer_state,
    )
)
register(
    Format(
        kind="trl_completions",
        role=ROLLOUTS,
        recognise=lambda path, _: path.suffix in PARQUET_SUFFIXES and bool(trl.FILE_NAME.fullmatch(path.name)),
        hint="TRL completions/completions_<step>.parquet",
        rank=2,
        root=_trl_root,
        per_step=True,
        open=_open_trl,
    )
)
register(
    Format(
        kind="parquet",
        role=ROLLOUTS,
        recognise=lambda path, _: path.suffix in PARQUET_SUFFIXES,
        hint="Parquet rollout tables",
        rank=1,
        root=None,
        open=_open_parquet,
        split=parquet_parts.split_directory,
    )
)
register(
    Format(
        kind="nemo_rl",
        role=ROLLOUTS,
        recognise=lambda path, _: bool(nemo_rl.FILE_NAME.fullmatch(path.name)),
        hint="NeMo-RL train_data_step<N>.jsonl",
        rank=4,
        per_step=True,
        open=_open_nemo_rl,
    )
)
register(
    Format(
        kind="verl_file_log",
        role=SCALARS,
        recognise=_looks_like_verl_file_log,
        hint="verl file-logger JSONL",
        rank=9,
        read=_read_verl_file_log,
        appends=True,
        precedence=2,
    )
)
register(
    Format(
        kind="verl_rollouts",
        role=ROLLOUTS,
        recognise=lambda path, _: bool(verl.FILE_NAME.fullmatch(path.name)),
        hint="verl <rollout_data_dir>/<step>.jsonl",
        rank=3,
        per_step=True,
        open=_open_verl,
    )
)

register(
    Format(
        kind="wandb_table",
        role=ROLLOUTS,
        recognise=lambda path, _: tracker_tables.is_wandb_table(path),
        hint="TRL completions tables in W&B run directories (files/media/table/completions_*.table.json)",
        rank=10,
        root=tracker_tables.wandb_run_dir,
        open=_open_wandb_tables,
        self_contained=True,
    )
)
register(
    Format(
        kind=TRACKIO_TABLE,
        role=ROLLOUTS,
        recognise=lambda path, _: False,  # inside a Trackio database: discovery finds it (Format.tables)
        hint="TRL completions tables in Trackio databases",
        rank=11,
        open_member=_open_trackio_tables,
    )
)
register(
    Format(
        kind="wandb",
        role=SCALARS,
        recognise=lambda path, _: path.suffix == ".wandb" and bool(wandb_log.FILE_NAME.fullmatch(path.name)),
        hint="W&B run files (wandb/run-*/run-<id>.wandb)",
        rank=5,
        read=_read_wandb,
        appends=True,
        precedence=3,
        own_run=True,
        aliases=_wandb_aliases,
    )
)
register(
    Format(
        kind="trackio",
        role=SCALARS,
        recognise=lambda path, _: trackio_db.looks_like_trackio(path),
        hint="Trackio project databases (<project>.db)",
        rank=6,
        read=_read_trackio,
        precedence=4,
        members=_trackio_members,
        read_member=trackio_db.read_trackio_run,
        tables=_trackio_tables,
    )
)
register(
    Format(
        kind="mlflow_db",
        role=SCALARS,
        recognise=lambda path, _: mlflow_store.looks_like_mlflow_db(path),
        hint="MLflow SQLite stores (mlflow.db)",
        rank=7,
        read=_read_mlflow_db,
        precedence=5,
        members=_mlflow_db_members,
        read_member=mlflow_store.read_mlflow_db_run,
    )
)
register(
    Format(
        kind="mlflow_files",
        role=SCALARS,
        recognise=lambda path, _: mlflow_store.looks_like_file_store(path),
        hint="MLflow file stores (mlruns/)",
        rank=8,
        root=mlflow_store.store_root,
        read=_read_file_store,
        precedence=6,
        members=_file_store_members,
        read_member=mlflow_store.read_file_store_run,
    )
)

ROLLOUT_KINDS = tuple(f.kind for f in sorted(FORMATS.values(), key=lambda f: f.rank) if f.role == ROLLOUTS)
"""The built-in rollout formats (code that must see formats registered later asks :func:`is_rollouts`)."""
PER_STEP_KINDS = tuple(f.kind for f in sorted(FORMATS.values(), key=lambda f: f.rank) if f.per_step)
"""The built-in per-step rollout formats (see :func:`is_per_step`)."""
FORMATS_HINT = formats_hint()
"""The hint of "no run found" errors: what collapse-doctor reads (the built-in formats)."""
