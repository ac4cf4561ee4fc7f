"""Trainer callbacks: Ctrl-C and ``--fail-on`` stops with a checkpoint, adaptive KL, checkpointed state.

Stopping goes through TRL's own control flow (``should_save`` + ``should_training_stop`` at the end
of a step), so an interrupted or stopped run leaves a regular TRL checkpoint that ``--resume`` loads.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback  # type: ignore[import-untyped,unused-ignore]

from collapse_doctor.retrain.dynamic import DynamicWeighting
from collapse_doctor.retrain.monitor import RolloutMonitor

KL_ADJUST_RATE = 0.5
"""Adaptive KL: each logged step scales beta by 1 + rate * clip(kl / target - 1, -0.2, 0.2)."""


@dataclass
class StopState:
    """Why training stopped early, if it did."""

    interrupted: bool = False
    fail_on_findings: list[str] = field(default_factory=list)
    reason: str | None = None


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


class CollapseDoctorCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Stops on Ctrl-C or on ``--fail-on`` findings, adapts beta toward ``kl_target``, saves gdpo-dynamic state."""

    def __init__(
        self,
        *,
        monitor: RolloutMonitor,
        stop: StopState,
        interrupt: InterruptFlag,
        dynamic: DynamicWeighting | None = None,
        fail_on: str | None = None,
        algo: str = "gdpo",
        kl_target: float | None = None,
    ) -> None:
        self.monitor = monitor
        self.stop = stop
        self.interrupt = interrupt
        self.dynamic = dynamic
        self.fail_on = fail_on
        self.algo = algo
        self.kl_target = kl_target
        self.trainer: Any = None
        self.step_seconds: list[float] = []
        self._checked_files = 0
        self._step_started = 0.0

    def _agree(self, flag: bool) -> bool:
        """True when any process raised the flag (every process must stop at the same step)."""
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is None or accelerator.num_processes == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
        return bool(accelerator.reduce(value, reduction="sum").item() > 0)

    def _failing_findings(self) -> list[str]:
        from collapse_doctor.options import ScanOptions
        from collapse_doctor.pipeline import diagnose

        diagnosis = diagnose(
            [self.monitor.rollouts_dir],
            ScanOptions(fail_on=self.fail_on, algo="grpo" if self.algo == "grpo" else "gdpo"),
        )
        return [f"{f.code} {f.title}" for f in diagnosis.failing()]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._step_started = time.perf_counter()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.step_seconds.append(time.perf_counter() - self._step_started)
        stop_now = False
        if self._agree(self.interrupt.requested):
            self.stop.interrupted = True
            self.stop.reason = f"interrupted (Ctrl-C) at step {state.global_step}"
            stop_now = True
        elif self.fail_on and self.monitor.files_written > self._checked_files:
            self._checked_files = self.monitor.files_written
            failing = self._failing_findings() if self.monitor.enabled else []
            if self._agree(bool(failing)):
                self.stop.fail_on_findings = failing
                self.stop.reason = f"--fail-on {self.fail_on}: stopped at step {state.global_step}"
                stop_now = True
        if stop_now:
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
        self.monitor.flush()
        return control
