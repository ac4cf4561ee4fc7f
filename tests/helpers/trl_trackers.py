"""A tiny TRL run that logs its completions table to W&B (offline) and Trackio, as a user's run with
``report_to=["wandb", "trackio"]`` and ``log_completions=True`` does, in a process of its own (wandb and trackio
keep global state, trackio reads ``TRACKIO_DIR`` at import).

``python -m tests.helpers.trl_trackers OUT [--rloo] [--beta B] [--callback] [--unique-prompts] [--steps N]``
trains under ``OUT/train`` (the callback's rollouts and TensorBoard there, TRL's ``completions/`` for GRPO) with the
trackers' files under ``OUT/trackers`` (``wandb/``, ``trackio/<project>.db``). :func:`train_with_trackers` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import ROOT

TRACKIO_PROJECT = "collapse-doctor-tables"


def train_with_trackers(out: Path, *args: str, in_output_dir: bool = False) -> Path:
    """Run this module in a fresh process (raises with its output when training failed); returns where the
    trackers wrote: ``OUT/trackers``, or with ``in_output_dir`` the trainer's output dir ``OUT/train`` (a
    ``wandb/`` and ``trackio/`` beside TRL's own files)."""
    trackers = out / "train" if in_output_dir else out / "trackers"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DIR": str(trackers),
        "TRACKIO_DIR": str(trackers / "trackio"),
        "PYTHONPATH": str(ROOT),
    }
    trackers.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.trl_trackers", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"training with trackers failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return trackers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rloo", action="store_true")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--unique-prompts", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from collapse_doctor.integrations.trl import CollapseDoctorCallback
    from tests.unit.integrations.tiny_trainer import make_trainer, train

    config = {"beta": args.beta} if args.rloo else {}
    trainer = make_trainer(
        args.out / "train",
        steps=args.steps,
        callbacks=[CollapseDoctorCallback(write_every=3)] if args.callback else [],
        rloo=args.rloo,
        report_to=["wandb", "trackio"],
        log_completions=True,
        log_unique_prompts=args.unique_prompts,
        logging_steps=1,
        project=TRACKIO_PROJECT,
        **config,
    )
    train(trainer)


if __name__ == "__main__":
    main()
