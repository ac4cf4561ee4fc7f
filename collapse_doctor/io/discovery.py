"""Find the runs in what the user pointed at: files, directories (searched recursively) and globs.

Paths are expanded by :func:`collapse_doctor.io.storage.paths.expand_paths` and every file is classified by the
format registry (:mod:`collapse_doctor.io.formats`); files of other kinds found in directories are ignored.
A file named explicitly is always read (as Parquet when its name says nothing else; a ``*.db`` that is no
tracker's database is an error naming it).

Files of one kind are grouped by their format's root (their directory, or the parent of ``completions/`` or
``checkpoint-N/``). Canonical Parquet files found in a directory are split into runs by
:mod:`collapse_doctor.io.rollouts.parquet_parts` (sibling runs apart, the part files of one run together); those
named explicitly are one run. Each set of rollouts in a named directory owns the highest directory (up to the one
named) that holds no other set of rollouts, and every scalar log in it belongs to that run: a TRL output dir
(``completions/`` + ``runs/<date>/events...`` + ``checkpoint-N/trainer_state.json``, or several event dirs of one
training run) is one run, alone or beside other runs; with TRL's ``completions/`` and the callback's ``rollouts/``
both in it, the callback's are read and TRL's set aside (:func:`_one_rollout_source`). The other sets are handled in
the formats' discovery rank, and a set joins the one run whose root is nested with its own; event files in sibling
directories are separate runs, as TensorBoard shows them.

A file that holds several runs (a Trackio project, an MLflow store: formats with ``members``) gives one run per
member, named ``<file stem>/<run name>`` below the root's path, with the bare run name as an alias for
``--run``; the only member in a rollout run's directory joins that run instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.io.formats import FORMATS, Member, classify, formats_hint, is_rollouts
from collapse_doctor.io.rollouts.parquet_parts import being_written, shared_groups
from collapse_doctor.io.storage.paths import Expansion, common_directory, expand_paths
from collapse_doctor.io.storage.sqlite_store import DB_SUFFIXES, describe_foreign

DEFAULT_KIND = "parquet"
"""The kind :func:`~collapse_doctor.io.storage.paths.expand_paths` gives a file named explicitly that no format
recognises (its reader's error then names it)."""
SetKey = tuple[str, Path | None]
"""A set of files of one kind: ``(kind, root)``; root ``None`` for the files of a rootless kind named explicitly."""


@dataclass
class RunInputs:
    """The files of one run: at most one rollout source and any scalar logs."""

    name: str
    root: Path
    rollout_kind: str | None = None
    rollout_files: list[Path] = field(default_factory=list)
    scalar_logs: dict[str, list[Path]] = field(default_factory=dict)
    """The run's scalar log files by kind (``events``, ``trainer_state``, ``verl_file_log``); none empty."""
    member: str | None = None
    """The run inside its tracker database that is read (a Trackio run name, an MLflow run id; the format's
    ``read_member`` key), ``None`` when its scalar files hold one run each."""
    aliases: tuple[str, ...] = ()
    """Other names ``--run`` picks it by (the bare run name in a tracker database, a W&B run id)."""
    set_aside: tuple[str, ...] = ()
    """Rollout files of this run that are not read, each with why (TRL's ``completions/`` beside the callback's
    ``rollouts/``: the same generations twice)."""
    warnings: tuple[str, ...] = ()
    """What discovery saw that the run's reader cannot (files named together that share group ids)."""

    @property
    def files(self) -> list[Path]:
        """Every input file: the rollouts, then the scalar logs in their formats' precedence."""
        return [*self.rollout_files, *(p for kind in self._scalar_kinds() for p in self.scalar_logs[kind])]

    @property
    def has_scalars(self) -> bool:
        return any(self.scalar_logs.values())

    @property
    def scalar_kind(self) -> str | None:
        """The kind of scalar log that is read: event files win, then trainer_state.json, then verl file logs."""
        kinds = self._scalar_kinds()
        return kinds[0] if kinds else None

    def scalar_files(self) -> list[Path]:
        """The scalar log files that are read: all event files, else the latest trainer_state.json, else the
        verl file logs (the format's ``pick``)."""
        kind = self.scalar_kind
        return FORMATS[kind].pick(self.scalar_logs[kind]) if kind is not None else []

    def _scalar_kinds(self) -> list[str]:
        return sorted((k for k, files in self.scalar_logs.items() if files), key=lambda k: FORMATS[k].precedence)


def _no_run_found(text: str, inside: list[Path]) -> InputError:
    root = Path(text)
    shown = ", ".join(str(p.relative_to(root)) for p in inside[:8])
    more = f" and {len(inside) - 8} more" if len(inside) > 8 else ""
    return InputError(
        f"{text}: no run found in this directory (it holds {len(inside)} file(s)"
        + (f": {shown}{more}" if inside else "")
        + ")",
        hint=formats_hint(),
    )


def _common_directory(files: Sequence[Path]) -> Path:
    return common_directory(files)  # object storage files too (their common prefix)


def _related(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def discover_runs(paths: Sequence[str | Path]) -> list[RunInputs]:
    """Group the inputs into runs (see the module docstring); at least one run or an InputError."""
    expansion = expand_paths(paths, kind_of=classify, empty_directory=_no_run_found)
    base = expansion.base
    named = _named_directories(expansion)
    # A glob's files are grouped as a directory's are (by where they lie): a glob across run dirs is a sweep.
    directories = named + [r.resolve() for r in expansion.glob_roots if r.resolve() not in named]
    groups: dict[SetKey, list[Path]] = {}
    unrooted: dict[tuple[str, Path], list[Path]] = {}
    member_files: list[tuple[str, Path]] = []
    for kind, p in expansion.files:
        fmt = FORMATS[kind]
        parents = p.resolve().parents
        in_directory = any(d in parents for d in directories)
        named_here = any(d in parents for d in named)
        if not named_here and kind == DEFAULT_KIND and p.suffix in DB_SUFFIXES and classify(p) is None:
            raise describe_foreign(p, formats_hint())  # a database named explicitly that no tracker wrote
        if fmt.members is not None:
            member_files.append((kind, p))
        elif fmt.root is not None:
            groups.setdefault((kind, fmt.root(p)), []).append(p)
        elif in_directory:
            unrooted.setdefault((kind, _partitioned_directory(p)), []).append(p)
        else:
            groups.setdefault((kind, None), []).append(p)  # files named explicitly: one set
    writing: dict[SetKey, list[Path]] = {}
    for (kind, directory), found in unrooted.items():
        pending = being_written(found) if is_rollouts(kind) else []
        files = [f for f in found if f not in pending]
        split = FORMATS[kind].split
        sets = split(files) if split is not None else [sorted(files)]
        for files_of_run in sets:
            # A run of several files alone in its directory is rooted there; a lone file at the file itself,
            # so that runs in the subdirectories beside it keep their own directories.
            whole = len(sets) == 1 and len(files_of_run) > 1
            set_key: SetKey = (kind, directory if whole else files_of_run[0])
            groups.setdefault(set_key, []).extend(files_of_run)
            if pending and files_of_run is sets[-1]:
                writing[set_key] = pending  # beside the newest set of the directory (a writer adds to it)
    for set_key, files in groups.items():
        rooted = is_rollouts(set_key[0]) and set_key[1] is not None and set_key not in writing
        if rooted and (pending := being_written(files)):
            writing[set_key] = pending
            files[:] = [f for f in files if f not in pending]
    named_together = groups.get((DEFAULT_KIND, None), [])
    warnings: dict[SetKey, tuple[str, ...]] = {}
    if len(named_together) > 1 and (shared := shared_groups(named_together)) is not None:
        where = f"{shared.first} and {shared.second} both hold rollouts of step {shared.step}, group {shared.group!r}"
        hint = (
            "two runs: scan them as a sweep (their directory, or a quoted glob 'runs/*.parquet'); per-rank files of "
            "one run: give each rank's groups ids of their own, or write the run as one table"
        )
        if shared.other_prompts:
            raise InputError(f"{where} with other prompts: they are two runs, not one", hint=hint)
        warnings[(DEFAULT_KIND, None)] = (
            f"{where}: named together, they are read as one run whose groups hold the rows of both (right for one "
            f"run split across files; two runs, such as an unquoted shell glob of two seeds, would be merged). Hint: "
            f"{hint}",
        )
    set_aside = _one_rollout_source(groups)
    for set_key, pending in writing.items():
        set_aside[set_key] = (
            *set_aside.get(set_key, ()),
            *(f"{p} (no Parquet footer yet: a file being written; read once it is complete)" for p in pending),
        )
    territories = _territories(groups, directories)
    joined = {
        key: owner
        for key in groups
        if not is_rollouts(key[0])
        and (owner := _territory_of(key[1] or _common_directory(groups[key]), territories)) is not None
    }
    runs: list[RunInputs] = []
    by_rollouts: dict[SetKey, RunInputs] = {}
    for key, members in sorted(groups.items(), key=lambda item: (FORMATS[item[0][0]].rank, str(item[0][1]))):
        kind, set_root = key
        fmt = FORMATS[kind]
        if key in joined:
            continue
        # A kind without a root (canonical Parquet) is one set, rooted at the files' common directory.
        root = territories.get(key) or set_root or _common_directory(members)
        related = [r for r in runs if _related(r.root, root)]
        target = related[0] if len(related) == 1 else None
        if is_rollouts(kind):
            if target is None or target.rollout_kind is not None:
                target = RunInputs(name="", root=root)
                runs.append(target)
            target.rollout_kind = kind
            target.rollout_files = sorted(members)
            target.set_aside = set_aside.get(key, ())
            target.warnings = warnings.get(key, ())
            by_rollouts[key] = target
            continue
        if not fmt.own_run and len(related) > 1 and all(r.has_scalars for r in related):
            continue  # e.g. a trainer_state.json above several event dirs: their events say more
        if target is None or (fmt.own_run and kind in target.scalar_logs):
            target = RunInputs(name="", root=root)
            runs.append(target)
        _add_scalars(target, kind, members)
    # Every scalar log in a rollout set's own directory tree belongs to that run (several event dirs of one run).
    for key, owner in sorted(joined.items(), key=lambda item: str(item[0][1])):
        _add_scalars(by_rollouts[owner], key[0], groups[key])
    for run in runs:
        run.name = _name(run.root, base)
    runs += _member_runs(member_files, territories, by_rollouts, base, directories)
    if not runs:
        raise InputError(
            f"{', '.join(str(p) for p in paths)}: no run found (the tracker databases found hold no runs)",
            hint=formats_hint(),
        )
    return runs


TRL_COMPLETIONS, CALLBACK_ROLLOUTS, WANDB_TABLE = "trl_completions", "rollouts", "wandb_table"
"""TRL's ``log_completions`` files (a format kind), the directory ``CollapseDoctorCallback`` writes its rollout
parts to, beside them in the trainer's output dir, and the completions tables TRL logs to W&B (a format kind)."""


def _one_rollout_source(groups: dict[SetKey, list[Path]]) -> dict[SetKey, tuple[str, ...]]:
    """One training, one rollout source: where a TRL output dir holds both ``completions/`` (TRL's
    ``log_completions``) and the callback's ``rollouts/`` parts, the TRL set is dropped from ``groups`` and the
    callback's is read (the same generations, with the advantages the loss used, token lengths and the cut flag).
    Returns ``{kept set: what was set aside, and why}``."""
    out: dict[SetKey, tuple[str, ...]] = {}
    for key in [k for k in groups if k[0] == TRL_COMPLETIONS and k[1] is not None]:
        root = key[1]
        assert root is not None
        beside = [
            k
            for k, files in groups.items()
            if is_rollouts(k[0])
            and k[0] != TRL_COMPLETIONS
            and files
            and all(f.parent.resolve() == (root / CALLBACK_ROLLOUTS).resolve() for f in files)
        ]
        if len(beside) != 1:
            continue
        files = groups.pop(key)
        out[beside[0]] = (
            f"{root / 'completions'} ({len(files)} file(s), TRL log_completions): the same generations as "
            f"{root / CALLBACK_ROLLOUTS}, which CollapseDoctorCallback wrote with the advantages the loss used, token "
            "lengths and the cut flag; read once, from there",
        )
    for key in [k for k in groups if k[0] == WANDB_TABLE]:
        if key[1] is None:
            continue
        logs = key[1].parent.resolve()  # <output dir>/wandb: wandb's directory in the trainer's output dir
        beside = [
            k
            for k, files in groups.items()
            if is_rollouts(k[0])
            and k[0] != WANDB_TABLE
            and files
            and all(_contains(logs.parent, f.resolve()) and not _contains(logs, f.resolve()) for f in files)
        ]
        if len(beside) != 1:
            continue
        files = groups.pop(key)
        out[beside[0]] = (
            *out.get(beside[0], ()),
            f"{key[1]} ({len(files)} W&B completions table(s), TRL log_completions): the same generations as "
            f"{_common_directory(groups[beside[0]])}; read once, from there",
        )
    return out


def _add_scalars(run: RunInputs, kind: str, files: Sequence[Path]) -> None:
    run.scalar_logs.setdefault(kind, []).extend(sorted(files))
    run.aliases += tuple(a for p in files for a in FORMATS[kind].aliases(p) if a not in run.aliases)


def _named_directories(expansion: Expansion) -> list[Path]:
    """The directories named or matched by a glob (their files were found, not named), resolved."""
    named: list[Path] = []
    for directory in (*expansion.directories, *([expansion.base] if expansion.base is not None else [])):
        if directory.resolve() not in named:
            named.append(directory.resolve())
    return named


def _partitioned_directory(path: Path) -> Path:
    """The file's directory, above Hive-style partition folders (``step=10/``): the files of one table."""
    directory = path.parent
    while "=" in directory.name and directory.parent != directory:
        directory = directory.parent
    return directory


def _territories(groups: dict[SetKey, list[Path]], directories: Sequence[Path]) -> dict[SetKey, Path]:
    """For each rollout set in a named directory: the highest directory (up to that directory) that holds no
    other rollout set. A trainer's output dir (``completions/`` or ``rollouts/`` beside ``runs/``,
    ``tensorboard/``, ``checkpoint-N/``) is its run's territory; with one set, the named directory is."""
    roots = {
        key: (key[1] or _common_directory(files)).resolve() for key, files in groups.items() if is_rollouts(key[0])
    }
    out: dict[SetKey, Path] = {}
    for key, root in roots.items():
        tops = [d for d in directories if _contains(d, root)]
        if not tops:
            continue  # named explicitly
        if FORMATS[key[0]].self_contained:
            out[key] = root
            continue
        top = max(tops, key=lambda d: len(d.parts))
        others = [r for k, r in roots.items() if k != key]
        if any(_related(root, other) for other in others):
            continue  # rollout sets nested in each other: the generic rules decide
        territory = root if root.is_dir() else root.parent
        if any(_contains(territory, other) for other in others):
            continue  # a sibling file's run: its directory is shared
        while territory != top and not any(_contains(territory.parent, other) for other in others):
            territory = territory.parent
        out[key] = territory
    return out


def _contains(directory: Path, path: Path) -> bool:
    return directory == path or directory in path.parents


def _territory_of(root: Path, territories: dict[SetKey, Path]) -> SetKey | None:
    """The rollout set whose territory holds ``root`` (only one can)."""
    root = root.resolve()
    owners = [key for key, territory in territories.items() if _contains(territory, root)]
    return owners[0] if len(owners) == 1 else None


def _member_runs(
    member_files: Sequence[tuple[str, Path]],
    territories: dict[SetKey, Path],
    by_rollouts: dict[SetKey, RunInputs],
    base: Path | None,
    directories: Sequence[Path],
) -> list[RunInputs]:
    """One run per run inside each tracker database; the only one in a rollout set's territory joins it."""
    found: list[tuple[str, Path, Member]] = []
    for kind, path in member_files:
        fmt = FORMATS[kind]
        assert fmt.members is not None and fmt.root is not None
        members = fmt.members(path)
        if not members and not any(d in path.resolve().parents for d in directories):
            raise InputError(
                f"{path}: holds no runs (an empty {fmt.hint.split(' (')[0]})",
                hint="point at the database a training run logged to",
            )
        found += [(kind, path, m) for m in members]
    owners = [_territory_of(FORMATS[kind].root(path), territories) for kind, path, _ in found]  # type: ignore[misc]
    runs: list[RunInputs] = []
    for (kind, path, member), owner in zip(found, owners, strict=True):
        root = FORMATS[kind].root(path)  # type: ignore[misc]
        if owner is not None and owners.count(owner) == 1:
            run = by_rollouts[owner]
        else:
            prefix = _relative(root, base)
            run = RunInputs(name=f"{prefix}/{member.name}" if prefix else member.name, root=root)
            runs.append(run)
        run.scalar_logs.setdefault(kind, []).append(path)
        run.member = member.key
        run.aliases += (member.alias,)
        tables = FORMATS[kind].tables
        if run.rollout_kind is None and tables is not None and (table_kind := tables(path, member.key)) is not None:
            run.rollout_kind, run.rollout_files = table_kind, [path]  # the completions table the trainer logged
    return runs


def _relative(root: Path, base: Path | None) -> str:
    """``root`` relative to ``base`` ("" when it is ``base``, above it or beside it)."""
    if base is None:
        return ""
    try:
        relative = root.resolve().relative_to(base.resolve())
    except ValueError:
        return ""
    return "" if str(relative) == "." else relative.as_posix()


def _name(root: Path, base: Path | None) -> str:
    """The run's root relative to the first directory named (a lone file's run without its suffix)."""
    if root.suffix and root.is_file():
        root = root.with_suffix("")
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
    matches = [run for run in runs if name in run.aliases or run.root.stem == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(
            f"--run {name!r} matches {len(matches)} runs: {', '.join(r.name for r in matches)}",
            hint="pass the full name",
        )
    raise UsageError(f"--run {name!r} matches no run; found: {', '.join(r.name for r in runs)}")
