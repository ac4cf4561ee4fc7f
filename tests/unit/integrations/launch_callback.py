"""Run under ``torchrun --nproc_per_node 2 -m``: a plain GRPOTrainer with the callback and ``fail_on``.

Each process writes what it saw to ``OUT/rank-<i>.json`` (the step it stopped at, the findings that stopped it,
whether the callback switched itself off), for ``test_trl_launch.py`` to compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    from collapse_doctor.integrations.trl import CollapseDoctorCallback
    from tests.unit.integrations.tiny_trainer import make_trainer, train

    callback = CollapseDoctorCallback(fail_on="info", write_every=1, check_budget=1.0, print_finding=None)
    # 2 prompts x 4 completions on each of the 2 processes: 16 completions a step in all
    trainer = make_trainer(out, steps=12, callbacks=[callback], report_to=[], per_device_train_batch_size=8)
    train(trainer)
    seen = {
        "step": trainer.state.global_step,
        "stopped_by": [f.code for f in callback.stopped_by],
        "error": callback.error,
        "files_written": callback.monitor.files_written if callback.monitor else None,
    }
    (out / f"rank-{trainer.accelerator.process_index}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
