"""Expanding what the user named (files, directories, glob patterns) into files, each once.

The one expansion of input paths: discovery (:mod:`collapse_doctor.io.discovery`) gives each file its kind
with the format registry, :class:`~collapse_doctor.io.parquet.ParquetRun` keeps only Parquet files of the
directories it is given. It sits below both (the readers must not import the registry that lists them).
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapse_doctor.errors import InputError


@dataclass(frozen=True)
class Expansion:
    """Every file named, each with its kind, and the first directory named (runs are named relative to it)."""

    files: list[tuple[str, Path]]
    base: Path | None


def expand_paths(
    paths: Sequence[str | Path],
    *,
    kind_of: Callable[[Path], str | None],
    empty_directory: Callable[[str, list[Path]], InputError],
    default: str = "parquet",
) -> Expansion:
    """Files named, matched by a glob or found in a directory, each once (by resolved path), in order.

    A directory contributes the files below it (recursively) that ``kind_of`` gives a kind; with none,
    ``empty_directory(path, files below it)`` is raised. A file named explicitly or matched by a glob is kept
    whatever its name (kind ``default`` when ``kind_of`` says nothing), so it is read and its reader's error
    names it. A missing path or a glob with no match is an InputError.
    """
    if not paths:
        raise InputError("no input given", hint="pass a Parquet file, a log directory or a glob")
    found: list[tuple[str, Path]] = []
    base: Path | None = None
    for raw in paths:
        text = str(raw)
        path = Path(text)
        if path.is_dir():
            base = base or path
            inside = sorted(p for p in path.rglob("*") if p.is_file())
            usable = [(kind, p) for p in inside if (kind := kind_of(p)) is not None]
            if not usable:
                raise empty_directory(text, inside)
            found += usable
        elif path.exists():
            found.append((kind_of(path) or default, path))
        elif glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            if not matched:
                raise InputError(f"{text}: pattern matches no file")
            found += [(kind_of(p) or default, p) for p in matched]
        else:
            raise InputError(f"{text}: no such file or directory")
    # The same file named twice (a glob plus a path) must not double every row.
    unique: dict[Path, tuple[str, Path]] = {}
    for kind, p in found:
        unique.setdefault(p.resolve(), (kind, p))
    return Expansion(files=list(unique.values()), base=base)
