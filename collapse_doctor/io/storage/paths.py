"""Expanding what the user named (files, directories, glob patterns, object storage URLs) into files, each once.

The one expansion of input paths: discovery (:mod:`collapse_doctor.io.discovery`) gives each file its kind
with the format registry, :class:`~collapse_doctor.io.rollouts.parquet.ParquetRun` keeps only Parquet files of the
directories it is given. It sits below both (the readers must not import the registry that lists them).

An ``s3://``, ``gs://``, ``az://`` or ``hf://`` URL names an object, a prefix (a directory) or a glob, and its files are
:class:`~collapse_doctor.io.storage.remote.RemotePath`\\ s (:mod:`collapse_doctor.io.storage.remote`); what follows
treats them as it treats local files. A directory that cannot be listed (permissions) or a symlink loop is an error
naming it, never skipped.
"""

from __future__ import annotations

import errno
import glob
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.storage.remote import RemotePath, expand_url, is_url


@dataclass(frozen=True)
class Expansion:
    """Every file named, each with its kind, and the first directory named (runs are named relative to it)."""

    files: list[tuple[str, Path]]
    base: Path | None
    directories: tuple[Path, ...] = ()
    """The directories named or matched by a glob (their files were found, not named)."""
    glob_roots: tuple[Path, ...] = ()
    """The fixed directory of each glob that matched files (``runs/`` of ``runs/*/rollouts.parquet``): its matches
    are grouped into runs as a directory's files are, by where they lie, so a glob across run dirs is a sweep."""


def expand_paths(
    paths: Sequence[str | Path],
    *,
    kind_of: Callable[[Path], str | None],
    empty_directory: Callable[[str, list[Path]], InputError],
    default: str = "parquet",
) -> Expansion:
    """Files named, matched by a glob or found in a directory, each once (by resolved path), in order.

    A directory (or an object storage prefix) contributes the files below it (recursively) that ``kind_of``
    gives a kind; with none, ``empty_directory(path, files below it)`` is raised. A file named explicitly or
    matched by a glob is kept whatever its name (kind ``default`` when ``kind_of`` says nothing), so it is read
    and its reader's error names it. A missing path, a glob with no match, a symlink loop or a directory that
    cannot be listed is an InputError.
    """
    if not paths:
        raise InputError("no input given", hint="pass a Parquet file, a log directory or a glob")
    found: list[tuple[str, Path]] = []
    base: Path | None = None
    directories: list[Path] = []
    roots: list[Path] = []
    for raw in paths:
        text = str(raw)
        if not text.strip():
            # Path("") is ".": an empty argument (an unset shell variable) must not scan the working directory
            raise InputError(f"{text!r}: an empty path", hint="pass a file, a directory or a glob (a variable unset?)")
        if is_url(raw):
            listing = expand_url(raw)
            if listing.directory is not None:
                base = base or listing.directory
                directories.append(listing.directory)
                found += _usable(text, list(listing.files), kind_of, empty_directory)
            else:
                if listing.pattern:
                    prefix = _remote_glob_root(listing.files[0], text)
                    roots.append(prefix)
                    base = base or prefix
                found += [(kind_of(p) or default, p) for p in listing.files]
            continue
        path = Path(text)
        if path.is_dir():
            base = base or path
            directories.append(path)
            found += _usable(text, _files_below(path), kind_of, empty_directory)
        elif path.exists():
            found.append((kind_of(path) or default, path))
        elif glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True))
            below = [d for d in matched if d.is_dir()]
            files = [p for p in matched if p.is_file()]
            if not below and not files:
                raise InputError(f"{text}: pattern matches no file or directory")
            root = _glob_root(text)
            base = base or root
            before = len(found)
            for directory in below:  # each matched directory as if it were named (a sweep of run dirs)
                directories.append(directory)
                found += [(kind, p) for p in _files_below(directory) if (kind := kind_of(p)) is not None]
            if files:
                roots.append(root)
                # Files the glob alone matched are read whatever their names; beside matched directories only the
                # ones a format recognises, as in a directory.
                found += [(kind, p) for p in files if (kind := kind_of(p) or (None if below else default))]
            if len(found) == before:
                raise empty_directory(text, [p for d in below for p in _files_below(d)] + files)
        else:
            _check_symlink_loop(path, text)
            raise InputError(f"{text}: no such file or directory")
    # The same file named twice (a glob plus a path) must not double every row.
    unique: dict[Path, tuple[str, Path]] = {}
    for kind, p in found:
        unique.setdefault(p.resolve(), (kind, p))
    return Expansion(files=list(unique.values()), base=base, directories=tuple(directories), glob_roots=tuple(roots))


def _glob_root(pattern: str) -> Path:
    """The directory a glob's fixed leading parts name (``runs`` of ``runs/*/rollouts.parquet``; ``.`` for
    ``*.parquet``)."""
    fixed: list[str] = []
    for part in Path(pattern).parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _remote_glob_root(match: RemotePath, url: str) -> RemotePath:
    """The prefix a storage glob's fixed leading parts name (``s3://bucket/runs`` of ``s3://bucket/runs/*/x``),
    never above the bucket (``match`` is one of its matches)."""
    scheme, _, key = url.partition("://")
    fixed: list[str] = []
    for part in key.split("/"):
        if glob.has_magic(part):
            break
        fixed.append(part)
    root = RemotePath(f"{scheme}://" + "/".join(fixed))
    return root if root in match.parents else match.bucket


def _usable(
    text: str,
    inside: list[Path],
    kind_of: Callable[[Path], str | None],
    empty_directory: Callable[[str, list[Path]], InputError],
) -> list[tuple[str, Path]]:
    usable = [(kind, p) for p in inside if (kind := kind_of(p)) is not None]
    if not usable:
        raise empty_directory(text, inside)
    return usable


def _files_below(directory: Path) -> list[Path]:
    """The files below ``directory`` (recursively, symlinked directories not followed, as ``Path.rglob``),
    sorted. A subdirectory that cannot be listed or an entry that is a symlink loop is an InputError: the run
    must not be judged on the readable part alone."""

    def unreadable(exc: OSError) -> None:
        where = exc.filename if exc.filename is not None else directory
        raise InputError(
            f"{where}: cannot read this directory ({exc.strerror or exc})",
            hint="fix its permissions (the run's files below it would be left out), or point at another directory",
        ) from exc

    out: list[Path] = []
    for top, _, names in os.walk(directory, onerror=unreadable):
        for name in names:
            path = Path(top, name)
            try:
                regular = path.is_file()
            except OSError as exc:
                raise InputError(f"{path}: cannot read ({exc.strerror or exc})", hint="fix its permissions") from exc
            if regular:
                out.append(path)
            elif path.is_symlink():
                _check_symlink_loop(path, str(path))  # a dangling link is not a file: skipped, as before
    return sorted(out)


def _check_symlink_loop(path: Path, text: str) -> None:
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(
                f"{text}: symbolic link loop (the link resolves to itself through other links)",
                hint="point the link at a real file or directory, or pass the target itself",
            ) from exc


def common_directory(files: Sequence[Path]) -> Path:
    """The deepest directory that holds every file (files in object storage: their common prefix within one
    bucket; files of different buckets or local and remote files mixed: the first file's directory)."""
    remote = [p for p in files if isinstance(p, RemotePath)]
    if not remote:
        return Path(os.path.commonpath([str(p.resolve().parent) for p in files]))
    if len(remote) < len(files) or len({p.bucket for p in remote}) > 1:
        return files[0].parent
    parents = [p.parent.parts for p in remote]
    shared = 0
    while all(len(parts) > shared and parts[shared] == parents[0][shared] for parts in parents):
        shared += 1
    common = remote[0].parent
    for _ in range(len(parents[0]) - shared):
        common = common.parent
    return common
