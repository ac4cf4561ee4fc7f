"""The trainer callback of the recipes: the on-finding hybrid switch, the monitor's algorithm, the checkpointed state.

The monitor (:class:`collapse_doctor.integrations.trl.CollapseDoctorCallback`) runs ``scan``'s detectors after
each rollout part. Before a hybrid switch it judges the run as GRPO (what trains then), so a finding such as
CD402 means what it means for summed rewards; after the switch, as the algorithm trained from then on. When the
named finding first reaches its level, every process switches from the next step on (the decision is reduced
over processes, as ``--fail-on`` is).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback  # type: ignore[import-untyped,unused-ignore]

from collapse_doctor.integrations.trl import CollapseDoctorCallback, any_process, trl_step
from collapse_doctor.retrain.recipes import ScheduledAdvantages


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RecipeCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Fires the on-finding switch, keeps the monitor's algorithm in step, saves the schedule's state."""

    def __init__(
        self, scheduled: ScheduledAdvantages, doctor: CollapseDoctorCallback, say: Callable[[str], None] = _stderr
    ) -> None:
        self.scheduled = scheduled
        self.doctor = doctor
        self.say = say
        self.trainer: Any = None
        self._parts_seen = 0
        self._said = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        monitor = self.doctor.monitor
        if monitor is not None:
            # the batch generated in this step is TRL's step global_step + 1, as the rollouts record it
            aggregation = self.scheduled.schedule.aggregation_at(trl_step(state), self.scheduled.switched_at)
            monitor.algo = aggregation
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            for step, what in self.scheduled.history[self._said :]:
                self.say(f"collapse-doctor: from step {step}: {what}")
        self._said = len(self.scheduled.history)
        hybrid = self.scheduled.schedule.hybrid
        monitor = self.doctor.monitor
        if hybrid is None or hybrid.code is None or self.scheduled.switched_at is not None or monitor is None:
            return control
        if monitor.parts_due == self._parts_seen:  # the same on every process: all reduce at the same steps
            return control
        self._parts_seen = monitor.parts_due
        diagnosis = self.doctor.diagnosis
        seen = [
            f
            for f in (diagnosis.findings if diagnosis is not None else ())
            if f.code == hybrid.code and f.severity >= hybrid.severity
        ]
        if any_process(self.trainer, bool(seen)):
            step = trl_step(state)  # the next batch: the first the switch trains
            reason = f"{seen[0].code} {seen[0].severity.label}: {seen[0].title}" if seen else f"{hybrid.code}"
            if self.scheduled.switch(step, reason):
                self.say(f"collapse-doctor: hybrid switch: {self.scheduled.schedule.algo} from step {step} ({reason})")
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if checkpoint.is_dir() and state.is_world_process_zero:
            self.scheduled.save(checkpoint)
        return control
