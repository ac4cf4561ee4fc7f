"""MLflow tracking stores, read offline: the SQLite store (``mlflow.db``) and the legacy ``mlruns/`` file store.

Who writes them:

- TRL ``report_to="mlflow"`` goes through transformers' ``MLflowCallback``: ``mlflow.log_metrics(logs,
  step=global_step)`` with the trainer's keys *unprefixed* (``reward``, ``rewards/<func>/mean``, ``kl``,
  ``epoch``), characters outside ``[0-9A-Za-z_-. :/]`` replaced by ``_``; the store is ``MLFLOW_TRACKING_URI``
  (``sqlite:///mlflow.db``, or ``./mlruns`` when unset in MLflow 2, which MLflow 3 only allows with
  ``MLFLOW_ALLOW_FILE_STORE=true``).
- verl ``trainer.logger=['mlflow']``: ``MLFLOW_TRACKING_URI``, default ``sqlite:////tmp/mlruns.db``; experiment
  = ``trainer.project_name``, run name = ``trainer.experiment_name``, verl's own metric names at the training step.

Both stores can hold many runs (of several experiments); each is one run for collapse-doctor, named by its run
name (with the experiment, then the first 8 characters of its id, added where that name is not unique in the
store). Deleted runs and runs of deleted experiments are skipped. Stores read:

- SQLite: ``runs(run_uuid, name, lifecycle_stage, experiment_id)``, ``experiments(experiment_id, name,
  lifecycle_stage)`` and ``metrics(key, value, timestamp, step, run_uuid, is_nan)``; a NaN is stored as
  ``is_nan = 1`` and read back as NaN. Opened read-only (:mod:`collapse_doctor.io.storage.sqlite_store`).
- File store: ``<store>/<experiment id>/meta.yaml`` (the experiment: ``name``, ``lifecycle_stage``),
  ``<store>/<experiment id>/<run id>/meta.yaml`` (``run_name``, ``lifecycle_stage``; older stores keep the name in
  ``tags/mlflow.runName``), and ``metrics/<key>`` files of lines ``<timestamp ms> <value> <step>`` (a ``/`` in a
  key is a folder). A last line without its newline is being written and waits for the next read.

Keys: a run whose keys the tag maps (:mod:`collapse_doctor.io.logs.tags`) explain better with transformers' prefixes
(``train/``; ``eval_x`` becomes ``eval/x``, as its TensorBoard and W&B callbacks write them) gets them, so a TRL
run reads the same as its TensorBoard log; verl's and NeMo-RL's names are kept as logged. Of the points of one
(key, step), the one with the latest timestamp wins.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapse_doctor.core.errors import InputError, UsageError
from collapse_doctor.io.logs.tags import FRAMEWORKS, map_tags
from collapse_doctor.io.logs.tensorboard import EventFileRead
from collapse_doctor.io.logs.trainer_logs import records_to_read
from collapse_doctor.io.storage.sqlite_store import DB_SUFFIXES, connect, has_tables, table_columns

REQUIRED = {
    "metrics": {"key", "value", "timestamp", "step", "run_uuid", "is_nan"},
    "runs": {"run_uuid", "name", "lifecycle_stage", "experiment_id"},
}
"""The tables and columns that make an SQLite file an MLflow tracking store."""
DELETED = "deleted"
_META_LINE = re.compile(r"(?P<key>[A-Za-z_]+):\s*(?P<value>.*)")


@dataclass(frozen=True)
class StoreRun:
    """One run of a store: its id, experiment name and run name."""

    run_id: str
    experiment: str
    name: str


def unique_names(runs: Sequence[StoreRun]) -> list[tuple[str, str, str]]:
    """``(run id, name, run name)`` per run: the name is the run name, with the experiment, then the id, added
    where it is not unique.

    >>> unique_names([StoreRun("a1b2c3d4e5", "exp", "r"), StoreRun("f6", "exp2", "r"), StoreRun("g7", "e", "s")])
    [('a1b2c3d4e5', 'exp/r', 'r'), ('f6', 'exp2/r', 'r'), ('g7', 's', 's')]
    """
    plain = Counter(r.name for r in runs)
    scoped = Counter((r.experiment, r.name) for r in runs)
    out = []
    for r in runs:
        name = r.name or r.run_id
        if plain[r.name] > 1:
            name = f"{r.experiment}/{name}"
            if scoped[(r.experiment, r.name)] > 1:
                name = f"{name}@{r.run_id[:8]}"
        out.append((r.run_id, name, r.name or r.run_id))
    return out


def trainer_key(key: str) -> str:
    """A key as transformers' TensorBoard and W&B callbacks name it (``rewrite_logs``).

    >>> trainer_key("eval_loss"), trainer_key("rewards/format/mean")
    ('eval/loss', 'train/rewards/format/mean')
    """
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return f"{prefix}/{key[len(prefix) + 1 :]}"
    return "train/" + key


def prefixed_keys(keys: Iterable[str]) -> dict[str, str]:
    """``{stored key: tag}``: transformers' ``train/``/``eval/`` prefixes where they let the tag maps explain more.

    >>> prefixed_keys(["reward", "rewards/format/mean", "kl"])["rewards/format/mean"]
    'train/rewards/format/mean'
    >>> prefixed_keys(["critic/score/mean", "actor/entropy"])["actor/entropy"]
    'actor/entropy'
    """
    keys = list(keys)
    rewritten = {k: trainer_key(k) for k in keys}

    def explained(tags: Iterable[str]) -> int:
        tags = list(tags)
        return max((len(map_tags(tags, framework)) for framework in FRAMEWORKS), default=0)

    if explained(rewritten.values()) > explained(keys):
        return rewritten
    return {k: k for k in keys}


def _read(path: Path, points: list[tuple[int, int, str, float]]) -> EventFileRead:
    """A read from ``(timestamp, step, key, value)`` points in any order (the latest timestamp wins)."""
    points.sort(key=lambda p: p[0])
    tags = prefixed_keys({key for _, _, key, _ in points})
    return records_to_read(path, [(step, {tags[key]: value}) for _, step, key, value in points])


# The SQLite store.


def looks_like_mlflow_db(path: Path) -> bool:
    """A ``*.db`` file with MLflow's ``runs`` and ``metrics`` tables (content decides, never raises)."""
    return path.suffix in DB_SUFFIXES and has_tables(path, REQUIRED)


def _check(path: Path, columns: dict[str, set[str]]) -> None:
    for table, needed in REQUIRED.items():
        if table not in columns or not needed <= columns[table]:
            raise InputError(
                f"{path}: not an MLflow tracking store (no {table!r} table with columns {', '.join(sorted(needed))})",
                hint="pass the SQLite file of MLFLOW_TRACKING_URI (sqlite:///mlflow.db; verl: /tmp/mlruns.db)",
            )


def mlflow_db_runs(path: Path) -> list[tuple[str, str, str]]:
    """``(run id, name, run name)`` of every live run of an MLflow SQLite store, oldest first."""
    with connect(path) as connection:
        columns = table_columns(connection)
        _check(path, columns)
        experiments: dict[str, tuple[str, str]] = {}
        if {"experiment_id", "name", "lifecycle_stage"} <= columns.get("experiments", set()):
            query = "SELECT experiment_id, name, lifecycle_stage FROM experiments"
            for exp_id, name, stage in connection.execute(query):
                experiments[str(exp_id)] = (str(name), str(stage))
        order = "start_time, run_uuid" if "start_time" in columns["runs"] else "run_uuid"
        rows = connection.execute(f"SELECT run_uuid, name, lifecycle_stage, experiment_id FROM runs ORDER BY {order}")
        runs = []
        for run_id, name, stage, exp_id in rows:
            experiment, exp_stage = experiments.get(str(exp_id), (str(exp_id), "active"))
            if stage == DELETED or exp_stage == DELETED:
                continue
            runs.append(StoreRun(str(run_id), experiment, str(name or "")))
    return unique_names(runs)


def read_mlflow_db_run(path: str | Path, run_id: str) -> EventFileRead:
    """The metrics of one run of an MLflow SQLite store."""
    path = Path(path)
    with connect(path) as connection:
        _check(path, table_columns(connection))
        cursor = connection.execute(
            "SELECT timestamp, step, key, value, is_nan FROM metrics WHERE run_uuid = ?", (run_id,)
        )
        points = [
            (int(ts or 0), int(step or 0), str(key), float("nan") if is_nan else float(value))
            for ts, step, key, value, is_nan in cursor
        ]
    return _read(path, points)


def read_mlflow_db(path: str | Path, *, start: int = 0) -> EventFileRead:
    """The metrics of a store that holds one run (several need a name: :func:`read_mlflow_db_run`)."""
    path = Path(path)
    return read_mlflow_db_run(path, _only_run(path, mlflow_db_runs(path), "MLflow store"))


def _only_run(path: Path, runs: list[tuple[str, str, str]], what: str) -> str:
    if len(runs) != 1:
        raise UsageError(
            f"{path}: the {what} holds {len(runs)} runs" + (f": {', '.join(n for _, n, _ in runs)}" if runs else ""),
            hint="scan it (one result per run) and pick one with --run NAME",
        )
    return runs[0][0]


# The file store.


def read_meta(path: Path) -> dict[str, str]:
    """The top-level ``key: value`` lines of an MLflow ``meta.yaml`` (flat, as MLflow writes it); {} when unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        found = _META_LINE.fullmatch(line)
        if found:
            value = found.group("value").strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[found.group("key")] = value
    return out


def looks_like_file_store(path: Path) -> bool:
    """An experiment's ``meta.yaml`` in a file store (``<store>/<experiment id>/meta.yaml``)."""
    if path.name != "meta.yaml":
        return False
    meta = read_meta(path)
    return "experiment_id" in meta and "lifecycle_stage" in meta and "run_id" not in meta


def store_root(meta: Path) -> Path:
    """The directory that holds the store (``mlruns``'s parent): file store runs are named ``<store>/<run>``."""
    return meta.parent.parent.parent


def file_store_runs(meta: Path) -> list[tuple[str, str, str]]:
    """``(run id, name, run name)`` of the live runs of the experiment whose ``meta.yaml`` this is (names made
    unique across the whole store)."""
    store = meta.parent.parent
    runs: list[StoreRun] = []
    mine: set[str] = set()
    for exp_meta in sorted(store.glob("*/meta.yaml")):
        experiment = read_meta(exp_meta)
        if "experiment_id" not in experiment or experiment.get("lifecycle_stage") == DELETED:
            continue
        for run_meta in sorted(exp_meta.parent.glob("*/meta.yaml")):
            info = read_meta(run_meta)
            if "run_id" not in info or info.get("lifecycle_stage") == DELETED:
                continue
            name = info.get("run_name") or _tag(run_meta.parent, "mlflow.runName") or info["run_id"]
            runs.append(StoreRun(run_meta.parent.name, experiment.get("name", exp_meta.parent.name), name))
            if exp_meta.parent == meta.parent:
                mine.add(run_meta.parent.name)
    return [run for run in unique_names(runs) if run[0] in mine]


def _tag(run_dir: Path, name: str) -> str | None:
    try:
        return (run_dir / "tags" / name).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def read_file_store_run(meta: str | Path, run_id: str) -> EventFileRead:
    """The metrics of one run of the experiment whose ``meta.yaml`` this is (``<run id>/metrics/<key...>``)."""
    meta = Path(meta)
    metrics = meta.parent / run_id / "metrics"
    if not (meta.parent / run_id / "meta.yaml").is_file():
        raise InputError(f"{meta.parent / run_id}: no such MLflow run in the file store")
    points: list[tuple[int, int, str, float]] = []
    for file in sorted(p for p in metrics.rglob("*") if p.is_file()) if metrics.is_dir() else []:
        key = file.relative_to(metrics).as_posix()
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"{file}: cannot read file ({exc.strerror or exc})") from exc
        lines = text.split("\n")[:-1]  # a last line without its newline is still being written
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                timestamp, value = int(parts[0]), float(parts[1])
                step = int(parts[2]) if len(parts) > 2 else 0
            except (IndexError, ValueError) as exc:
                raise InputError(
                    f"{file}: line {number} is not '<timestamp> <value> <step>': {line[:80]!r}",
                    hint="the MLflow file store is damaged; copy the run again",
                ) from exc
            points.append((timestamp, step, key, value))
    return _read(meta, points)


def read_file_store(meta: str | Path, *, start: int = 0) -> EventFileRead:
    """The metrics of an experiment that holds one run (several need a name: :func:`read_file_store_run`)."""
    meta = Path(meta)
    return read_file_store_run(meta, _only_run(meta, file_store_runs(meta), "MLflow experiment"))
