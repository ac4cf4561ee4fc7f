"""Read-only access to the SQLite databases trackers write (Trackio projects, MLflow's tracking store).

A database is opened with a ``file:...?mode=ro`` URI: a tracker still writing it is neither locked out nor
changed (in WAL mode, as Trackio uses, the reader sees the last committed transaction). A WAL database that no
connection has open (no ``-wal`` file) is also opened ``immutable=1``, so reading it leaves no ``-wal``/``-shm``
files behind (a read-only reader could create them but not remove them). Recognition is by
content: the 16-byte SQLite header (``SQLite format 3\\0``) and the tables a tracker creates, so a random
``*.db`` in a scanned directory is not taken for a run. Every failure is an :class:`InputError` naming the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.storage.remote import looks_remote

SQLITE_HEADER = b"SQLite format 3\x00"
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
"""File names a tracker database is looked for under (content decides)."""


def is_sqlite(path: Path) -> bool:
    """Whether the file starts with the SQLite header (False when it cannot be read; SQLite reads local files
    only, so a database in object storage is not one).
    """
    if looks_remote(path):
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


@contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path``; SQLite errors while it is used become one-line InputErrors."""
    if not is_sqlite(path):
        raise InputError(
            f"{path}: not an SQLite database", hint="pass a Trackio project database or an MLflow SQLite store"
        )
    try:
        connection = sqlite3.connect(_read_only_uri(path), uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise InputError(f"{path}: cannot open the SQLite database ({exc})") from exc
    try:
        yield connection
    except sqlite3.Error as exc:
        raise InputError(
            f"{path}: cannot read the SQLite database ({exc})",
            hint="the database is damaged or locked by a long write; copy it again or retry",
        ) from exc
    finally:
        connection.close()


def _read_only_uri(path: Path) -> str:
    """``mode=ro``; for a WAL database that no connection has open (no ``-wal`` file beside it) also
    ``immutable=1``, because a read-only reader of a WAL database would otherwise create ``-wal`` and ``-shm``
    files in the tracker's directory and leave them there (it may not delete them)."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError:
        return uri
    in_wal_mode = len(header) == 20 and header[18] == 2  # file format read version 2: WAL
    if in_wal_mode and not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    return uri


def table_columns(connection: sqlite3.Connection) -> dict[str, set[str]]:
    """``{table: {column names}}`` of every table in the database."""
    tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: {row[1] for row in connection.execute(f"PRAGMA table_info({_quoted(t)})")} for t in tables}


def has_tables(path: Path, required: dict[str, set[str]]) -> bool:
    """Whether ``path`` is an SQLite database with every ``{table: columns}`` of ``required`` (False on any error:
    recognition never fails)."""
    if not is_sqlite(path):
        return False
    try:
        with connect(path) as connection:
            found = table_columns(connection)
    except InputError:
        return False
    return all(table in found and columns <= found[table] for table, columns in required.items())


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def describe_foreign(path: Path, trackers: str) -> InputError:
    """The error for a file named explicitly that is not one of ``trackers``' databases."""
    if looks_remote(path):
        return InputError(
            f"{path}: databases in object storage are not read (SQLite reads local files only)",
            hint="copy the tracker's database to a local disk and scan the copy",
        )
    if not is_sqlite(path):
        return InputError(f"{path}: not an SQLite database, and not a file collapse-doctor reads", hint=trackers)
    try:
        with connect(path) as connection:
            tables = sorted(table_columns(connection))
    except InputError as exc:
        return exc
    shown = ", ".join(tables[:8]) + (" ..." if len(tables) > 8 else "")
    return InputError(
        f"{path}: an SQLite database without a tracker's tables (found: {shown or 'no tables'})", hint=trackers
    )
