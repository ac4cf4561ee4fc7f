"""Synthetic multi-reward GRPO runs with known ground truth.

Each scenario is a small generative model of what a GRPO trainer sees, not a painted curve:

* every step samples ``groups`` prompts; each prompt has a latent difficulty ``d ~ N(0, 1)`` shared by
  the ``group_size`` completions sampled for it;
* every completion has a latent quality ``q ~ N(0, 1)`` that all its channels load on (``shared``,
  so the latent correlation of two channels is the product of their loadings) plus one independent
  noise term per channel;
* channel ``k`` has a logit ``loc_k(t) - difficulty_k * d + spread_k * (shared_k * q + sqrt(1 -
  shared_k**2) * e_k)`` whose location follows a saturating learning curve in the training progress
  ``t = step / (steps - 1)``. A ``continuous`` channel's reward is ``sigmoid(logit)`` (a score in
  ``[0, 1]``), a ``binary`` channel's reward is a Bernoulli draw with that success probability;
* ``completion_length`` is log-normal around a length that grows during training, longer for harder
  prompts;
* ``advantage`` is what TRL's ``GRPOTrainer`` logs: ``total = sum_k weight_k * reward_k``, then the
  group z-score with ``ddof=1`` and ``+1e-4`` on the std (exactly 0 in a constant group).

The scenario-specific pathologies (a saturating ``format`` channel, rare outlier groups, collinear or
tie-prone channels) are parameters of that model, recorded in the file's ground truth.

Randomness is drawn per step from ``SeedSequence(seed, spawn_key=(step,))``, so a run is a pure
function of its options: chunking, row-group size and the machine do not change a single value.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.schema import GROUND_TRUTH_METADATA_KEY, WEIGHTS_METADATA_KEY
from collapse_doctor.io.storage.atomic import atomic_path

__all__ = [
    "GROUND_TRUTH_KEY",
    "SCENARIOS",
    "WEIGHTS_KEY",
    "SimulationSummary",
    "simulate_batches",
    "simulation_metadata",
    "write_simulation",
]

SCENARIOS: tuple[str, ...] = (
    "healthy",
    "single-reward",
    "saturating-format",
    "tied-sums",
    "collinear",
    "outlier-groups",
)
ONSET_SCENARIOS: tuple[str, ...] = ("saturating-format", "outlier-groups")
"""Scenarios whose pathology starts at a step that ``onset_step`` can move."""

WEIGHTS_KEY = WEIGHTS_METADATA_KEY.encode()
GROUND_TRUTH_KEY = GROUND_TRUTH_METADATA_KEY.encode()
MODEL_VERSION = 1
"""Bumped whenever the same options would produce different values."""

TRL_STD_EPS = 1e-4
MAX_ROWS_PER_STEP = 1 << 24
MAX_SEED = (1 << 63) - 1
_TARGET_CHUNK_ROWS = 1 << 19
_MAX_CHUNK_STEPS = 64
_DEFAULT_ONSET_FRACTION = 0.4

# saturating-format: the format pass probability climbs slowly, then over the last RAMP_FRACTION of
# the steps before the onset rises to a plateau where almost every group passes entirely.
_EARLY_PASS_RATE = 0.3
_RAMP_START_PASS_RATE = 0.5
_SATURATED_PASS_RATE = 0.993
_RAMP_FRACTION = 0.25
_EARLY_FORMAT_DIFFICULTY = 0.5

# outlier-groups: a reward model that now and then returns an extreme score for one completion.
_OUTLIER_GROUP_RATE = 0.1
_OUTLIER_MAGNITUDE = (6.0, 14.0)
_OUTLIER_POSITIVE_SHARE = 0.5

_BASE_LENGTH = (180.0, 320.0)
_LENGTH_DIFFICULTY = 0.3
_LENGTH_NOISE = 0.3
_LENGTH_BOUNDS = (8, 4096)

ChannelKind = Literal["binary", "continuous"]


@dataclass(frozen=True)
class _Channel:
    name: str
    kind: ChannelKind
    weight: float
    start: float
    """Logit location at step 0."""
    end: float
    """Logit location at the last step."""
    difficulty: float
    spread: float
    shared: float

    def params(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "weight": self.weight,
            "start_logit": self.start,
            "end_logit": self.end,
            "difficulty": self.difficulty,
            "spread": self.spread,
            "shared_loading": self.shared,
        }


@dataclass(frozen=True)
class _Scenario:
    channels: tuple[_Channel, ...]
    affected: tuple[str, ...]
    expected_codes: tuple[str, ...]
    onset: Literal["none", "start", "movable"]
    saturating: str | None = None
    outlier: str | None = None


def _cont(name: str, weight: float, start: float, end: float, *, shared: float = 0.35) -> _Channel:
    return _Channel(name, "continuous", weight, start, end, difficulty=0.6, spread=1.2, shared=shared)


def _binary(name: str, weight: float, start: float, end: float) -> _Channel:
    return _Channel(name, "binary", weight, start, end, difficulty=0.3, spread=0.3, shared=0.2)


_SCENARIO_SPECS: dict[str, _Scenario] = {
    "healthy": _Scenario(
        channels=(
            _cont("correct", 1.0, -0.4, 0.8),
            _cont("reasoning", 0.5, -0.2, 0.6),
            _cont("style", 0.5, 0.0, 0.5),
        ),
        affected=(),
        expected_codes=(),
        onset="none",
    ),
    "single-reward": _Scenario(
        channels=(_cont("correct", 1.0, -0.5, 0.9),),
        affected=(),
        expected_codes=(),
        onset="none",
    ),
    "saturating-format": _Scenario(
        channels=(
            # start/end/difficulty of `format` are replaced by the saturation schedule.
            _Channel("format", "binary", 1.0, 0.0, 0.0, difficulty=0.0, spread=0.0, shared=0.0),
            _cont("correct", 1.0, -0.5, 0.7),
        ),
        affected=("format",),
        expected_codes=("CD101",),
        onset="movable",
        saturating="format",
    ),
    "tied-sums": _Scenario(
        channels=(
            _binary("format", 1.0, -0.1, 0.1),
            _binary("correct", 1.0, -0.2, 0.15),
            _binary("reasoning", 1.0, 0.0, 0.1),
        ),
        affected=("format", "correct", "reasoning"),
        expected_codes=("CD301",),
        onset="start",
    ),
    "collinear": _Scenario(
        channels=(
            _cont("correct", 1.0, -0.4, 0.8, shared=0.955),
            _cont("verifier", 1.0, -0.3, 0.7, shared=0.955),
            _cont("style", 0.5, 0.0, 0.5, shared=0.0),
        ),
        affected=("correct", "verifier"),
        expected_codes=("CD401",),
        onset="start",
    ),
    "outlier-groups": _Scenario(
        channels=(
            _cont("correct", 1.0, -0.4, 0.8),
            _cont("style", 0.5, 0.0, 0.5),
            _cont("judge", 1.0, -0.2, 0.6),
        ),
        affected=("judge",),
        expected_codes=("CD201",),
        onset="movable",
        outlier="judge",
    ),
}


@dataclass(frozen=True)
class SimulationSummary:
    """What :func:`write_simulation` wrote."""

    path: Path
    rows: int
    steps: int
    channels: tuple[str, ...]
    ground_truth: dict[str, Any]


@dataclass(frozen=True)
class _Plan:
    scenario: str
    spec: _Scenario
    steps: int
    groups: int
    group_size: int
    seed: int
    onset_step: int | None

    @property
    def rows_per_step(self) -> int:
        return self.groups * self.group_size

    @property
    def ramp_start(self) -> int:
        assert self.onset_step is not None
        return self.onset_step - max(1, round(_RAMP_FRACTION * self.onset_step)) if self.onset_step else 0


# ---------------------------------------------------------------------------------------------------
# options


def _check_int(value: object, option: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{option} must be a whole number, got {value!r}", hint=f"pass e.g. {option} {minimum}")
    number = int(value)
    if number < minimum:
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise UsageError(f"{option} must be {bounds}, got {number}", hint=f"pass e.g. {option} {minimum}")
    if maximum is not None and number > maximum:
        raise UsageError(
            f"{option} must be between {minimum} and {maximum}, got {number}",
            hint=f"pass e.g. {option} {maximum}",
        )
    return number


def _plan(
    scenario: str, *, steps: object, groups: object, group_size: object, seed: object, onset_step: object
) -> _Plan:
    if scenario not in _SCENARIO_SPECS:
        raise UsageError(
            f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}",
            hint="run `collapse-doctor simulate --help` for what each scenario shows",
        )
    spec = _SCENARIO_SPECS[scenario]
    n_steps = _check_int(steps, "--steps", minimum=1)
    n_groups = _check_int(groups, "--groups", minimum=1)
    # A z-score with ddof=1 needs two samples; a group of one has no advantage at all.
    size = _check_int(group_size, "--group-size", minimum=2)
    if n_groups * size > MAX_ROWS_PER_STEP:
        raise UsageError(
            f"--groups {n_groups} x --group-size {size} = {n_groups * size} rows per step is more than "
            f"{MAX_ROWS_PER_STEP}",
            hint="use fewer groups per step and more --steps",
        )
    seed_value = _check_int(seed, "--seed", minimum=0, maximum=MAX_SEED)
    onset: int | None
    if onset_step is not None and spec.onset != "movable":
        raise UsageError(
            f"--onset-step does not apply to scenario {scenario!r}",
            hint=f"drop --onset-step; it moves the onset of {' and '.join(ONSET_SCENARIOS)} only",
        )
    if spec.onset == "none":
        onset = None
    elif spec.onset == "start":
        onset = 0
    elif onset_step is None:
        default = round(_DEFAULT_ONSET_FRACTION * n_steps) if scenario == "saturating-format" else 0
        onset = min(default, n_steps - 1)
    else:
        onset = _check_int(onset_step, "--onset-step", minimum=0, maximum=n_steps - 1)
    return _Plan(scenario, spec, n_steps, n_groups, size, seed_value, onset)


# ---------------------------------------------------------------------------------------------------
# the generative model


def _sigmoid(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    out = np.negative(x)
    np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _learning_curve(progress: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Fast early improvement that flattens out: 0 at the start, 1 at the end."""
    return (1.0 - np.exp(-3.0 * progress)) / (1.0 - math.exp(-3.0))


def _progress(plan: _Plan, step: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    return step.astype(np.float64) / max(plan.steps - 1, 1)


def _format_schedule(
    plan: _Plan, step: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Logit location and difficulty sensitivity of the saturating ``format`` channel per step."""
    assert plan.onset_step is not None
    onset, ramp_start = plan.onset_step, plan.ramp_start
    early, mid, high = _logit(_EARLY_PASS_RATE), _logit(_RAMP_START_PASS_RATE), _logit(_SATURATED_PASS_RATE)
    s = step.astype(np.float64)
    slow = early + (mid - early) * s / max(ramp_start, 1)
    ramp_pos = np.clip((s - ramp_start) / max(onset - ramp_start, 1), 0.0, 1.0)
    smooth = ramp_pos * ramp_pos * (3.0 - 2.0 * ramp_pos)
    loc = np.where(s < ramp_start, slow, mid + (high - mid) * smooth)
    loc = np.where(s >= onset, high, loc)
    # Hard prompts fail the format more often until the policy has learned it for every prompt.
    sensitivity = _EARLY_FORMAT_DIFFICULTY * np.clip(1.0 - s / max(onset, 1), 0.0, 1.0)
    return loc, sensitivity


def _step_rng(seed: int, step: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(step,))))


def _chunk_columns(plan: _Plan, first: int, last: int) -> dict[str, npt.NDArray[Any]]:
    spec = plan.spec
    n_steps, g, n = last - first, plan.groups, plan.group_size
    channels = spec.channels
    binary = [k for k, ch in enumerate(channels) if ch.kind == "binary"]

    difficulty = np.empty((n_steps, g), np.float32)
    # [steps, quality + length + one per channel, groups, group_size]
    normals = np.empty((n_steps, 2 + len(channels), g, n), np.float32)
    uniforms = np.empty((n_steps, len(binary), g, n), np.float32)
    group_uniforms = np.empty((n_steps, 4 if spec.outlier else 0, g), np.float64)
    for i in range(n_steps):
        rng = _step_rng(plan.seed, first + i)
        rng.standard_normal(out=difficulty[i], dtype=np.float32)
        rng.standard_normal(out=normals[i], dtype=np.float32)
        if binary:
            rng.random(out=uniforms[i], dtype=np.float32)
        if spec.outlier:
            rng.random(out=group_uniforms[i])

    step = np.arange(first, last, dtype=np.int64)
    curve = _learning_curve(_progress(plan, step))[:, None, None]
    prompt_difficulty = difficulty[:, :, None]
    quality = normals[:, 0]

    columns: dict[str, npt.NDArray[Any]] = {
        "step": np.repeat(step, g * n),
        "group_id": np.tile(np.repeat(np.arange(g, dtype=np.int64), n), n_steps),
    }
    rewards: dict[str, npt.NDArray[np.float32]] = {}
    for k, ch in enumerate(channels):
        if ch.name == spec.saturating:
            loc_steps, sensitivity = _format_schedule(plan, step)
            loc = loc_steps[:, None, None].astype(np.float32)
            diff_term = sensitivity[:, None, None].astype(np.float32) * prompt_difficulty
        else:
            loc = (ch.start + (ch.end - ch.start) * curve).astype(np.float32)
            diff_term = np.float32(ch.difficulty) * prompt_difficulty
        noise = np.float32(ch.shared) * quality + np.float32(math.sqrt(1.0 - ch.shared**2)) * normals[:, 2 + k]
        logit = loc - diff_term + np.float32(ch.spread) * noise
        prob = _sigmoid(logit)
        reward = (uniforms[:, binary.index(k)] < prob).astype(np.float32) if ch.kind == "binary" else prob
        if ch.name == spec.outlier:
            reward = _with_outliers(plan, step, reward, group_uniforms)
        rewards[ch.name] = reward

    columns.update({f"reward/{name}": r.reshape(-1) for name, r in rewards.items()})
    columns["completion_length"] = _completion_length(plan, step, prompt_difficulty, normals[:, 1]).reshape(-1)
    columns["advantage"] = _trl_grpo_advantage(rewards, channels).reshape(-1)
    return columns


def _with_outliers(
    plan: _Plan,
    step: npt.NDArray[np.int64],
    reward: npt.NDArray[np.float32],
    group_uniforms: npt.NDArray[np.float64],
) -> npt.NDArray[np.float32]:
    assert plan.onset_step is not None
    n = plan.group_size
    is_outlier_group = (group_uniforms[:, 0] < _OUTLIER_GROUP_RATE) & (step >= plan.onset_step)[:, None]
    which = np.minimum((group_uniforms[:, 1] * n).astype(np.int64), n - 1)
    sign = np.where(group_uniforms[:, 2] < _OUTLIER_POSITIVE_SHARE, 1.0, -1.0)
    low, high = _OUTLIER_MAGNITUDE
    value = (sign * (low + (high - low) * group_uniforms[:, 3])).astype(np.float32)
    hit = is_outlier_group[:, :, None] & (np.arange(n) == which[:, :, None])
    return np.where(hit, value[:, :, None], reward)


def _completion_length(
    plan: _Plan,
    step: npt.NDArray[np.int64],
    prompt_difficulty: npt.NDArray[np.float32],
    noise: npt.NDArray[np.float32],
) -> npt.NDArray[np.int32]:
    start, end = _BASE_LENGTH
    base = np.log(start + (end - start) * _progress(plan, step)).astype(np.float32)[:, None, None]
    log_length = base + np.float32(_LENGTH_DIFFICULTY) * prompt_difficulty + np.float32(_LENGTH_NOISE) * noise
    low, high = _LENGTH_BOUNDS
    return np.clip(np.rint(np.exp(log_length)), low, high).astype(np.int32)


def _trl_grpo_advantage(
    rewards: dict[str, npt.NDArray[np.float32]], channels: tuple[_Channel, ...]
) -> npt.NDArray[np.float32]:
    """TRL ``sum_then_normalize`` on ``[steps, groups, group_size]`` rewards, computed in float64."""
    total = np.zeros(next(iter(rewards.values())).shape, np.float64)
    for ch in channels:
        total += ch.weight * rewards[ch.name].astype(np.float64)
    mean = total.mean(axis=-1, keepdims=True)
    std = total.std(axis=-1, ddof=1, keepdims=True)
    advantage = (total - mean) / (std + TRL_STD_EPS)
    # A constant group carries no signal: exactly 0, not a rounding residue divided by 1e-4.
    constant = total.max(axis=-1, keepdims=True) == total.min(axis=-1, keepdims=True)
    return np.where(constant, 0.0, advantage).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# ground truth and schema

_DESCRIPTIONS = {
    "healthy": (
        "Three continuous channels (correct, reasoning, style) improve steadily; within-group spread of "
        "every channel stays roughly constant, so GRPO keeps a ranking signal throughout. Nothing to find."
    ),
    "single-reward": (
        "One continuous channel (correct): GRPO and GDPO coincide up to the batch step and no "
        "multi-reward pathology can occur. Nothing to find."
    ),
    "saturating-format": (
        "Binary format channel: pass rate climbs from {early:.0%} to {mid:.0%} by step {ramp_start}, then to "
        "{sat:.1%} at step {onset} and stays there; after the onset almost every group passes entirely "
        "(rel_gain of format ~0.9 -> ~0.05, the rare single failure dominates its group's advantage) while "
        "the continuous correct channel keeps its within-group variance."
    ),
    "tied-sums": (
        "Three binary channels (format, correct, reasoning) with pass rates near 0.5 and equal weights: "
        "different reward vectors such as (1,0,0) and (0,1,0) share a sum and get identical GRPO "
        "advantages in most groups, from the first step on."
    ),
    "collinear": (
        "correct and verifier measure the same latent quality (within-group demeaned correlation ~0.9), "
        "so GRPO counts that signal twice; style is independent. From the first step on."
    ),
    "outlier-groups": (
        "From step {onset} on, about {rate:.0%} of the groups in each step have one completion whose judge "
        "reward is extreme (+-{low:g}..{high:g} against a normal range of [0, 1]); that sample's GRPO "
        "advantage sits at the (n-1)/sqrt(n) bound and the rest of its group near -1/sqrt(n) times its sign, "
        "so the pooled advantage distribution is heavy-tailed and bimodal."
    ),
}


def _ground_truth(plan: _Plan) -> dict[str, Any]:
    spec = plan.spec
    params: dict[str, Any] = {
        "model_version": MODEL_VERSION,
        "channels": {
            # The saturating channel follows the "saturation" schedule below, not a learning curve.
            ch.name: {"kind": ch.kind, "weight": ch.weight, "schedule": "saturation"}
            if ch.name == spec.saturating
            else ch.params()
            for ch in spec.channels
        },
        "learning_curve": "(1 - exp(-3 t)) / (1 - exp(-3)), t = step / (steps - 1)",
        "completion_length": {
            "base_start": _BASE_LENGTH[0],
            "base_end": _BASE_LENGTH[1],
            "difficulty": _LENGTH_DIFFICULTY,
            "noise": _LENGTH_NOISE,
            "bounds": list(_LENGTH_BOUNDS),
        },
        "advantage": {"convention": "trl", "aggregation": "sum_then_normalize", "std_eps": TRL_STD_EPS},
    }
    fields: dict[str, Any] = {}
    if spec.saturating is not None:
        params["saturation"] = {
            "channel": spec.saturating,
            "early_pass_rate": _EARLY_PASS_RATE,
            "ramp_start_pass_rate": _RAMP_START_PASS_RATE,
            "ramp_start_step": plan.ramp_start,
            "saturated_pass_rate": _SATURATED_PASS_RATE,
            "early_difficulty": _EARLY_FORMAT_DIFFICULTY,
        }
        fields = {
            "early": _EARLY_PASS_RATE,
            "mid": _RAMP_START_PASS_RATE,
            "sat": _SATURATED_PASS_RATE,
            "ramp_start": plan.ramp_start,
            "onset": plan.onset_step,
        }
    if spec.outlier is not None:
        params["outliers"] = {
            "channel": spec.outlier,
            "group_rate": _OUTLIER_GROUP_RATE,
            "samples_per_group": 1,
            "magnitude": list(_OUTLIER_MAGNITUDE),
            "positive_share": _OUTLIER_POSITIVE_SHARE,
        }
        fields = {
            "onset": plan.onset_step,
            "rate": _OUTLIER_GROUP_RATE,
            "low": _OUTLIER_MAGNITUDE[0],
            "high": _OUTLIER_MAGNITUDE[1],
        }
    return {
        "scenario": plan.scenario,
        "onset_step": plan.onset_step,
        "affected_channels": list(spec.affected),
        "expected_codes": list(spec.expected_codes),
        "description": _DESCRIPTIONS[plan.scenario].format(**fields),
        "seed": plan.seed,
        "steps": plan.steps,
        "groups": plan.groups,
        "group_size": plan.group_size,
        "params": params,
    }


def _metadata(plan: _Plan) -> dict[bytes, bytes]:
    weights = {ch.name: ch.weight for ch in plan.spec.channels}
    return {
        WEIGHTS_KEY: json.dumps(weights).encode(),
        GROUND_TRUTH_KEY: json.dumps(_ground_truth(plan), sort_keys=True).encode(),
    }


def _schema(plan: _Plan) -> pa.Schema:
    fields = [pa.field("step", pa.int64(), nullable=False), pa.field("group_id", pa.int64(), nullable=False)]
    fields += [pa.field(f"reward/{ch.name}", pa.float32(), nullable=False) for ch in plan.spec.channels]
    fields += [
        pa.field("completion_length", pa.int32(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
    ]
    return pa.schema(fields, metadata=_metadata(plan))


def _batches(plan: _Plan, chunk_steps: int) -> Iterator[pa.RecordBatch]:
    schema = _schema(plan)
    for first in range(0, plan.steps, chunk_steps):
        columns = _chunk_columns(plan, first, min(first + chunk_steps, plan.steps))
        yield pa.RecordBatch.from_arrays([pa.array(columns[f.name]) for f in schema], schema=schema)


def _default_chunk_steps(plan: _Plan) -> int:
    return max(1, min(_MAX_CHUNK_STEPS, _TARGET_CHUNK_ROWS // plan.rows_per_step, plan.steps))


# ---------------------------------------------------------------------------------------------------
# public API


def simulate_batches(
    scenario: str,
    *,
    steps: int,
    groups: int,
    group_size: int,
    seed: int = 0,
    onset_step: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield a synthetic run as canonical-table record batches of a few whole steps each.

    Rows are sorted by step, then group; each batch's schema carries the key-value metadata of
    :func:`simulation_metadata`. Options are checked before the first batch is made.

    >>> batches = list(simulate_batches("collinear", steps=3, groups=2, group_size=4, seed=1))
    >>> sum(b.num_rows for b in batches), batches[0].schema.names[:4]
    (24, ['step', 'group_id', 'reward/correct', 'reward/verifier'])
    """
    plan = _plan(scenario, steps=steps, groups=groups, group_size=group_size, seed=seed, onset_step=onset_step)
    return _batches(plan, _default_chunk_steps(plan))


def simulation_metadata(
    scenario: str,
    *,
    steps: int,
    groups: int,
    group_size: int,
    seed: int = 0,
    onset_step: int | None = None,
) -> dict[bytes, bytes]:
    """Return the Parquet key-value metadata (channel weights, ground truth as JSON) of a run.

    >>> meta = simulation_metadata("saturating-format", steps=10, groups=2, group_size=4)
    >>> truth = json.loads(meta[GROUND_TRUTH_KEY])
    >>> truth["onset_step"], truth["affected_channels"], json.loads(meta[WEIGHTS_KEY])
    (4, ['format'], {'format': 1.0, 'correct': 1.0})
    """
    plan = _plan(scenario, steps=steps, groups=groups, group_size=group_size, seed=seed, onset_step=onset_step)
    return _metadata(plan)


def write_simulation(
    path: str | os.PathLike[str],
    scenario: str,
    *,
    steps: int,
    groups: int,
    group_size: int,
    seed: int = 0,
    onset_step: int | None = None,
    row_group_steps: int | None = None,
) -> SimulationSummary:
    """Write a synthetic run to a Parquet file atomically and return what was written.

    ``row_group_steps`` sets how many steps go into one Parquet row group (default: about half a
    million rows); it changes the file layout, never a value.

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     out = pathlib.Path(tmp) / "run.parquet"
    ...     summary = write_simulation(out, "tied-sums", steps=2, groups=3, group_size=4)
    >>> summary.rows, summary.channels, summary.ground_truth["onset_step"]
    (24, ('format', 'correct', 'reasoning'), 0)
    """
    plan = _plan(scenario, steps=steps, groups=groups, group_size=group_size, seed=seed, onset_step=onset_step)
    if row_group_steps is None:
        chunk_steps = _default_chunk_steps(plan)
    else:
        chunk_steps = _check_int(row_group_steps, "--row-group-steps", minimum=1)
        if chunk_steps * plan.rows_per_step > MAX_ROWS_PER_STEP:
            raise UsageError(
                f"--row-group-steps {chunk_steps} makes row groups of "
                f"{chunk_steps * plan.rows_per_step} rows, more than {MAX_ROWS_PER_STEP}",
                hint="use a smaller --row-group-steps",
            )
    target = Path(path)
    if str(target) != "-" and target.suffix.lower() not in (".parquet", ".pq", ".parq"):
        raise UsageError(
            f"-o {target}: simulate writes Parquet, so the file name must end in .parquet",
            hint="e.g. -o run.parquet (or -o - for standard output)",
        )
    schema = _schema(plan)
    rows = 0
    with atomic_path(target) as temp, pq.ParquetWriter(str(temp), schema, compression="zstd") as writer:
        for batch in _batches(plan, chunk_steps):
            writer.write_batch(batch, row_group_size=batch.num_rows)
            rows += batch.num_rows
    return SimulationSummary(
        path=target,
        rows=rows,
        steps=plan.steps,
        channels=tuple(ch.name for ch in plan.spec.channels),
        ground_truth=_ground_truth(plan),
    )
