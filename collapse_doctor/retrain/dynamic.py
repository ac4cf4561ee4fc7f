"""gdpo-dynamic's state across steps: the EMA of each channel's advantage spread.

The math is in :mod:`collapse_doctor.engine.advantages` (shared with ``scan``); this holds the one piece of
state (the EMA) between generation batches and saves it with each checkpoint so ``--resume`` goes on
with the same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from collapse_doctor.core import json_text
from collapse_doctor.engine.advantages import (
    Segments,
    channel_advantage_std,
    clipped_channel_advantages,
    dynamic_channel_weights,
    gdpo_advantages,
    group_zscores,
    update_std_ema,
)

STATE_FILE = "collapse_doctor_dynamic_weights.json"


@dataclass
class DynamicWeighting:
    """Turns each generation batch's rewards into gdpo-dynamic advantages and the weights used.

    >>> dw = DynamicWeighting(("a", "b", "c"), base_weights=(1.0, 1.0, 1.0))
    >>> r = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    >>> adv, w = dw.step(r, group_size=4)
    >>> [round(x, 3) for x in w.tolist()]  # `a` is constant in its group: it gets the lower bound
    [0.1, 0.45, 0.45]
    """

    channels: tuple[str, ...]
    base_weights: tuple[float, ...]
    alpha: float = 0.05
    temperature: float = 0.5
    lower: float = 0.1
    upper: float = 0.5
    clip: float = 2.0
    ema: torch.Tensor | None = None
    last_weights: torch.Tensor | None = field(default=None)
    _layout: dict[tuple[int, int, str], tuple[Segments, Segments]] = field(default_factory=dict, repr=False)

    def _segments(self, n: int, group_size: int, device: torch.device) -> tuple[Segments, Segments]:
        """Group and step segments of a batch of ``n`` rows in consecutive groups (the same every step)."""
        key = (n, group_size, str(device))
        if key not in self._layout:
            groups = Segments.build(torch.arange(n, device=device) // group_size)
            steps = Segments.build(torch.zeros(n, dtype=torch.int64, device=device))
            self._layout[key] = (groups, steps)
        return self._layout[key]

    def step(self, rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages ``[N]`` for one generation batch (TRL layout: consecutive groups) and its weights ``[C]``."""
        rewards = rewards.float()
        groups, steps = self._segments(rewards.shape[0], group_size, rewards.device)
        clipped = clipped_channel_advantages(group_zscores(rewards, groups), self.clip)
        self.ema = update_std_ema(self.ema, channel_advantage_std(clipped).cpu(), self.alpha)
        weights = dynamic_channel_weights(
            self.ema,
            temperature=self.temperature,
            lower=self.lower,
            upper=self.upper,
            base_weights=torch.tensor(self.base_weights, dtype=torch.float64),
        ).float()
        self.last_weights = weights
        advantages = gdpo_advantages(
            rewards, groups, weights=weights.to(rewards.device), step_index=steps, zscores=clipped
        )
        return advantages, weights

    def save(self, directory: Path) -> None:
        """Write the EMA next to a checkpoint."""
        extra = {"weights": None if self.last_weights is None else self.last_weights.tolist()}
        save_state(directory / STATE_FILE, self.channels, self.ema, extra)

    def load(self, directory: Path) -> bool:
        """Restore the EMA saved with a checkpoint; False when the checkpoint has none for these channels."""
        state = load_state(directory / STATE_FILE, self.channels)
        if state is None or state.get("ema") is None:
            return False
        self.ema = torch.tensor(state["ema"], dtype=torch.float64)
        return True


def save_state(path: Path, channels: tuple[str, ...], ema: torch.Tensor | None, extra: dict[str, Any]) -> None:
    """A checkpoint's JSON state of the per-step weights: the channels, the std EMA, and ``extra``."""
    state = {"channels": list(channels), "ema": None if ema is None else ema.tolist(), **extra}
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def load_state(path: Path, channels: tuple[str, ...]) -> dict[str, Any] | None:
    """What :func:`save_state` wrote, or ``None`` when there is none, or one for other channels."""
    if not path.is_file():
        return None
    state = json_text.loads(path.read_text(encoding="utf-8"))
    return state if tuple(state.get("channels", ())) == channels else None
