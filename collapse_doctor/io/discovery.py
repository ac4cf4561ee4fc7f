"""Find the runs in what the user pointed at: files, directories (searched recursively) and globs.

Paths are expanded by :func:`collapse_doctor.io.paths.expand_paths` and every file is classified by the
format registry (:mod:`collapse_doctor.io.formats`); files of other kinds found in directories are ignored.
A file named explicitly is always read (as Parquet when its name says nothing else).

A directory (named alone) that holds one set of rollouts is one run: every scalar log under it belongs to
it (a TRL output dir: ``completions/`` + ``runs/<date>/events...`` + ``checkpoint-N/trainer_state.json``,
or several event dirs of one training run). Otherwise files of one kind are grouped by their format's root
(their directory, or the parent of ``completions/`` or ``checkpoint-N/``); sets are handled in the formats'
discovery rank, and a set joins the one run whose root is nested with its own. Event files in sibling
directories are separate runs, as TensorBoard shows them. All canonical Parquet files named are one run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collapse_doctor.errors import InputError, UsageError
from collapse_doctor.io.formats import FORMATS, classify, formats_hint, is_rollouts
from collapse_doctor.io.paths import expand_paths


@dataclass
class RunInputs:
    """The files of one run: at most one rollout source and any scalar logs."""

    name: str
    root: Path
    rollout_kind: str | None = None
    rollout_files: list[Path] = field(default_factory=list)
    scalar_logs: dict[str, list[Path]] = field(default_factory=dict)
    """The run's scalar log files by kind (``events``, ``trainer_state``, ``verl_file_log``); none empty."""

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
    return Path(os.path.commonpath([str(p.resolve().parent) for p in files]))


def _related(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def discover_runs(paths: Sequence[str | Path]) -> list[RunInputs]:
    """Group the inputs into runs (see the module docstring); at least one run or an InputError."""
    expansion = expand_paths(paths, kind_of=classify, empty_directory=_no_run_found)
    base = expansion.base
    groups: dict[tuple[str, Path | None], list[Path]] = {}
    for kind, p in expansion.files:
        root_of = FORMATS[kind].root
        groups.setdefault((kind, root_of(p) if root_of is not None else None), []).append(p)
    rollout_sets = [key for key in groups if is_rollouts(key[0])]
    if len(rollout_sets) == 1 and base is not None and len(paths) == 1:
        return [_one_output_dir(groups, rollout_sets[0], base)]
    runs: list[RunInputs] = []
    for (kind, set_root), members in sorted(
        groups.items(), key=lambda item: (FORMATS[item[0][0]].rank, str(item[0][1]))
    ):
        fmt = FORMATS[kind]
        # A kind without a root (canonical Parquet) is one set, rooted at the files' common directory.
        root = set_root or _common_directory(members)
        related = [r for r in runs if _related(r.root, root)]
        target = related[0] if len(related) == 1 else None
        if is_rollouts(kind):
            if target is None or target.rollout_kind is not None:
                target = RunInputs(name="", root=root)
                runs.append(target)
            target.rollout_kind = kind
            target.rollout_files = sorted(members)
            continue
        if not fmt.own_run and len(related) > 1 and all(r.has_scalars for r in related):
            continue  # e.g. a trainer_state.json above several event dirs: their events say more
        if target is None or (fmt.own_run and kind in target.scalar_logs):
            target = RunInputs(name="", root=root)
            runs.append(target)
        target.scalar_logs.setdefault(kind, []).extend(sorted(members))
    for run in runs:
        run.name = _name(run.root, base)
    return runs


def _one_output_dir(
    groups: dict[tuple[str, Path | None], list[Path]], rollouts: tuple[str, Path | None], base: Path
) -> RunInputs:
    """A directory with one set of rollouts is one run: every scalar log under it belongs to that run.

    A trainer's output dir often holds several event dirs of one run (TRL's ``runs/<date>_<host>/``, a
    callback's own ``tensorboard/``): their tags differ, and they are read as one scalar log.
    """
    run = RunInputs(name=base.name or str(base), root=base)
    run.rollout_kind = rollouts[0]
    run.rollout_files = sorted(groups[rollouts])
    for (kind, _), members in sorted(groups.items(), key=lambda item: str(item[0][1])):
        if not is_rollouts(kind):
            run.scalar_logs.setdefault(kind, []).extend(sorted(members))
    return run


def _name(root: Path, base: Path | None) -> str:
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
