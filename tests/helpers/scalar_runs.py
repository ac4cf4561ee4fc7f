"""Scalar logs written with torch's SummaryWriter under each framework's real tag names (detector fixtures)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Curve = Callable[[np.ndarray, np.random.Generator], np.ndarray]
STEPS = 200


def write_events(directory: Path, series: Mapping[str, np.ndarray], steps: np.ndarray | None = None) -> Path:
    """One event file in ``directory`` with every tag's values at ``steps`` (default 0..n-1)."""
    from torch.utils.tensorboard import SummaryWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(directory))
    n = len(next(iter(series.values())))
    steps = np.arange(n) if steps is None else steps
    for i, step in enumerate(steps.tolist()):
        for tag, values in series.items():
            writer.add_scalar(tag, float(values[i]), step)
    writer.close()
    return directory


def _noisy(rng: np.random.Generator, level: np.ndarray | float, scale: float) -> np.ndarray:
    base = np.broadcast_to(np.asarray(level, dtype=np.float64), (STEPS,))
    return base * (1 + scale * rng.standard_normal(STEPS))


def trl_series(seed: int = 0, **changes: Curve) -> dict[str, np.ndarray]:
    """A healthy two-channel TRL GRPO run; ``changes`` replace a canonical series (by TRL tag)."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)
    series = {
        "train/reward": np.clip(0.3 + 0.4 * t / STEPS + 0.05 * rng.standard_normal(STEPS), 0, 2),
        "train/reward_std": _noisy(rng, 0.6, 0.08),
        "train/frac_reward_zero_std": np.clip(0.1 + 0.05 * rng.standard_normal(STEPS), 0, 1),
        "train/kl": _noisy(rng, 0.001 + 0.05 * t / STEPS, 0.1),
        "train/entropy": _noisy(rng, 0.8 - 0.2 * t / STEPS, 0.05),
        "train/rewards/format_reward/mean": np.clip(0.5 + 0.2 * t / STEPS + 0.05 * rng.standard_normal(STEPS), 0, 1),
        "train/rewards/format_reward/std": _noisy(rng, 0.4, 0.1),
        "train/rewards/correct_reward/mean": np.clip(0.2 + 0.3 * t / STEPS + 0.05 * rng.standard_normal(STEPS), 0, 1),
        "train/rewards/correct_reward/std": _noisy(rng, 0.45, 0.1),
        "train/loss": 0.01 * rng.standard_normal(STEPS),
        "train/grad_norm": _noisy(rng, 0.3, 0.2),
    }
    for tag, curve in changes.items():
        series[tag.replace("__", "/")] = curve(t, rng)
    return series


def after(step: int, before: float, later: float, noise: float = 0.05) -> Curve:
    """A level that jumps from ``before`` to ``later`` at ``step`` (multiplicative noise)."""

    def curve(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        level = np.where(t < step, before, later)
        return level * (1 + noise * rng.standard_normal(len(t)))

    return curve


def flat(level: float, noise: float = 0.02) -> Curve:
    """A level that does not move (multiplicative noise): a training reward that is not rising."""
    return after(0, level, level, noise)


def rises_then_falls(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A reward that climbs to step 60, then falls back to where it started by step 120."""
    level = np.interp(t, [0, 60, 120, STEPS], [0.3, 0.7, 0.3, 0.3])
    return level * (1 + 0.02 * rng.standard_normal(len(t)))


def oscillating_kl(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    smooth = (0.001 + 0.05 * t / STEPS) * (1 + 0.1 * rng.standard_normal(len(t)))
    wild = 0.2 + 0.15 * np.where(t % 2 == 0, 1.0, -1.0) * (1 + 0.2 * rng.standard_normal(len(t)))
    return np.where(t < 100, smooth, wild)


def trl_run(directory: Path, **changes: Curve) -> Path:
    return write_events(directory / "runs" / "Nov30_host", trl_series(0, **changes)).parent.parent


def truncation_series(seed: int = 0, *, share: float = 0.9, tracked: bool = True) -> dict[str, np.ndarray]:
    """A TRL run whose completions hit the length cap in ``share`` of cases (varying from step to step), with a
    ``length`` channel = characters / cap that follows the cut (``tracked``) or one that ignores it."""
    rng = np.random.default_rng(seed)
    series = trl_series(seed, train__reward=flat(0.5))
    clipped = np.clip(share + 0.04 * rng.standard_normal(STEPS), 0, 1)
    series["train/completions/clipped_ratio"] = clipped
    if tracked:
        series["train/rewards/length/mean"] = np.clip(
            clipped + 0.5 * (1 - clipped) + 0.005 * rng.standard_normal(STEPS), 0, 1
        )
    else:
        series["train/rewards/length/mean"] = np.clip(0.6 + 0.05 * rng.standard_normal(STEPS), 0, 1)
    series["train/rewards/length/std"] = np.full(STEPS, 0.2) * (1 + 0.1 * rng.standard_normal(STEPS))
    return series


def write_trainer_state(directory: Path, history: Sequence[Mapping[str, Any]]) -> Path:
    """``<directory>/checkpoint-N/trainer_state.json`` with TRL's key names in ``log_history``."""
    last = max(int(entry["step"]) for entry in history)
    path = directory / f"checkpoint-{last}" / "trainer_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": last, "log_history": list(history)}))
    return directory


def trl_final_summary(step: int, wall: float) -> list[bytes]:
    """What transformers' end-of-training log writes at the last step: bookkeeping, with ``epoch`` logged again."""
    tags = {
        "train/train_runtime": 12.5,
        "train/train_samples_per_second": 40.0,
        "train/train_steps_per_second": 1.6,
        "train/total_flos": 0.0,
        "train/train_loss": 0.01,
        "train/epoch": 3.0,
    }
    return [scalar_event(tag, value, step, wall) for tag, value in tags.items()]


def verl_run(directory: Path, *, advantage_max: float = 2.2, jump_at: int | None = None) -> Path:
    rng = np.random.default_rng(1)
    t = np.arange(STEPS)
    high = np.where(jump_at is not None and t >= (jump_at or 0), 4.5, advantage_max)
    series = {
        "critic/score/mean": 0.3 + 0.3 * t / STEPS + 0.03 * rng.standard_normal(STEPS),
        "critic/advantages/mean": 0.01 * rng.standard_normal(STEPS),
        "critic/advantages/max": high * (1 + 0.03 * rng.standard_normal(STEPS)),
        "critic/advantages/min": -high * (1 + 0.03 * rng.standard_normal(STEPS)),
        "actor/entropy": _noisy(rng, 0.7, 0.05),
        "actor/kl_loss": _noisy(rng, 0.001 + 0.02 * t / STEPS, 0.1),
        "actor/pg_clipfrac": _noisy(rng, 0.02, 0.2),
        "response_length/mean": _noisy(rng, 300.0, 0.05),
    }
    return write_events(directory / "verl", series)


SCALAR_CASES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], Path]]] = {
    "CD104": (
        lambda d: write_events(d / "pos", truncation_series()),
        lambda d: write_events(d / "neg", truncation_series(tracked=False)),
    ),
    "CD501": (
        lambda d: trl_run(d / "pos", train__reward_std=after(100, 0.6, 0.01), train__reward=flat(0.5)),
        lambda d: trl_run(d / "neg"),
    ),
    "CD502": (lambda d: trl_run(d / "pos", train__kl=oscillating_kl), lambda d: trl_run(d / "neg")),
    "CD503": (
        lambda d: trl_run(d / "pos", train__entropy=after(90, 0.8, 0.05), train__reward=flat(0.5)),
        lambda d: trl_run(d / "neg", train__entropy=after(90, 0.8, 0.05)),  # reward rises: convergence
    ),
    "CD504": (
        lambda d: trl_run(d / "pos", train__frac_reward_zero_std=after(100, 0.1, 0.85, noise=0.02)),
        lambda d: trl_run(d / "neg"),
    ),
    "CD505": (
        lambda d: trl_run(d / "pos", **{"train__rewards__format_reward__std": after(100, 0.4, 0.005)}),
        lambda d: trl_run(d / "neg"),
    ),
    "CD506": (lambda d: verl_run(d / "pos", jump_at=100), lambda d: verl_run(d / "neg")),
}


def record(payload: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, payload, masked CRC of the payload."""
    from collapse_doctor.io.logs.crc32c import masked_crc32c

    length = len(payload).to_bytes(8, "little")
    return length + masked_crc32c(length).to_bytes(4, "little") + payload + masked_crc32c(payload).to_bytes(4, "little")


def scalar_event(tag: str, value: float, step: int, wall: float, *, tensor: bool = False) -> bytes:
    """A serialised Event with one scalar: ``simple_value`` or a TF2-style float tensor."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

    if tensor:
        proto = tensor_pb2.TensorProto(dtype=1, tensor_shape=tensor_shape_pb2.TensorShapeProto(), float_val=[value])
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        summary_value = summary_pb2.Summary.Value(tag=tag, tensor=proto, metadata=metadata)
    else:
        summary_value = summary_pb2.Summary.Value(tag=tag, simple_value=value)
    event = event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[summary_value]))
    return event.SerializeToString()


def session_start(step: int, wall: float) -> bytes:
    from tensorboard.compat.proto import event_pb2

    return event_pb2.Event(
        wall_time=wall, step=step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    ).SerializeToString()


def write_raw(path: Path, payloads: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(record(p) for p in payloads))
    return path


def collapsed_series(seed: int = 0) -> dict[str, np.ndarray]:
    """A TRL log that collapses from step 90: entropy falls to 0.05 while the reward stays flat at 0.5 and
    95% of the groups stop varying (TRL's frac_reward_zero_std), so it is not convergence."""
    return trl_series(
        seed,
        train__entropy=after(90, 0.8, 0.05),
        train__reward=flat(0.5),
        train__frac_reward_zero_std=after(90, 0.1, 0.95, noise=0.01),
    )


# Run-health cases (CD507-CD511): the training reward, clipping, gradients, a held-out score, entropy.


def write_cadenced_events(directory: Path, series: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    """One event file with each tag at its own steps (``{tag: (steps, values)}``): eval metrics on their cadence."""
    from torch.utils.tensorboard import SummaryWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(directory))
    points = sorted(
        (int(s), tag, float(v)) for tag, (steps, values) in series.items() for s, v in zip(steps, values, strict=True)
    )
    for step, tag, value in points:
        writer.add_scalar(tag, value, step)
    writer.close()
    return directory


def rises_then_flat(until: int = 60, start: float = 0.3, top: float = 0.7, noise: float = 0.02) -> Curve:
    """A reward that climbs to ``top`` by step ``until`` and stays there (a plateau after a gain)."""

    def curve(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        level = np.interp(t, [0, until, STEPS], [start, top, top])
        return level * (1 + noise * rng.standard_normal(len(t)))

    return curve


def decaying(start: float, scale: float, noise: float = 0.02) -> Curve:
    """``start * exp(-t / scale)`` with multiplicative noise: an entropy on its way down."""

    def curve(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return start * np.exp(-t / scale) * (1 + noise * rng.standard_normal(len(t)))

    return curve


def trl_clip_series(seed: int = 0, *, low: float, high: float) -> dict[str, np.ndarray]:
    """A healthy TRL run that also logs its trust-region clipping (TRL's three clip_ratio tags) at these shares."""
    rng = np.random.default_rng(seed + 100)
    series = trl_series(seed)
    lows = np.clip(low * (1 + 0.1 * rng.standard_normal(STEPS)), 0, 1)
    highs = np.clip(high * (1 + 0.1 * rng.standard_normal(STEPS)), 0, 1)
    series["train/clip_ratio/low_mean"] = lows
    series["train/clip_ratio/high_mean"] = highs
    series["train/clip_ratio/region_mean"] = lows + highs  # the two sides never overlap (opposite advantage signs)
    return series


def grad_norm_with(values_at: Mapping[int, float]) -> Curve:
    """A healthy gradient norm (0.3, 20% noise) with the given values written at the given steps."""

    def curve(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        norm = 0.3 * (1 + 0.2 * rng.standard_normal(len(t)))
        for step, value in values_at.items():
            norm[step] = value
        return norm

    return curve


def eval_run(directory: Path, held_out: Callable[[np.ndarray], np.ndarray], *, every: int = 10) -> Path:
    """A healthy TRL TensorBoard log (training reward rising 0.3 -> 0.7) plus ``eval/reward`` every ``every`` steps,
    written on its own cadence as transformers' callback does."""
    series = trl_series(0)
    tagged = {tag: (np.arange(STEPS), values) for tag, values in series.items()}
    steps = np.arange(every, STEPS, every)
    tagged["eval/reward"] = (steps, held_out(steps))
    return write_cadenced_events(directory / "runs" / "Dec01_host", tagged).parent.parent


def held_out(start: float, end: float, noise: float = 0.01, seed: int = 5) -> Callable[[np.ndarray], np.ndarray]:
    """A held-out score going linearly from ``start`` to ``end`` over the run, with additive noise."""

    def curve(steps: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return start + (end - start) * steps / STEPS + noise * rng.standard_normal(len(steps))

    return curve


SCALAR_CASES.update(
    {
        "CD507": (
            lambda d: trl_run(d / "pos", train__reward=rises_then_falls),  # best at step 60, then back down
            lambda d: trl_run(d / "neg"),  # rises to the end
        ),
        "CD508": (
            lambda d: write_events(d / "pos", trl_clip_series(low=0.02, high=0.3)),
            lambda d: write_events(d / "neg", trl_clip_series(low=0.01, high=0.012)),
        ),
        "CD509": (
            lambda d: trl_run(d / "pos", train__grad_norm=grad_norm_with({s: float("nan") for s in range(185, STEPS)})),
            lambda d: trl_run(d / "neg"),
        ),
        "CD510": (
            lambda d: eval_run(d / "pos", held_out(0.45, 0.45)),
            lambda d: eval_run(d / "neg", held_out(0.3, 0.7)),
        ),
        "CD511": (
            lambda d: trl_run(d / "pos", train__entropy=decaying(0.8, 250), train__reward=flat(0.5)),
            lambda d: trl_run(d / "neg", train__entropy=decaying(0.8, 250)),  # reward rises: convergence
        ),
    }
)
