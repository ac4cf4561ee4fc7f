"""A plain ``trl.GRPOTrainer`` (or ``trl.RLOOTrainer``) on the demo task with the tiny model built in code (no
download), for these tests."""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from collapse_doctor.retrain.data import to_dataset
from collapse_doctor.retrain.demo import build_char_tokenizer, build_tiny_model, demo_rows
from collapse_doctor.retrain.rewards import format_tag

GROUP = 4
CHANNELS = ("format_tag", "graded", "sometimes")
WEIGHTS = (1.0, 0.5, 2.0)


def graded(completions: list[str], **_: Any) -> list[float | None]:
    """A continuous reward that varies within groups (a hash of the text)."""
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


def sometimes(completions: list[str], **_: Any) -> list[float | None]:
    """Not applicable (None -> NaN) for a third of the completions."""
    return [None if len(c) % 3 == 0 else len(c) / 10 for c in completions]


class RewardSpy:
    """Every list each reward function returned, in call order (one call per generation batch)."""

    def __init__(self) -> None:
        self.returned: dict[str, list[list[float | None]]] = {c: [] for c in CHANNELS}

    def wrap(self, func: Any) -> Any:
        def spied(**kwargs: Any) -> list[float | None]:
            out = list(func(**kwargs))
            self.returned[func.__name__].append(out)
            return out

        spied.__name__ = func.__name__
        return spied


def make_trainer(
    out: Path,
    *,
    steps: int,
    callbacks: list[Any],
    spy: RewardSpy | None = None,
    funcs: list[Any] | None = None,
    rloo: bool = False,
    **config: Any,
) -> Any:
    """A plain TRL GRPOTrainer on the demo task: 4 prompts x 4 completions per process and step, 6 tokens.

    ``funcs``: other reward functions than the three above (give ``reward_weights`` with them). ``rloo``: TRL's
    ``RLOOTrainer`` with the same settings (its ``beta``, default 0.05, and ``normalize_advantages`` in ``config``)."""
    tokenizer = build_char_tokenizer()
    funcs = funcs or [format_tag, graded, sometimes]
    settings: dict[str, Any] = {
        "output_dir": str(out),
        "max_steps": steps,
        "per_device_train_batch_size": 4 * GROUP,
        "num_generations": GROUP,
        "max_completion_length": 6,
        "learning_rate": 0.02,
        "reward_weights": list(WEIGHTS),
        "logging_steps": 2,
        "save_strategy": "no",
        "report_to": ["tensorboard"],
        "seed": 0,
        "bf16": False,
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **config,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = (RLOOConfig if rloo else GRPOConfig)(**settings)
    model = build_tiny_model(tokenizer, seed=0)
    if rloo and args.beta != 0.0:
        # RLOO's reference model is loaded from the policy's path: give the tiny model one
        saved = out.parent / f"{out.name}-tiny-model"
        model.save_pretrained(saved)
        model.config._name_or_path = str(saved)
    return (RLOOTrainer if rloo else GRPOTrainer)(
        model=model,
        reward_funcs=[spy.wrap(f) for f in funcs] if spy is not None else funcs,
        args=args,
        train_dataset=to_dataset(demo_rows()),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def train(trainer: Any) -> None:
    """``trainer.train()`` without transformers 5's deprecation notices (nothing a test acts on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer.train()


def train_recording_loss_advantages(trainer: Any) -> list[Any]:
    """:func:`train`, keeping the advantages each ``_compute_loss`` call received (what the loss trained on), for
    GRPOTrainer and RLOOTrainer alike."""
    import pytest

    seen: list[Any] = []
    cls = type(trainer)
    original = cls._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        seen.append(inputs["advantages"].detach().clone())
        return original(self, model, inputs)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(cls, "_compute_loss", spy)
    try:
        train(trainer)
    finally:
        monkeypatch.undo()
    return seen


def two_processes(*module_and_args: str) -> list[str]:
    """``torchrun`` starting ``python -m MODULE ARGS`` on 2 CPU processes (skips the test without torchrun).

    Not ``accelerate launch --cpu``: with ``--cpu``, accelerate 1.15 starts one process whatever ``--num_processes``
    says. TRL and accelerate pick the two processes up from torchrun's environment (gloo).
    """
    launcher = Path(sys.executable).with_name("torchrun")
    if not launcher.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun not installed")
    return [str(launcher if launcher.exists() else "torchrun"), "--nproc_per_node", "2", "-m", *module_and_args]
