"""TRL's completions table as a tracker keeps it: W&B run directories and Trackio project databases.

With ``log_completions=True``, TRL's ``GRPOTrainer`` and ``RLOOTrainer`` log, at every logging step, one table under
the key ``completions`` to each tracker of ``report_to`` (W&B, Trackio): ``step``, ``prompt``, ``completion``, one
column per reward function, any ``log_extra`` columns and ``advantage`` (TRL 1.16's ``log``). ``RLOOTrainer`` writes
no Parquet, so for an RLOO run the tracker's table is where its rollouts are; ``GRPOTrainer`` writes the same rows
to ``completions/completions_<step>.parquet`` too (read from there when present: a run has one rollout source).

Where the table is:

- **W&B**: ``<run dir>/files/media/table/completions_<W&B step>_<content hash>.table.json``, a JSON object with
  ``columns`` and ``data`` (one list per row; NaN written bare, which Python's JSON reads).
- **Trackio**: a ``metrics`` row of the run holding ``{"completions": {"_type": "trackio.table", "_value": [...]}}``,
  one object per row, NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

What a table holds: TRL keeps the rows of the last generation batch (a deque of ``generation_batch_size`` rows)
and logs them with ``step`` = the global step of the log call. A table identical to one logged before (the same
batch logged again: TRL's last ``log`` at the end of training, or log calls between two generations) is read once;
the same rows under a later step (``steps_per_generation`` or ``num_iterations`` above 1) are one generation, as
for TRL's Parquet files (``core.reduction.without_reused_steps``). With ``logging_steps`` above 1 only the batch of
every logged step is there: the steps between are not in the table.

The run's config (W&B's config records in ``run-<id>.wandb``, Trackio's ``configs`` table: every
``TrainingArguments`` field) says what the rows cannot:

- ``reward_weights``: the channels' weights (as a Parquet file's stored weights);
- ``RLOOTrainer`` (its config has ``normalize_advantages``) with ``beta != 0`` (TRL's default 0.05): TRL subtracts
  ``beta`` times each completion's KL from its reward before the leave-one-out baseline, and the table has no KL,
  so the advantages are not compared (as ``CollapseDoctorCallback`` keeps them as ``advantage_with_kl``); without a
  config the trainer and its ``beta`` are unknown, and the advantages are not compared either. ``GRPOTrainer``
  (``scale_rewards`` in the config) keeps its KL in the loss: its advantages are compared;
- ``log_unique_prompts=True``: one completion per prompt, no group to recompute: an error saying so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import InputError
from collapse_doctor.io.logs import trackio_db, wandb_log
from collapse_doctor.io.rollouts.table_run import TableRun
from collapse_doctor.io.rollouts.trl import completions_run
from collapse_doctor.io.storage.remote import RemotePath

TABLE_KEY = "completions"
"""The key TRL logs its completions table under."""
WANDB_TABLE = re.compile(r"completions_(?P<step>\d+)_(?P<digest>[0-9a-f]+)\.table\.json")
"""W&B's file name for a logged table: the key, the W&B step of the ``log`` call, a hash of the content."""
WANDB_TABLE_DIR = ("files", "media", "table")


TRL_COLUMNS = ("step", "prompt", "completion", "advantage")
"""Columns every TRL completions table has (besides one per reward function)."""
HEAD_BYTES = 65_536
"""What recognition reads of a W&B table file: its ``columns`` come first."""
_COLUMNS = re.compile(rb'^\s*\{\s*"columns"\s*:\s*(\[[^\]]*\])')


def is_wandb_table(path: Path) -> bool:
    """A TRL completions table file in a W&B run directory: the name W&B gives a table logged under
    ``completions``, in ``files/media/table/``, whose columns are TRL's (another table of that name, a user's own,
    is not read as rollouts). Reads the file's first bytes; never raises.

    >>> is_wandb_table(Path("tables/completions_10_b5c9.table.json"))
    False
    """
    if not (WANDB_TABLE.fullmatch(path.name) and path.parent.parts[-3:] == WANDB_TABLE_DIR):
        return False
    try:
        with path.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
        found = _COLUMNS.match(head)
        columns = json_text.loads(found.group(1)) if found else []
    except (OSError, ValueError):
        return False
    return _trl_columns(columns)


def has_trackio_table(path: Path, run: str) -> bool:
    """Whether a run of a Trackio database logged a TRL completions table (its first one has TRL's columns)."""
    try:
        tables = trackio_db.logged_tables(path, run, TABLE_KEY, first=True)
    except InputError:
        return False  # reading the run's scalars names the problem
    return bool(tables) and _trl_columns([k for row in tables[0] for k in row])


def _trl_columns(columns: Sequence[Any]) -> bool:
    return all(c in columns for c in TRL_COLUMNS) and len(set(columns)) > len(TRL_COLUMNS)


def wandb_run_dir(path: Path) -> Path:
    """The W&B run directory of a table file (``<run dir>/files/media/table/<file>``)."""
    return path.parents[3]


@dataclass(frozen=True)
class TrainerSettings:
    """What the run's config says of the rows (see the module docstring)."""

    trainer: str | None
    """``rloo`` (RLOOTrainer), ``grpo`` or ``gdpo`` (GRPOTrainer and its ``multi_objective_aggregation``), or
    ``None`` when the config does not say (or there is none)."""
    beta: float | None
    reward_weights: tuple[float, ...] | None
    unique_prompts: bool

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> TrainerSettings:
        """From a tracker's config.

        >>> TrainerSettings.of({"normalize_advantages": False, "beta": 0.05, "reward_weights": [1, 0.5]})
        TrainerSettings(trainer='rloo', beta=0.05, reward_weights=(1.0, 0.5), unique_prompts=False)
        >>> TrainerSettings.of({}).trainer is None
        True
        """
        trainer = "rloo" if "normalize_advantages" in config else "grpo" if "scale_rewards" in config else None
        if trainer == "grpo" and config.get("multi_objective_aggregation") == "normalize_then_sum":
            trainer = "gdpo"
        beta = config.get("beta")
        weights = config.get("reward_weights")
        return cls(
            trainer=trainer,
            beta=float(beta) if isinstance(beta, (int, float)) and not isinstance(beta, bool) else None,
            reward_weights=tuple(float(w) for w in weights)
            if isinstance(weights, list) and all(isinstance(w, (int, float)) for w in weights)
            else None,
            unique_prompts=config.get("log_unique_prompts") is True,
        )

    def unchecked_advantages(self) -> str | None:
        """Why the logged advantages cannot be compared with a recomputation from the rows, or ``None``."""
        if self.trainer == "rloo" and self.beta != 0.0:
            return (
                f"TRL RLOOTrainer with beta={self.beta:g}: its advantages include a KL penalty the completions table "
                "does not carry, so they are not compared (CD202 skipped); with beta=0 they are"
                if self.beta is not None
                else "TRL RLOOTrainer without a beta in its config: its advantages may include a KL penalty the "
                "completions table does not carry, so they are not compared (CD202 skipped)"
            )
        if self.trainer is None:
            return (
                "the run's config was not found (no TRL settings): whether its advantages include RLOO's KL penalty "
                "is unknown, so they are not compared (CD202 skipped)"
            )
        return None


def open_wandb_tables(
    files: Sequence[Path],
    *,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    **_: object,
) -> TableRun:
    """The completions tables of one W&B run directory as one canonical run."""
    ordered = sorted(files, key=lambda p: (int(m.group("step")) if (m := WANDB_TABLE.fullmatch(p.name)) else -1, p))
    rows: list[tuple[Path, list[dict[str, Any]]]] = []
    for path in ordered:
        rows.append((path, _wandb_rows(path)))
    root = wandb_run_dir(ordered[0])
    return _run(rows, _wandb_config(root), label=root, reward_cols=reward_cols, group_size=group_size, weights=weights)


def open_trackio_tables(
    path: Path,
    run: str,
    *,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    **_: object,
) -> TableRun:
    """The completions tables one run of a Trackio project database logged, as one canonical run."""
    tables = trackio_db.logged_tables(path, run, TABLE_KEY)
    if not tables:
        raise InputError(
            f"{path}: run {run!r} logged no {TABLE_KEY!r} table", hint="TRL logs it with log_completions=True"
        )
    return _run(
        [(path, rows) for rows in tables],
        trackio_db.run_config(path, run),
        label=path,
        reward_cols=reward_cols,
        group_size=group_size,
        weights=weights,
    )


def _wandb_rows(path: Path) -> list[dict[str, Any]]:
    try:
        document = json_text.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: cannot read the W&B table ({' '.join(str(exc).split())[:200]})",
            hint="the file may be cut off while wandb writes it; scan again once the run has synced it",
        ) from exc
    columns = document.get("columns") if isinstance(document, dict) else None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(columns, list) or not isinstance(data, list):
        raise InputError(
            f"{path}: not a W&B table (expected an object with 'columns' and 'data')",
            hint="pass the completions_*.table.json files wandb writes under files/media/table/",
        )
    names = [str(c) for c in columns]
    return [dict(zip(names, row, strict=False)) for row in data if isinstance(row, list)]


def _wandb_config(root: Path) -> dict[str, Any]:
    """The config of the W&B run in ``root``: its ``run-<id>.wandb`` (found by listing a local ``root``, else by the
    id that ends the directory's name, as W&B names it)."""
    found = [] if isinstance(root, RemotePath) else sorted(root.glob("run-*.wandb"))  # pathlib lists local dirs only
    run_file = found[0] if len(found) == 1 else root / f"run-{root.name.rsplit('-', 1)[-1]}.wandb"
    try:
        return wandb_log.run_config(run_file) if run_file.exists() else {}
    except InputError:
        return {}


def _run(
    logged: Sequence[tuple[Path, list[dict[str, Any]]]],
    config: Mapping[str, Any],
    *,
    label: Path,
    reward_cols: Sequence[str] | None,
    group_size: int | None,
    weights: dict[str, float] | None,
) -> TableRun:
    settings = TrainerSettings.of(config)
    if settings.unique_prompts:
        raise InputError(
            f"{label}: the completions table was logged with log_unique_prompts=True (one completion per prompt), so "
            "no group can be recomputed",
            hint="log_unique_prompts=False (TRL's default) or CollapseDoctorCallback keeps every completion; scan "
            "the tracker's scalars alone by naming its run file (run-<id>.wandb) or database",
        )
    tables: list[pa.Table] = []
    seen: set[str] = set()
    for _, rows in logged:
        if not rows:
            continue
        digest = json.dumps(rows, sort_keys=True, default=str)
        if digest in seen:
            continue  # the same batch logged again (TRL's last log at the end of training)
        seen.add(digest)
        tables.append(_arrow(rows))
    if not tables:
        raise InputError(f"{label}: the completions tables hold no rows", hint="point at a run that logged rollouts")
    reward_names = [n for n in tables[0].column_names if n not in ("step", "prompt", "completion", "advantage")]
    stored = dict(zip(reward_names, settings.reward_weights, strict=False)) if settings.reward_weights else None
    why = settings.unchecked_advantages()
    run = completions_run(
        tables,
        label=label,
        sources=sorted({p for p, _ in logged}),
        reward_cols=reward_cols,
        group_size=group_size,
        weights=weights,
        stored_weights=stored,
        compare_advantages=why is None,
    )
    if why is not None and any("advantage" in t.column_names for t in tables):
        run.notes.source_notes.append(why)
    if settings.trainer is not None:
        run.declared_algorithm = (
            settings.trainer,
            f"the run's config (TRL {'RLOOTrainer' if settings.trainer == 'rloo' else 'GRPOTrainer'}), with no "
            "logged advantages to check it",
        )
    return run


def _arrow(rows: list[dict[str, Any]]) -> pa.Table:
    """One logged table as Arrow: numbers stay numbers (None: null), chat messages and other objects become JSON
    text (sorted keys, as the TRL Parquet adapter writes them), so both layouts give the same prompts."""
    names = list(dict.fromkeys(k for row in rows for k in row))
    columns: dict[str, pa.Array] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
            if all(v is None or isinstance(v, int) for v in values):
                columns[name] = pa.array(values, type=pa.int64())
            else:
                columns[name] = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
        else:
            columns[name] = pa.array(
                [v if isinstance(v, str) or v is None else json.dumps(v, sort_keys=True, default=str) for v in values],
                type=pa.string(),
            )
    return pa.table(columns)
