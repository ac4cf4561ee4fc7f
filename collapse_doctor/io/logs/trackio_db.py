"""Trackio project databases: ``$TRACKIO_DIR/<project>.db``, one SQLite file per project, every run inside.

TRL's ``report_to="trackio"`` goes through transformers' ``TrackioCallback``: ``trackio.init(project=...,
name=run_name)`` and, at every logging step, ``trackio.log({"train/<metric>": ..., "train/global_step": N})``.
Trackio writes the database under ``TRACKIO_DIR`` (default ``~/.cache/huggingface/trackio``), named after the
project with characters other than ``[A-Za-z0-9_-]`` dropped (trackio 0.43's ``SQLiteStorage``). verl's
``trainer.logger=['trackio']`` logs its own metric names with ``step`` = the training step.

Schema read (trackio 0.2 to 0.43): ``metrics(run_name, step, metrics, ...)``, one row per ``log`` call, ``metrics``
a JSON object (nested dicts are flattened with ``/``; NaN and infinities stored as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``; media as objects with a ``_type``, which are not scalars), and, where present,
``configs(run_name, ...)``, one row per run, so a run that logged nothing is still listed. Runs are told apart by
``run_name`` (Trackio resumes a run by its name). A row holding ``train/global_step`` (transformers' callback) is
placed at that step, the step TensorBoard gives the same point; other rows are at their ``step``. Later rows win
duplicate (key, step) points.

The database is opened read-only (:mod:`collapse_doctor.io.storage.sqlite_store`) and read whole on every
read (``watch`` reads it again when it changed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.io.logs.tensorboard import EventFileRead
from collapse_doctor.io.logs.trainer_logs import records_to_read
from collapse_doctor.io.storage.sqlite_store import DB_SUFFIXES, connect, has_tables, table_columns

REQUIRED = {"metrics": {"run_name", "step", "metrics"}}
"""The table and columns that make an SQLite file a Trackio project database."""
STEP_KEY = "train/global_step"
_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def looks_like_trackio(path: Path) -> bool:
    """A ``*.db`` file with Trackio's ``metrics`` table (content decides, never raises)."""
    return path.suffix in DB_SUFFIXES and has_tables(path, REQUIRED)


def trackio_runs(path: Path) -> list[str]:
    """The run names of a project database, in the order they first appear."""
    with connect(path) as connection:
        columns = table_columns(connection)
        _check(path, columns)
        query = "SELECT run_name FROM metrics GROUP BY run_name ORDER BY MIN(id)"
        names = [row[0] for row in connection.execute(query)]
        if "run_name" in columns.get("configs", set()):
            names += [row[0] for row in connection.execute("SELECT run_name FROM configs ORDER BY id")]
    return list(dict.fromkeys(str(n) for n in names if n is not None))


def _check(path: Path, columns: Mapping[str, set[str]]) -> None:
    missing = [t for t, cols in REQUIRED.items() if t not in columns or not cols <= columns[t]]
    if missing:
        raise InputError(
            f"{path}: not a Trackio project database (no {missing[0]!r} table with columns "
            f"{', '.join(sorted(REQUIRED[missing[0]]))})",
            hint="pass the <project>.db that trackio writes under TRACKIO_DIR",
        )


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        if "_type" in value:
            return  # media (images, tables, histograms)
        for key, inner in value.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), inner, out)
        return
    if isinstance(value, str):
        if value in _SPECIAL:
            out[prefix] = _SPECIAL[value]
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    out[prefix] = float(value)


def _parsed(path: Path, run: str, row_id: int, blob: bytes | str) -> Any:
    """One ``metrics`` row's JSON (stored as text, or as a BLOB by trackio 0.43)."""
    text = blob.decode("utf-8", errors="replace") if isinstance(blob, bytes) else str(blob)
    try:
        return json_text.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{path}: metrics row {row_id} of run {run!r} is not JSON ({exc})",
            hint="the database is damaged; copy it again",
        ) from exc


def _rows(path: Path, run: str) -> Iterator[tuple[int, dict[str, float]]]:
    with connect(path) as connection:
        _check(path, table_columns(connection))
        cursor = connection.execute("SELECT id, step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (run,))
        for row_id, step, blob in cursor:
            metrics = _parsed(path, run, row_id, blob)
            values: dict[str, float] = {}
            if isinstance(metrics, dict):
                _flatten("", metrics, values)
            at = values.pop(STEP_KEY, None)
            if at is not None and at == at:
                step = int(at)
            if not isinstance(step, int):
                raise InputError(f"{path}: metrics row {row_id} of run {run!r} has no integer step ({step!r})")
            yield step, values


def read_trackio_run(path: str | Path, run: str) -> EventFileRead:
    """The scalars of one run of a Trackio project database (see the module docstring)."""
    path = Path(path)
    return records_to_read(path, list(_rows(path, run)))


def read_trackio_db(path: str | Path, *, start: int = 0) -> EventFileRead:
    """The scalars of a project database that holds one run (several runs need a name: :func:`read_trackio_run`)."""
    path = Path(path)
    runs = trackio_runs(path)
    if len(runs) != 1:
        raise UsageError(
            f"{path}: the Trackio project holds {len(runs)} runs" + (f": {', '.join(runs)}" if runs else ""),
            hint="scan the file (one result per run) and pick one with --run NAME",
        )
    return read_trackio_run(path, runs[0])


TABLE_TYPE = "trackio.table"
"""The ``_type`` of a table logged with ``trackio.Table`` (its rows in ``_value``, one object per row)."""
_TABLE_ROWS = "SELECT id, metrics FROM metrics WHERE run_name = ? AND instr(metrics, ?) > 0 ORDER BY id"
"""The rows that may hold a table (trackio 0.43 stores ``metrics`` as a BLOB, which LIKE does not match)."""


def logged_tables(path: Path, run: str, key: str, *, first: bool = False) -> list[list[dict[str, Any]]]:
    """Every table the run logged under ``key`` (TRL: ``completions``), in log order, each a list of row objects
    with NaN and infinities as floats again (``first``: only the first). Rows that do not hold a table are not
    parsed."""
    out: list[list[dict[str, Any]]] = []
    with connect(path) as connection:
        _check(path, table_columns(connection))
        for row_id, blob in connection.execute(_TABLE_ROWS, (run, TABLE_TYPE)):
            metrics = _parsed(path, run, row_id, blob)
            table = metrics.get(key) if isinstance(metrics, dict) else None
            if not (
                isinstance(table, dict) and table.get("_type") == TABLE_TYPE and isinstance(table.get("_value"), list)
            ):
                continue
            out.append(
                [
                    {k: _SPECIAL.get(v, v) if isinstance(v, str) else v for k, v in row.items()}
                    for row in table["_value"]
                    if isinstance(row, dict)
                ]
            )
            if first:
                break
    return out


def run_config(path: Path, run: str) -> dict[str, Any]:
    """The run's config (``trackio.init(config=...)``; transformers' callback passes every ``TrainingArguments``
    field), ``{}`` when the database keeps none for it."""
    with connect(path) as connection:
        if "config" not in table_columns(connection).get("configs", set()):
            return {}
        row = connection.execute(
            "SELECT config FROM configs WHERE run_name = ? ORDER BY id DESC LIMIT 1", (run,)
        ).fetchone()
    if row is None:
        return {}
    text = row[0].decode("utf-8", errors="replace") if isinstance(row[0], bytes) else str(row[0])
    try:
        config = json_text.loads(text)
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}
