"""The seam between collapse-doctor and TRL: a ``GRPOTrainer`` subclass overriding two methods.

Tested with trl 1.16 (the ``train`` extra pins ``trl>=1.16,<2``); :func:`check_trl_seam` refuses other
shapes with a clear message instead of training with wrong advantages.

``_calculate_rewards(inputs, prompts, completions, completion_ids_list)``
    returns the ``[N, C]`` rewards of the generation batch gathered over all processes. The override
    keeps them (and the local prompts and completions) for the step being built.
``_generate_and_score_completions(inputs)``
    returns the batch dict whose ``"advantages"`` (this process's rows) the loss uses. The override
    reads them, and for gdpo-dynamic replaces them with collapse-doctor's
    (:func:`collapse_doctor.advantages.dynamic_gdpo_advantages` with this step's weights); then it
    hands the step (rewards, used advantages, text) to the :class:`RolloutMonitor`.

Everything else (generation, loss, optimizer, checkpoints, accelerate/DeepSpeed) is TRL's.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from accelerate.utils import gather, gather_object  # type: ignore[import-untyped,unused-ignore]
from trl import GRPOTrainer  # type: ignore[import-untyped,unused-ignore]

from collapse_doctor.errors import UsageError
from collapse_doctor.retrain.dynamic import DynamicWeighting
from collapse_doctor.retrain.monitor import RolloutMonitor, StepRecord

TESTED_TRL = ">=1.16,<2"

_SEAM = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
}


def check_trl_seam() -> None:
    """Fail early, with the tested range, when the installed TRL lacks the two methods we override."""
    import trl  # type: ignore[import-untyped,unused-ignore]

    for name, expected in _SEAM.items():
        method = getattr(GRPOTrainer, name, None)
        params = list(inspect.signature(method).parameters) if method is not None else None
        if params != expected:
            raise UsageError(
                f"installed trl {trl.__version__} changed GRPOTrainer.{name} (collapse-doctor hooks it)",
                hint=f"install a tested version: pip install 'trl{TESTED_TRL}'",
            )


class MonitoredGRPOTrainer(GRPOTrainer):  # type: ignore[misc,unused-ignore]
    """TRL's GRPOTrainer with collapse-doctor's monitoring and, optionally, dynamic channel weights."""

    def __init__(
        self,
        *args: Any,
        monitor: RolloutMonitor,
        dynamic: DynamicWeighting | None = None,
        **kwargs: Any,
    ) -> None:
        check_trl_seam()
        super().__init__(*args, **kwargs)
        self.collapse_monitor = monitor
        self.dynamic_weighting = dynamic
        self._captured: dict[str, Any] | None = None

    def _calculate_rewards(
        self, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any], completion_ids_list: list[Any]
    ) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured = {
            "rewards": rewards_per_func.detach(),
            "prompts": prompts,
            "completions": completions,
            "lengths": [len(ids) for ids in completion_ids_list],
        }
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        captured, self._captured = self._captured, None
        if captured is None or self.model is None or not self.model.training:
            return output
        group_size = int(self.num_generations or 1)
        rewards = captured["rewards"]
        local = output["advantages"]
        weights = None
        if self.dynamic_weighting is not None:
            advantages, weights = self.dynamic_weighting.step(rewards, group_size)
            rank, per_process = self.accelerator.process_index, local.shape[0]
            local = advantages[rank * per_process : (rank + 1) * per_process].to(local.device, local.dtype)
            output["advantages"] = local
        used = gather(local.detach()) if self.accelerator.num_processes > 1 else local.detach()
        prompts = gather_object(captured["prompts"]) if self.accelerator.num_processes > 1 else captured["prompts"]
        completions = captured["completions"]
        lengths = captured["lengths"]
        if self.accelerator.num_processes > 1:
            completions = gather_object(completions)
            lengths = gather_object(lengths)
        self.collapse_monitor.record(
            StepRecord(
                step=int(self.state.global_step),
                rewards=rewards.cpu(),
                advantages=used.cpu(),
                group_size=group_size,
                prompts=list(prompts),
                completions=list(completions),
                completion_lengths=[int(n) for n in lengths],
                weights=weights,
            )
        )
        return output
