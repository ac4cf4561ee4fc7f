"""TRL ``GRPOTrainer`` completions: ``<output_dir>/completions/completions_<step>.parquet``.

With ``log_completions=True`` TRL writes, per logging step, a table with ``step``, ``prompt``,
``completion``, one column per reward function (named after the function, no prefix), any extra logged
columns and ``advantage``. There is no group id: the ``num_generations`` completions of one prompt are
consecutive rows with the same prompt, so groups are rebuilt as such blocks (``--group-size N`` cuts fixed
blocks instead). Reward columns are the numeric columns other than the known ones; ``--reward-cols``
picks them explicitly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collapse_doctor.core.errors import InputError, SchemaError
from collapse_doctor.core.schema import channel_column
from collapse_doctor.io.rollouts.parquet import open_parquet
from collapse_doctor.io.rollouts.table_run import TableRun, consecutive_groups
from collapse_doctor.io.storage.remote import prefetch

NOT_REWARDS = frozenset({"step", "advantage", "completion_length", "truncated", "num_tokens", "epoch", "group_id"})
FILE_NAME = re.compile(r"completions_(\d+)\.parquet")
"""TRL's file name, ``completions_<step>.parquet``."""


def _text(column: pa.ChunkedArray, null: str | None = "") -> list[str | None]:
    """Texts of a column (JSON for chat messages); a null becomes ``null`` (prompts: "", completions: None, which is
    "not logged", never a text of its own)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [v if v is not None else null for v in column.to_pylist()]
    return [json.dumps(v, sort_keys=True, default=str) if v is not None else null for v in column.to_pylist()]


def _numeric(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype))


def open_trl_completions(
    files: Sequence[Path],
    *,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    **_: object,
) -> TableRun:
    """Read TRL completions tables into one canonical run."""
    tables = []
    ordered = sorted(files, key=lambda p: (int(m.group(1)) if (m := FILE_NAME.fullmatch(p.name)) else -1, p))
    with prefetch(ordered) as fetched:  # objects in storage: one GET each, concurrently, parsed as they arrive
        for path in ordered:
            try:
                table = open_parquet(path, fetched(path)).read()
            except (pa.ArrowException, OSError) as exc:
                raise InputError(
                    f"{path}: cannot read data ({' '.join(str(exc).split())[:200]})",
                    hint="the file may be truncated or corrupt; if TRL is still writing it, wait for it to be closed",
                ) from exc
            if "step" not in table.column_names:
                found = FILE_NAME.fullmatch(path.name)
                step = int(found.group(1)) if found else 0
                table = table.append_column("step", pa.array(np.full(table.num_rows, step, dtype=np.int64)))
            tables.append(table)
    return completions_run(
        tables, label=files[0].parent, sources=files, reward_cols=reward_cols, group_size=group_size, weights=weights
    )


def completions_run(
    tables: Sequence[pa.Table],
    *,
    label: Path,
    sources: Sequence[Path],
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    stored_weights: dict[str, float] | None = None,
    compare_advantages: bool = True,
) -> TableRun:
    """TRL's completions tables (one per logging step, each with a ``step`` column) as one canonical run.

    The same table reaches a tracker too (W&B, Trackio: :mod:`collapse_doctor.io.rollouts.tracker_tables`), so both
    read it here. ``stored_weights``: the run's ``reward_weights`` by reward column, where its config says them.
    ``compare_advantages=False``: the ``advantage`` column holds a term no estimator can recompute from the rows
    (TRL RLOO's KL penalty), so it is not read."""
    digests: dict[int, str] = {}
    for table in tables:
        digests.update(_step_digest(table))
    table = pa.concat_tables(tables, promote_options="permissive")
    if reward_cols:
        missing = [c for c in reward_cols if c not in table.column_names]
        if missing:
            raise SchemaError(
                f"{label}: reward column(s) {missing} (from --reward-cols) not found; "
                f"found columns: {table.column_names}",
                hint="pass the reward function names as they appear in the completions tables",
            )
        rewards = list(reward_cols)
    else:
        rewards = [
            f.name
            for f in table.schema
            if _numeric(f.type) and f.name not in NOT_REWARDS and not f.name.startswith(("reward/", "adv/"))
        ]
    if not rewards:
        raise SchemaError(
            f"{label}: no reward column in the TRL completions tables; found columns: {table.column_names}",
            hint="pass --reward-cols with the reward function names",
        )
    try:
        step_column = pc.cast(table.column("step"), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(
            f"{label}: step column 'step' holds values that are not whole numbers ({' '.join(str(exc).split())[:160]})",
            hint="TRL writes the step as a number (or a numeric string); fix the column, or remove it to take the "
            "step from the file name completions_<step>.parquet",
        ) from exc
    columns: dict[str, pa.Array | pa.ChunkedArray] = {"step": step_column}
    prompts = [t or "" for t in _text(table.column("prompt"))] if "prompt" in table.column_names else None
    if prompts is not None and group_size is None:
        steps = columns["step"].to_numpy()
        ids = np.zeros(len(steps), dtype=np.int64)
        for step in np.unique(steps):
            rows = np.flatnonzero(steps == step)
            ids[rows] = consecutive_groups([prompts[i] for i in rows])
        columns["group_id"] = pa.array(ids)
    for name in rewards:
        try:
            columns[channel_column(name)] = pc.cast(table.column(name), pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(
                f"{label}: reward column {name!r} has type {table.schema.field(name).type}, expected numbers",
                hint="pass --reward-cols with the numeric reward columns",
            ) from exc
    if prompts is not None:
        columns["prompt"] = pa.array(prompts)
    if "completion" in table.column_names:
        columns["completion"] = pa.array(_text(table.column("completion"), null=None))
    if compare_advantages and "advantage" in table.column_names and _numeric(table.schema.field("advantage").type):
        columns["advantage"] = pc.cast(table.column("advantage"), pa.float64())
    stored = {name: stored_weights[name] for name in rewards if name in stored_weights} if stored_weights else None
    run = TableRun(
        pa.table(columns),
        label=label,
        sources=sources,
        group_size=group_size,
        weights=weights,
        stored_weights=stored if stored and len(stored) == len(rewards) else None,
    )
    run.step_digests = digests
    return run


def _step_digest(table: pa.Table) -> dict[int, str]:
    """``{step: digest}`` of a completions table that holds one step: a hash of every column but ``step``, so a
    table TRL logs again at a later step for the same generation batch (``num_iterations`` or
    ``steps_per_generation`` above 1: the same rows, another step number) has the same digest."""
    try:
        steps = pc.unique(pc.cast(table.column("step"), pa.int64())).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return {}
    if len(steps) != 1 or steps[0] is None:
        return {}
    import hashlib

    rest = table.drop_columns(["step"]).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rest.schema) as writer:
        writer.write_table(rest)
    return {int(steps[0]): hashlib.blake2b(sink.getvalue().to_pybytes(), digest_size=16).hexdigest()}
