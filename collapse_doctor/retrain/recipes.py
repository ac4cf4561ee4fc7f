"""The advantages a :class:`~collapse_doctor.retrain.schedule.RecipeSchedule` implies, one generation batch at a time.

With any recipe on, retrain replaces TRL's advantages with these (the callback's ``advantage_transform``):

1. conditioned rewards: ``r_k <- r_k`` where the condition holds, else 0 (NaN stays NaN: "not applicable");
2. channels not yet started weigh 0;
3. before the hybrid switch: GRPO, ``grpo_advantages`` of the weighted sum (``--scale``);
   after it (or without one): GDPO's per-channel group z-scores, clipped to ``+-advantage_clip`` where the
   channel's spread over the step exceeds ``advantage_clip_when_std_above`` (always, for gdpo-dynamic without
   the threshold), fused with the static weights (gdpo) or the dynamic ones at the step's temperature
   (gdpo-dynamic: the EMA and softmax of :mod:`collapse_doctor.engine.advantages`, over the active channels).

The math is :mod:`collapse_doctor.engine.advantages`' (the one source for scan and retrain); this holds the state
(the EMA, when an on-finding switch fired) and saves it with each checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from collapse_doctor.engine.advantages import (
    Segments,
    channel_advantage_std,
    dynamic_channel_weights,
    gdpo_advantages,
    group_zscores,
    grpo_advantages,
    update_std_ema,
)
from collapse_doctor.integrations.rollouts import StepExtras
from collapse_doctor.retrain.dynamic import load_state, save_state
from collapse_doctor.retrain.schedule import RecipeSchedule

if TYPE_CHECKING:
    from collapse_doctor.retrain.plan import RetrainPlan

STATE_FILE = "collapse_doctor_schedule.json"
RECIPE_SCALARS = "collapse_doctor/recipe/"
_COMPARE: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    ">=": torch.ge,
    ">": torch.gt,
    "<=": torch.le,
    "<": torch.lt,
    "==": torch.eq,
}


def conditioned_rewards(rewards: torch.Tensor, schedule: RecipeSchedule) -> torch.Tensor:
    """Rewards with each condition applied (on the raw reward of the channel conditioned on).

    >>> from collapse_doctor.retrain.schedule import Condition
    >>> s = RecipeSchedule("gdpo", ("correct", "length"), 0.5, conditions=(Condition("length", "correct", ">=", 1),))
    >>> conditioned_rewards(torch.tensor([[1.0, 0.8], [0.0, 0.9], [float("nan"), 0.7]]), s).tolist()
    [[1.0, 0.800000011920929], [0.0, 0.0], [nan, 0.0]]
    """
    out = rewards.clone()
    index = {c: k for k, c in enumerate(schedule.channels)}
    for condition in schedule.conditions:
        k, j = index[condition.channel], index[condition.on]
        on = rewards[:, j]
        passes = _COMPARE[condition.op](on, condition.threshold) & ~torch.isnan(on)
        column = rewards[:, k]
        out[:, k] = torch.where(passes | torch.isnan(column), column, torch.zeros_like(column))
    return out


@dataclass
class ScheduledAdvantages:
    """``(rewards [N, C], group size) -> (advantages [N], weights [C], extras)`` under a schedule.

    ``step_of`` gives the trainer's current step (the ``step`` the rollouts record for this batch).
    """

    schedule: RecipeSchedule
    base_weights: tuple[float, ...]
    step_of: Callable[[], int]
    scale: str = "group"
    alpha: float = 0.05
    lower: float = 0.1
    upper: float = 0.5
    ema: torch.Tensor | None = None
    switched_at: int | None = None
    """The first step after the on-finding switch fired (None: not yet, or a switch by step)."""
    switch_reason: str | None = None
    history: list[tuple[int, str]] = field(default_factory=list)
    """``(step, what changed)`` for each change point met so far."""
    _last: tuple[str, float | None, tuple[str, ...]] | None = field(default=None, repr=False)
    _groups: dict[tuple[int, int, str], Segments] = field(default_factory=dict, repr=False)

    def __call__(self, rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, StepExtras]:
        return self.step(rewards, group_size, self.step_of())

    def step(self, rewards: torch.Tensor, group_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor, StepExtras]:
        """The advantages, the weights used (0 for channels not started) and what to log, for one batch."""
        s = self.schedule
        raw = rewards.float()
        n = raw.shape[0]
        key = (n, group_size, str(raw.device))
        if key not in self._groups:  # the same layout every step: build it once
            self._groups[key] = Segments.build(torch.arange(n, device=raw.device) // group_size)
        groups = self._groups[key]
        values = conditioned_rewards(raw, s) if s.conditions else raw
        active = s.active_at(step)
        mask = torch.tensor([c in active for c in s.channels], dtype=torch.bool)
        base = torch.tensor(self.base_weights, dtype=torch.float64)
        aggregation = s.aggregation_at(step, self.switched_at)
        temperature = s.temperature_at(step) if aggregation == "gdpo-dynamic" else None
        clipped = torch.zeros(len(s.channels), dtype=torch.bool)
        if aggregation == "grpo":
            weights = torch.where(mask, base, torch.zeros_like(base)).float()
            advantages = grpo_advantages(values, groups, weights=weights.to(raw.device), scale=self.scale)  # type: ignore[arg-type]
        else:
            z = group_zscores(values, groups)
            spread = channel_advantage_std(z).cpu()
            if s.clip_when_std_above is not None:
                clipped = spread > s.clip_when_std_above
            elif aggregation == "gdpo-dynamic":
                clipped = torch.ones_like(clipped)
            if bool(clipped.any()):
                z = torch.where(clipped.to(z.device), z.clamp(-s.clip, s.clip), z)
            if aggregation == "gdpo-dynamic":
                weights = self._dynamic_weights(z, mask, base, temperature or 0.5)
            else:
                weights = torch.where(mask, base, torch.zeros_like(base)).float()
            advantages = gdpo_advantages(values, groups, weights=weights.to(raw.device), zscores=z)
        self._note(step, aggregation, temperature, active)
        extras = self._extras(raw, values, aggregation, temperature, mask, clipped)
        return advantages, weights, extras

    def _dynamic_weights(
        self, z: torch.Tensor, mask: torch.Tensor, base: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        self.ema = update_std_ema(self.ema, channel_advantage_std(z).cpu(), self.alpha)
        weights = torch.zeros(len(self.schedule.channels), dtype=torch.float32)
        weights[mask] = dynamic_channel_weights(
            self.ema[mask], temperature=temperature, lower=self.lower, upper=self.upper, base_weights=base[mask]
        ).float()
        return weights

    def _note(self, step: int, aggregation: str, temperature: float | None, active: tuple[str, ...]) -> None:
        now = (aggregation, temperature, active)
        if now != self._last:
            what = f"{aggregation}" + (f" T={temperature:g}" if temperature is not None else "")
            self.history.append((step, f"{what}, channels {', '.join(active)}"))
        self._last = now

    def _extras(
        self,
        raw: torch.Tensor,
        values: torch.Tensor,
        aggregation: str,
        temperature: float | None,
        mask: torch.Tensor,
        clipped: torch.Tensor,
    ) -> StepExtras:
        s = self.schedule
        columns: dict[str, object] = {
            "aggregation": aggregation,
            "active_channels": ",".join(c for c, on in zip(s.channels, mask.tolist(), strict=True) if on),
        }
        scalars = {f"{RECIPE_SCALARS}per_channel_normalization": 0.0 if aggregation == "grpo" else 1.0}
        if s.algo == "gdpo-dynamic":
            columns["temperature"] = float("nan") if temperature is None else temperature
            scalars[f"{RECIPE_SCALARS}temperature"] = float("nan") if temperature is None else temperature
        for k, channel in enumerate(s.channels):
            scalars[f"{RECIPE_SCALARS}active/{channel}"] = float(mask[k])
            if s.clip_when_std_above is not None:
                scalars[f"{RECIPE_SCALARS}clipped/{channel}"] = float(clipped[k])
        raw_columns = {}
        for condition in s.conditions:
            k = s.channels.index(condition.channel)
            raw_columns[condition.channel] = raw[:, k].cpu()
        return StepExtras(
            rewards=values.cpu() if s.conditions else None,
            raw_rewards=raw_columns,
            columns=columns,
            scalars=scalars,
        )

    def switch(self, step: int, reason: str) -> bool:
        """Fire the on-finding switch: the algorithm after it holds from ``step``. False if it fired already."""
        if self.schedule.hybrid is None or self.schedule.hybrid.step is not None or self.switched_at is not None:
            return False
        self.switched_at, self.switch_reason = step, reason
        return True

    def save(self, directory: Path) -> None:
        """Write the EMA and the switch point next to a checkpoint."""
        extra = {"switched_at": self.switched_at, "switch_reason": self.switch_reason}
        save_state(directory / STATE_FILE, self.schedule.channels, self.ema, extra)

    def load(self, directory: Path) -> bool:
        """Restore what :meth:`save` wrote; False when the checkpoint has nothing for these channels."""
        state = load_state(directory / STATE_FILE, self.schedule.channels)
        if state is None:
            return False
        if state.get("ema") is not None:
            self.ema = torch.tensor(state["ema"], dtype=torch.float64)
        switched = state.get("switched_at")
        self.switched_at = int(switched) if isinstance(switched, int) and not math.isnan(switched) else None
        self.switch_reason = state.get("switch_reason")
        return True


def scheduled_advantages(plan: RetrainPlan, checkpoint: Path | None = None) -> ScheduledAdvantages:
    """The scheduled advantages of a plan with recipes (its state restored from ``checkpoint`` when resuming)."""
    assert plan.schedule is not None
    s = plan.settings
    scheduled = ScheduledAdvantages(
        plan.schedule,
        base_weights=tuple(plan.weights[c] for c in plan.channels),
        step_of=lambda: 0,
        scale=plan.options.scale,
        alpha=s.reward_weights_ema_alpha,
        lower=s.reward_weight_min,
        upper=s.reward_weight_max,
    )
    if checkpoint is not None:
        scheduled.load(checkpoint)
    return scheduled
