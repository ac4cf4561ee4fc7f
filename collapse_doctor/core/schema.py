"""The canonical rollout table: column discovery, validation and the per-step batch.

One row per sampled completion (see docs/input-formats.md):

=====================  ==========================================================
``step``               training step that produced the rollout (integer)
``group_id``           rollouts of one prompt in one step (int or string)
``reward/<channel>``   one column per reward channel, NaN = not applicable
``advantage``          the advantage the trainer used (optional)
``prompt``             prompt text (optional; also used to rebuild groups)
``completion``         completion text (optional)
``completion_length``  completion length in tokens (optional)
``truncated``          the completion was cut at the length cap (bool, optional)
=====================  ==========================================================

Reward channels are also found as ``reward_<channel>`` columns, as fields of a ``rewards`` struct
column, or as flattened ``rewards.<channel>`` columns. Readers turn every input into this layout at
the edge; nothing downstream knows which file or framework produced a row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from collapse_doctor.core import json_text
from collapse_doctor.core.errors import SchemaError, UsageError
from collapse_doctor.core.estimators import ALGORITHMS
from collapse_doctor.core.series import CUT_AT_CAP, CUT_BY_FLAG

STEP = "step"
GROUP_ID = "group_id"
ADVANTAGE = "advantage"
AGGREGATION = "aggregation"
ACTIVE_CHANNELS = "active_channels"
"""The per-rollout column of the channels a step trained with (``collapse-doctor retrain``'s ``channel_start``: a
comma-separated list); the others had weight 0 there."""
"""Optional per-row column: the aggregation the trainer used at the row's step (``grpo``, ``gdpo``,
``gdpo-dynamic``; collapse-doctor retrain writes it). A run whose steps change it (a hybrid GRPO -> GDPO switch)
is judged phase by phase, each under its own aggregation."""
PROMPT = "prompt"
COMPLETION = "completion"
COMPLETION_LENGTH = "completion_length"
TRUNCATED = "truncated"
"""Optional per-row column: whether the completion ended at the length cap without its end-of-sequence token (the
TRL callback writes it; a trainer's own flag under this name is read the same way)."""
REWARD_PREFIXES: tuple[str, ...] = ("reward/", "reward_", "rewards.")
REWARD_STRUCT = "rewards"
WEIGHTS_METADATA_KEY = "collapse_doctor.weights"
UNCHECKED_ADVANTAGE = "advantage_with_kl"
"""Where a writer keeps advantages that no estimator can recompute from the rows (TRL RLOOTrainer's KL penalty in
the reward): kept for the user, never read as ``advantage``, and a scan says why it compares none."""
ALGO_METADATA_KEY = "collapse_doctor.retrain.algo"
"""The aggregation or estimator the writer trained with (``CollapseDoctorCallback``, ``retrain``), in a Parquet
file's key-value metadata: :func:`metadata_algorithm`."""
GROUND_TRUTH_METADATA_KEY = "collapse_doctor.ground_truth"
DYNAMIC_WEIGHTS_SOURCE = "dynamic channel weights"
"""How a run summary's ``algorithm_source`` starts when the rollouts carry ``weight/<channel>`` columns."""


def channel_column(channel: str) -> str:
    """Canonical column name of a reward channel.

    >>> channel_column("format")
    'reward/format'
    """
    return f"reward/{channel}"


@dataclass(frozen=True)
class RewardColumn:
    """Where one reward channel lives in a file: a top-level column or a field of a struct column."""

    channel: str
    column: str
    struct_field: str | None = None

    @property
    def label(self) -> str:
        return f"{self.column}.{self.struct_field}" if self.struct_field else self.column


@dataclass(frozen=True)
class ColumnMap:
    """Which column of the input plays which canonical role."""

    step: str
    group: str | None
    rewards: tuple[RewardColumn, ...]
    advantage: str | None = None
    prompt: str | None = None
    completion: str | None = None
    completion_length: str | None = None
    truncated: str | None = None
    group_size: int | None = None
    length_cap: int | None = None
    """The generation length cap in tokens (``--max-completion-length``): without a ``truncated`` column, a row whose
    ``completion_length`` reaches it was cut."""

    @property
    def cut_rule(self) -> float | None:
        """How the rows' cut flags are told (:data:`~collapse_doctor.core.series.CUT_BY_FLAG` from the ``truncated``
        column, :data:`~collapse_doctor.core.series.CUT_AT_CAP` from the token lengths and the cap); None: they are
        not (the engine may still take each step's longest rows, :data:`CUT_AT_STEP_MAX`)."""
        if self.truncated:
            return CUT_BY_FLAG
        if self.completion_length and self.length_cap:
            return CUT_AT_CAP
        return None

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(r.channel for r in self.rewards)

    @property
    def source_columns(self) -> list[str]:
        """Top-level columns to read, each once, in a stable order."""
        names = [self.step, self.group, *(r.column for r in self.rewards)]
        names += [self.advantage, self.prompt, self.completion, self.completion_length, self.truncated]
        return list(dict.fromkeys(n for n in names if n))


def _is_numeric(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_decimal(dtype)
    )


def _strip_prefix(name: str) -> str | None:
    for prefix in REWARD_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return None


def discover_reward_name(name: str) -> bool:
    """Whether column discovery takes a column of this name for a reward (``reward/x``, ``reward_x``, ...)."""
    return name == REWARD_STRUCT or _strip_prefix(name) is not None


def _describe(schema: pa.Schema) -> str:
    names = list(schema.names)
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return f"[{shown}]"


def _reward_from_name(schema: pa.Schema, name: str, source: str) -> list[RewardColumn]:
    """Resolve one ``--reward-cols`` entry: a column, a struct column, or ``struct.field``."""
    if name in schema.names:
        dtype = schema.field(name).type
        if pa.types.is_struct(dtype):
            return [RewardColumn(f.name, name, f.name) for f in dtype]
        return [RewardColumn(_strip_prefix(name) or name, name)]
    head, _, tail = name.partition(".")
    if tail and head in schema.names and pa.types.is_struct(schema.field(head).type):
        struct = schema.field(head).type
        if struct.get_field_index(tail) >= 0:
            return [RewardColumn(tail, head, tail)]
    raise SchemaError(
        f"{source}: reward column {name!r} (from --reward-cols) not found; found columns: {_describe(schema)}",
        hint="pass the exact column names, comma-separated",
    )


def _discover_rewards(schema: pa.Schema, source: str) -> list[RewardColumn]:
    found: list[RewardColumn] = []
    for f in schema:
        if f.name == REWARD_STRUCT and pa.types.is_struct(f.type):
            found.extend(RewardColumn(sub.name, f.name, sub.name) for sub in f.type)
            continue
        channel = _strip_prefix(f.name)
        if channel is not None:
            found.append(RewardColumn(channel, f.name))
        elif f.name in REWARD_PREFIXES:
            raise SchemaError(
                f"{source}: column {f.name!r} looks like a reward column but has an empty channel name",
                hint=f"rename it {f.name}<channel>, or pick the reward columns with --reward-cols",
            )
    return found


def _check_reward_types(schema: pa.Schema, rewards: Sequence[RewardColumn], source: str) -> None:
    for r in rewards:
        dtype = schema.field(r.column).type
        if r.struct_field is not None:
            dtype = dtype.field(r.struct_field).type
        if not _is_numeric(dtype) and not pa.types.is_null(dtype):
            raise SchemaError(
                f"{source}: reward column {r.label!r} has type {dtype}, expected numbers",
                hint="rewards must be int, float or bool; pick other columns with --reward-cols",
            )


def discover_columns(
    schema: pa.Schema,
    *,
    source: str,
    step_col: str | None = None,
    group_col: str | None = None,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
) -> ColumnMap:
    """Map a file's columns onto the canonical table, raising :class:`SchemaError` with a hint.

    >>> s = pa.schema([("step", pa.int64()), ("group_id", pa.string()), ("reward/format", pa.float32())])
    >>> discover_columns(s, source="run.parquet").channels
    ('format',)
    """
    step = step_col or STEP
    if step not in schema.names:
        raise SchemaError(
            f"{source}: expected column {step!r}; found columns: {_describe(schema)}",
            hint="pass --step-col NAME",
        )
    repeated = {name: k for name, k in Counter(schema.names).items() if k > 1}
    _check_unique(repeated, [step], source)
    step_type = schema.field(step).type
    if not (pa.types.is_integer(step_type) or pa.types.is_floating(step_type)):
        raise SchemaError(
            f"{source}: step column {step!r} has type {step_type}, expected integers",
            hint="pass --step-col with the column that holds the training step",
        )

    if group_col is not None and group_col not in schema.names:
        raise SchemaError(
            f"{source}: group column {group_col!r} (from --group-col) not found; found columns: {_describe(schema)}",
            hint="pass the exact column name",
        )
    group = group_col or (GROUP_ID if GROUP_ID in schema.names else None)
    if group_size is not None and group_size < 1:
        raise UsageError(f"--group-size {group_size} must be at least 1")
    # An explicit --group-size means "consecutive blocks", so it wins over a discovered group column.
    if group_size is not None and group_col is None:
        group = None

    if reward_cols:
        rewards: list[RewardColumn] = []
        for name in reward_cols:
            _check_unique(repeated, [name], source)
            rewards.extend(_reward_from_name(schema, name, source))
    else:
        rewards = _discover_rewards(schema, source)
    if not rewards:
        raise SchemaError(
            f"{source}: no reward column found (looked for 'reward/<channel>', 'reward_<channel>', "
            f"'rewards.<channel>' and a 'rewards' struct); found columns: {_describe(schema)}",
            hint="pass --reward-cols a,b,c",
        )
    _check_unique(repeated, [group, *(r.column for r in rewards)], source)
    taken = {step: "step", group: "group"} if group else {step: "step"}
    clash = next((r for r in rewards if r.column in taken and r.struct_field is None), None)
    if clash is not None:
        raise UsageError(
            f"{source}: --reward-cols names {clash.column!r}, the run's {taken[clash.column]} column",
            hint="a column is either the step, the group or a reward; pass the reward columns only",
        )
    channels = [r.channel for r in rewards]
    duplicates = sorted({c for c in channels if channels.count(c) > 1})
    if duplicates:
        raise SchemaError(
            f"{source}: reward channel name(s) {duplicates} come from more than one column",
            hint="choose one column per channel with --reward-cols",
        )
    _check_reward_types(schema, rewards, source)

    def optional(name: str) -> str | None:
        if name not in schema.names:
            return None
        _check_unique(repeated, [name], source)
        return name

    prompt = optional(PROMPT)
    if group is None and group_size is None and prompt is None:
        raise SchemaError(
            f"{source}: cannot tell which rollouts belong to one group: no {GROUP_ID!r} column, no "
            f"{PROMPT!r} column; found columns: {_describe(schema)}",
            hint="pass --group-col NAME, or --group-size N for consecutive blocks of N rollouts",
        )
    advantage = optional(ADVANTAGE)
    if advantage is not None and not _is_numeric(schema.field(advantage).type):
        advantage = None
    truncated = optional(TRUNCATED)
    return ColumnMap(
        step=step,
        group=group,
        rewards=tuple(rewards),
        advantage=advantage,
        prompt=prompt,
        completion=optional(COMPLETION),
        completion_length=optional(COMPLETION_LENGTH),
        truncated=truncated if truncated is not None and _is_numeric(schema.field(truncated).type) else None,
        group_size=group_size,
    )


def _check_unique(repeated: Mapping[str, int], names: Iterable[str | None], source: str) -> None:
    """A column that is read must be the only one of its name: two ``step`` columns (a join that kept both) cannot
    be told apart, and no option can pick one of them."""
    name = next((n for n in names if n is not None and n in repeated), None)
    if name is not None:
        raise SchemaError(
            f"{source}: column {name!r} appears {repeated[name]} times, so it cannot be read",
            hint="give each column a name of its own when writing the table (pyarrow: Table.rename_columns)",
        )


def check_same_layout(schema: pa.Schema, columns: ColumnMap, *, source: str) -> None:
    """Check that another file of the same run has the columns the first file had."""
    missing = [c for c in columns.source_columns if c not in schema.names]
    if missing:
        raise SchemaError(
            f"{source}: missing column(s) {missing} that the run's first file has; found columns: {_describe(schema)}",
            hint="scan files of one run together, or pass matching --*-col options",
        )
    _check_unique({n: k for n, k in Counter(schema.names).items() if k > 1}, columns.source_columns, source)
    _check_reward_types(schema, columns.rewards, source)


def unified_types(schemas: Sequence[pa.Schema], columns: ColumnMap, sources: Sequence[str]) -> dict[str, pa.DataType]:
    """The type each column is read as, for the columns whose type differs between the files of a run.

    Numbers of different types (an int64 reward in one file, a double in the next) are read as float64, text of
    different encodings as string; anything else (an integer group id in one file, a string in another) is a
    SchemaError naming the file, the column and both types.

    >>> a = pa.schema([("step", pa.int64()), ("group_id", pa.int64()), ("reward/x", pa.int64())])
    >>> b = pa.schema([("step", pa.int64()), ("group_id", pa.int64()), ("reward/x", pa.float64())])
    >>> unified_types([a, b], discover_columns(a, source="a"), ["a", "b"])
    {'reward/x': DataType(double)}
    """
    out: dict[str, pa.DataType] = {}
    first = schemas[0]
    for name in columns.source_columns:
        want = first.field(name).type
        for schema, source in zip(schemas[1:], sources[1:], strict=True):
            have = schema.field(name).type
            if have == want:
                continue
            if _is_numeric(have) and _is_numeric(want):
                out[name] = pa.float64()
            elif _is_text(have) and _is_text(want):
                out[name] = pa.string()
            else:
                raise SchemaError(
                    f"{source}: column {name!r} has type {have} here but {want} in the run's first file ({sources[0]})",
                    hint="write every file of a run with the same schema, or scan the files separately",
                )
    return out


def _is_text(dtype: pa.DataType) -> bool:
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))


def parse_weights(text: str | None) -> dict[str, float]:
    """Parse ``--weights format=1,correct=0.5``.

    >>> parse_weights("format=1, correct=0.5")
    {'format': 1.0, 'correct': 0.5}
    """
    if not text:
        return {}
    weights: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not name.strip() or not math.isfinite(number):
            raise UsageError(
                f"--weights: cannot read {item!r}", hint="use name=number pairs, e.g. format=1,correct=0.5"
            )
        weights[name.strip()] = number
    return weights


def metadata_algorithm(metadata: Mapping[bytes, bytes] | None) -> tuple[str, str] | None:
    """``(algorithm, how it is known)`` where a Parquet file's metadata names an estimator of the catalogue (the
    callback under TRL's RLOOTrainer writes ``rloo``), else ``None``. A declaration, used only where no logged
    advantage can decide (:func:`collapse_doctor.judge.algorithm.detect_algorithm`).

    >>> metadata_algorithm({ALGO_METADATA_KEY.encode(): b"rloo"})
    ('rloo', "the rollouts' metadata (collapse_doctor.retrain.algo: rloo), with no logged advantages to check it")
    >>> metadata_algorithm({ALGO_METADATA_KEY.encode(): b"gdpo-dynamic"}) is None
    True
    """
    raw = (metadata or {}).get(ALGO_METADATA_KEY.encode())
    name = raw.decode("utf-8", errors="replace") if raw is not None else None
    if name not in ALGORITHMS:
        return None
    return name, f"the rollouts' metadata ({ALGO_METADATA_KEY}: {name}), with no logged advantages to check it"


def metadata_weights(metadata: Mapping[bytes, bytes] | None, *, source: str) -> dict[str, float]:
    """Weights stored in a Parquet file's key-value metadata under ``collapse_doctor.weights``."""
    raw = (metadata or {}).get(WEIGHTS_METADATA_KEY.encode())
    if raw is None:
        return {}
    try:
        data = json_text.loads(raw)
        weights = {str(k): float(v) for k, v in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise SchemaError(
            f"{source}: metadata {WEIGHTS_METADATA_KEY!r} is not a JSON object of numbers ({exc})",
            hint="fix the metadata or pass --weights",
        ) from exc
    bad = next(((k, v) for k, v in weights.items() if not math.isfinite(v)), None)
    if bad is not None:
        raise SchemaError(
            f"{source}: metadata {WEIGHTS_METADATA_KEY!r} gives channel {bad[0]!r} the weight {bad[1]}",
            hint="weights must be finite numbers; fix the metadata or pass --weights",
        )
    return weights


def resolve_weights(channels: Sequence[str], cli: Mapping[str, float], stored: Mapping[str, float]) -> dict[str, float]:
    """Channel weights: ``--weights`` first, then the file's metadata, then 1.0.

    >>> resolve_weights(["format", "correct"], {"correct": 0.5}, {"format": 2.0})
    {'format': 2.0, 'correct': 0.5}
    """
    unknown = [name for name in cli if name not in channels]
    if unknown:
        raise UsageError(
            f"--weights names unknown channel(s) {unknown}; the run's channels are {list(channels)}",
            hint="use the channel names shown by the reward columns",
        )
    weights = {c: float(cli.get(c, stored.get(c, 1.0))) for c in channels}
    if weights and all(w == 0 for w in weights.values()):
        shown = ", ".join(f"{c}=0" for c in channels)
        raise UsageError(
            f"every channel weight is 0 ({shown}): the weighted reward is constant, so nothing can be judged",
            hint="give at least one channel a non-zero weight (--weights name=w)",
        )
    return weights


@dataclass
class RolloutBatch:
    """The rollouts of one training step, in the canonical layout, ready for the advantage engine."""

    step: int
    rewards: np.ndarray
    """``[N, C]`` float32, NaN where a reward does not apply."""
    group_index: np.ndarray
    """``[N]`` int64 dense group ids ``0..num_groups-1`` (order of first appearance)."""
    num_groups: int
    row_ids: np.ndarray
    """``[N]`` int64 position of each row in the whole input (files concatenated in order)."""
    group_keys: pa.Array
    """``[N]`` the group id of each row as it was in the input (or the rebuilt block number)."""
    advantage: np.ndarray | None = None
    """``[N]`` float32 advantage the trainer logged, if the input has one."""
    extra: pa.Table | None = None
    """Optional columns carried along (prompt, completion, completion_length)."""
    completion_codes: np.ndarray | None = None
    """``[N]`` int64 completion identity: equal codes, equal completion text (-1: a null text, a value of its own);
    codes ``0..K-1`` of this step. None when the input has no completion column."""
    completion_lengths: np.ndarray | None = None
    """``[N]`` float64 completion length: the ``completion_length`` column (tokens) where there is one, else the
    text's length in characters; NaN where unknown. None when the input has neither."""
    completion_cut: np.ndarray | None = None
    """``[N]`` float64 1.0 where the completion was cut at the length cap, 0.0 where it ended on its own, NaN where
    unknown: the ``truncated`` column, else the token lengths against ``--max-completion-length``. None without
    either."""
    completion_cut_rule: float = CUT_BY_FLAG
    completion_tokens: bool = False
    """Whether ``completion_lengths`` count tokens (a ``completion_length`` column), not a text's characters."""
    """How :attr:`completion_cut` was told (``cut_rule`` values of :mod:`collapse_doctor.core.series`)."""

    @property
    def num_rows(self) -> int:
        return int(self.rewards.shape[0])

    def group_sizes(self) -> np.ndarray:
        return np.bincount(self.group_index, minlength=self.num_groups)
