"""Run as ``python -m tests.unit.integrations.tracker_run OUT AGGREGATION``: a plain GRPOTrainer with the callback,
reporting to TensorBoard and to an MLflow file store under ``OUT/mlruns``, for ``test_tracker_only_scan.py``.

Three rewards whose diagnosis follows from their definitions: ``always`` is 1 for every completion, ``coin`` is 0
or 1 by the parity of the completion's characters, ``fine`` is a hundredth of a hash in 0..10 (a spread of 0.1). The
learning rate is tiny so the policy stays as diverse as at its start (6 sampled characters: no two completions of a
group alike) and the rewards keep their spreads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

CHANNELS = ("always", "coin", "fine")


def always(completions: list[str], **_: Any) -> list[float]:
    return [1.0 for _ in completions]


def coin(completions: list[str], **_: Any) -> list[float]:
    return [float(sum(map(ord, c)) % 2) for c in completions]


def fine(completions: list[str], **_: Any) -> list[float]:
    return [(sum(map(ord, c)) * 7 % 11) / 100 for c in completions]


def main(out: Path, aggregation: str) -> None:
    os.environ.update(MLFLOW_TRACKING_URI=f"file:{out}/mlruns", MLFLOW_ALLOW_FILE_STORE="true")
    from collapse_doctor.integrations.trl import CollapseDoctorCallback
    from tests.unit.integrations.tiny_trainer import make_trainer, train

    callback = CollapseDoctorCallback(write_every=2, print_finding=None, check_budget=1.0)
    trainer = make_trainer(
        out,
        steps=24,
        callbacks=[callback],
        funcs=[always, coin, fine],
        reward_weights=[1.0, 1.0, 1.0],
        logging_steps=1,
        learning_rate=1e-6,
        report_to=["tensorboard", "mlflow"],
        multi_objective_aggregation=aggregation,
    )
    train(trainer)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
