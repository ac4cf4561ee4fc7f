#!/usr/bin/env python
"""Does CollapseDoctorCallback cost the user's own metrics a point? A tiny real TRL run per tracker, with and without.

For each tracker (W&B offline, Trackio, MLflow file store, MLflow sqlite, TensorBoard) a fresh process trains the
tiny model of tests/unit/integrations/tiny_trainer.py for 8 steps (``logging_steps=2``) with ``report_to`` that
tracker, once without the callback and once with ``CollapseDoctorCallback(write_every=2)``; the points of every
metric are counted from the tracker's own files. A user metric that has fewer points with the callback, or a
callback series with fewer points than the user's, is a failure (exit 1).

    .venv/bin/python benchmarks/tracker_matrix.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACKERS = ("wandb", "trackio", "mlflow-file", "mlflow-sqlite", "tensorboard")
REPORT_TO = {"mlflow-file": "mlflow", "mlflow-sqlite": "mlflow"}


def train(tracker: str, with_callback: bool, out: Path) -> None:
    """In this process: the environment the tracker writes offline under ``out``, then one training run."""
    if tracker == "mlflow-file":
        os.environ.update(MLFLOW_TRACKING_URI=f"file:{out}/mlruns", MLFLOW_ALLOW_FILE_STORE="true")
    elif tracker == "mlflow-sqlite":
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{out}/mlflow.db"
    elif tracker == "wandb":
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(out), WANDB_SILENT="true")
    elif tracker == "trackio":
        os.environ["TRACKIO_DIR"] = str(out / "trackio")
    sys.path.insert(0, str(ROOT))
    from collapse_doctor.integrations.trl import CollapseDoctorCallback
    from tests.unit.integrations.tiny_trainer import make_trainer
    from tests.unit.integrations.tiny_trainer import train as run

    callbacks = [CollapseDoctorCallback(write_every=2, print_finding=None, check_budget=1.0)] if with_callback else []
    trainer = make_trainer(out / "trl", steps=8, callbacks=callbacks, report_to=[REPORT_TO.get(tracker, tracker)])
    run(trainer)


def count(tracker: str, out: Path) -> dict[str, int]:
    """Points per metric, read from the tracker's files."""
    counts: Counter[str] = Counter()
    if tracker == "mlflow-file":
        for path in glob.glob(f"{out}/mlruns/*/*/metrics/**", recursive=True):
            if os.path.isfile(path):
                with open(path) as lines:
                    counts[path.split("/metrics/", 1)[1]] = sum(1 for _ in lines)
    elif tracker == "mlflow-sqlite":
        # MLflow's sqlite store keeps one row per (key, timestamp in ms, step, value): transformers logs `epoch` twice
        # at the last step with the same value, and when both calls fall in one millisecond the store has one row.
        # A point is what the store can tell apart whatever the timing: a distinct (step, value) of the key.
        query = "select key, count(*) from (select distinct key, step, value, is_nan from metrics) group by key"
        with sqlite3.connect(f"{out}/mlflow.db") as db:
            counts.update(dict(db.execute(query).fetchall()))
    elif tracker == "trackio":
        for path in glob.glob(f"{out}/trackio/*.db"):
            with sqlite3.connect(path) as db:
                for (metrics,) in db.execute("select metrics from metrics"):
                    counts.update(json.loads(metrics).keys())
    elif tracker == "wandb":
        import numpy as np

        from collapse_doctor.io.logs.wandb_log import read_wandb_log

        for path in sorted(set(glob.glob(f"{out}/**/*.wandb", recursive=True))):
            read = read_wandb_log(path)
            points = np.bincount(read.tag_index, minlength=len(read.tag_names)).tolist()
            counts.update(dict(zip(read.tag_names, points, strict=True)))
    else:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        for directory in {str(Path(p).parent) for p in glob.glob(f"{out}/trl/runs/**/events*", recursive=True)}:
            events = EventAccumulator(directory, size_guidance={"scalars": 0})
            events.Reload()
            for tag in events.Tags()["scalars"]:
                counts[tag] += len(events.Scalars(tag))
    return {k: v for k, v in counts.items() if not k.startswith("_")}


def main() -> int:
    if len(sys.argv) == 4:  # the child: train one run
        train(sys.argv[1], sys.argv[2] == "on", Path(sys.argv[3]))
        return 0
    sys.path.insert(0, str(ROOT))
    failed = False
    print("| tracker | user metrics | user points without / with the callback | callback series (points) | result |")
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for tracker in TRACKERS:
            runs = {}
            for mode in ("off", "on"):
                out = Path(tmp) / f"{tracker}-{mode}"
                out.mkdir()
                subprocess.run(
                    [sys.executable, __file__, tracker, mode, str(out)], check=True, capture_output=True, cwd=ROOT
                )
                runs[mode] = count(tracker, out)
            user = {k: v for k, v in runs["off"].items()}
            with_callback = {k: runs["on"].get(k, 0) for k in user}
            ours = {k: v for k, v in runs["on"].items() if "collapse_doctor" in k}
            lost = {k: (v, with_callback[k]) for k, v in user.items() if with_callback[k] != v}
            expected = max(user.values(), default=0)
            short = {k: v for k, v in ours.items() if v < min(expected, 4)}
            ok = bool(user) and bool(ours) and not lost and not short
            failed |= not ok
            points = ", ".join(str(p) for p in sorted(set(ours.values())))
            result = "ok" if ok else f"FAIL lost {lost} short {short}"
            print(
                f"| {tracker} | {len(user)} | {sum(user.values())} / {sum(with_callback.values())} | "
                f"{len(ours)} ({points}) | {result} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
