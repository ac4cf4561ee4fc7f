"""retrain's own trainer callback: Ctrl-C stops with a checkpoint, adaptive KL, gdpo-dynamic state in checkpoints.

Monitoring and ``--fail-on`` are the user-facing callback's
(:class:`collapse_doctor.integrations.trl.CollapseDoctorCallback`); this adds what only ``retrain`` does.
Stopping goes through TRL's own control flow (``should_save`` + ``should_training_stop`` at the end of a step),
so an interrupted run leaves a regular TRL checkpoint that ``--resume`` loads.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback  # type: ignore[import-untyped,unused-ignore]

from collapse_doctor.integrations.trl import any_process
from collapse_doctor.retrain.dynamic import DynamicWeighting

KL_ADJUST_RATE = 0.5
"""Adaptive KL: each logged step scales beta by 1 + rate * clip(kl / target - 1, -0.2, 0.2)."""


class InterruptFlag:
    """First Ctrl-C asks for a checkpoint and a clean stop at the end of the step; a second one aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def install(self) -> None:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self._previous = None

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class RetrainCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Stops on Ctrl-C, adapts beta toward ``kl_target``, saves gdpo-dynamic's EMA, times each step."""

    def __init__(
        self,
        *,
        interrupt: InterruptFlag,
        dynamic: DynamicWeighting | None = None,
        kl_target: float | None = None,
    ) -> None:
        self.interrupt = interrupt
        self.dynamic = dynamic
        self.kl_target = kl_target
        self.trainer: Any = None
        self.interrupted_at: int | None = None
        self.step_seconds: list[float] = []
        self._step_started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._step_started = time.perf_counter()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.step_seconds.append(time.perf_counter() - self._step_started)
        if any_process(self.trainer, self.interrupt.requested):
            self.interrupted_at = int(state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> Any:
        if self.kl_target is None or not logs or "kl" not in logs or self.trainer is None:
            return control
        error = max(-0.2, min(0.2, float(logs["kl"]) / self.kl_target - 1.0))
        self.trainer.beta = float(self.trainer.beta) * (1.0 + KL_ADJUST_RATE * error)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.dynamic is not None and checkpoint.is_dir() and state.is_world_process_zero:
            self.dynamic.save(checkpoint)
        return control
