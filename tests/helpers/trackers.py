"""Tracker files written by the real libraries (wandb offline, trackio, mlflow), the way TRL and verl call them.

Each tracker writes in a subprocess of its own (``python -m tests.helpers.trackers SPEC``), as a training
process would: trackio reads ``TRACKIO_DIR`` once at import, and wandb and mlflow keep global state. The three
run in parallel. What each trainer calls, checked in transformers 5.24 and verl's ``utils/tracking.py``:

- TRL ``report_to="wandb"``: ``WandbCallback`` declares ``define_metric("train/global_step")`` and
  ``define_metric("*", step_metric="train/global_step", step_sync=True)``, then per logging step
  ``wandb.log({"train/<key>": v, ..., "train/global_step": step})`` (no ``step=``: wandb's ``_step`` counts calls).
- TRL ``report_to="trackio"``: ``TrackioCallback``: ``trackio.log({"train/<key>": v, ..., "train/global_step": step})``.
- TRL ``report_to="mlflow"``: ``MLflowCallback``: ``mlflow.log_metrics({<key>: v, ..., "epoch": e}, step=step)``
  with the trainer's own keys (no ``train/`` prefix).
- verl ``trainer.logger=[...]``: ``wandb.log(data, step=step)``, ``trackio.log(data, step)``,
  ``mlflow.log_metrics(data, step=step)`` (experiment = project, run name = experiment name).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.paths import ROOT


@dataclass
class TrackerRun:
    """One run to log: its trainer's conventions, where, and the series (TensorBoard tag names) at ``steps``."""

    tracker: str
    """``wandb``, ``trackio``, ``mlflow_db`` or ``mlflow_files``."""
    trainer: str
    """``trl`` (through transformers' callback) or ``verl`` (its ``Tracking`` adapters)."""
    name: str
    store: str
    """wandb: the ``dir``; trackio: ``TRACKIO_DIR``; mlflow: the database file or the file store directory."""
    project: str = "collapse-doctor-tests"
    series: dict[str, list[float]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """Other values logged at every step (a string, a nested dict), which are no scalar series."""
    create_run: bool = True
    """False: only the project / experiment is created (an empty store)."""
    delete: bool = False
    """MLflow: the run is deleted after it logged (``mlflow.delete_run``)."""


def tracker_run(
    tracker: str,
    trainer: str,
    name: str,
    store: Path,
    series: Mapping[str, np.ndarray],
    steps: Sequence[int],
    *,
    project: str = "collapse-doctor-tests",
    create_run: bool = True,
    delete: bool = False,
    **extra: Any,
) -> TrackerRun:
    return TrackerRun(
        project=project,
        create_run=create_run,
        delete=delete,
        tracker=tracker,
        trainer=trainer,
        name=name,
        store=str(store),
        series={tag: [float(v) for v in values] for tag, values in series.items()},
        steps=[int(s) for s in steps],
        extra=extra,
    )


def write_runs(runs: Sequence[TrackerRun], workdir: Path) -> Callable[[], None]:
    """Start writing every run with its tracker's library (one subprocess per tracker, in parallel); the
    function returned waits for them (and raises with a writer's output when one failed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    by_tracker: dict[str, list[TrackerRun]] = {}
    for run in runs:
        by_tracker.setdefault(run.tracker.split("_")[0], []).append(run)
    procs = []
    for tracker, group in by_tracker.items():
        spec = workdir / f"{tracker}.json"
        spec.write_text(json.dumps([asdict(r) for r in group]))
        env = {
            **os.environ,
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_DISABLE_GIT": "true",
            "MLFLOW_ALLOW_FILE_STORE": "true",
            "PYTHONPATH": str(ROOT),
        }
        if tracker == "trackio":
            env["TRACKIO_DIR"] = group[0].store
        cmd = [sys.executable, "-m", "tests.helpers.trackers", str(spec)]
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append((tracker, proc))

    def wait() -> None:
        for tracker, proc in procs:
            out, _ = proc.communicate(timeout=300)
            if proc.returncode:
                raise RuntimeError(f"writing the {tracker} runs failed:\n{out.decode(errors='replace')[-4000:]}")

    return wait


def _rows(run: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    series = run["series"]
    return [
        (step, {tag: values[i] for tag, values in series.items()} | run["extra"]) for i, step in enumerate(run["steps"])
    ]


def _untagged(tag: str) -> str:
    """The trainer's own key of a TensorBoard tag (``train/kl`` -> ``kl``), as MLflowCallback logs it."""
    return tag[len("train/") :] if tag.startswith("train/") else tag


def _write_wandb(runs: list[dict[str, Any]]) -> None:
    import wandb

    written: dict[str, str] = {}
    for run in runs:
        settings = wandb.Settings(x_disable_stats=True, console="off", disable_git=True)
        live = wandb.init(mode="offline", dir=run["store"], project=run["project"], name=run["name"], settings=settings)
        if run["trainer"] == "trl":
            wandb.define_metric("train/global_step")
            wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
        for step, row in _rows(run):
            if run["trainer"] == "trl":
                wandb.log({**row, "train/global_step": step})
                # GRPOTrainer(log_completions=True) logs the step's completions as a table after its metrics
                table = wandb.Table(columns=["step", "prompt", "completion"], data=[[str(step), "p", "c"]])
                wandb.log({"completions": table})
            else:
                wandb.log(row, step=step)
        written[run["name"]] = str(Path(live.dir).parent)
        live.finish()
    Path("wandb-runs.json").write_text(json.dumps(written))


def _write_trackio(runs: list[dict[str, Any]]) -> None:
    import trackio

    for run in runs:
        trackio.init(project=run["project"], name=run["name"])
        for step, row in _rows(run):
            if run["trainer"] == "trl":
                trackio.log({**row, "train/global_step": step})
            else:
                trackio.log(row, step)
        trackio.finish()


def _write_mlflow(runs: list[dict[str, Any]]) -> None:
    import mlflow
    from mlflow.entities import Metric

    for run in runs:
        store = Path(run["store"])
        uri = f"sqlite:///{store}" if run["tracker"] == "mlflow_db" else store.as_uri()
        mlflow.set_tracking_uri(uri)
        experiment = mlflow.set_experiment(run["project"])
        if not run["create_run"]:
            continue
        with mlflow.start_run(experiment_id=experiment.experiment_id, run_name=run["name"]) as live:
            # The rows log_metrics(numbers, step=step) writes once per step, written in a few batches (fast).
            metrics = []
            for step, row in _rows(run):
                numbers = {k: v for k, v in row.items() if isinstance(v, float)}
                if run["trainer"] == "trl":
                    numbers = {_untagged(k): v for k, v in numbers.items()} | {"epoch": step / 100}
                stamp = 1_700_000_000_000 + step
                metrics += [Metric(key, value, stamp, step) for key, value in numbers.items()]
            client = mlflow.MlflowClient()
            for lo in range(0, len(metrics), 1000):
                client.log_batch(live.info.run_id, metrics=metrics[lo : lo + 1000])
        if run["delete"]:
            mlflow.delete_run(live.info.run_id)


def main(spec: str) -> None:
    runs = json.loads(Path(spec).read_text())
    writer = {"wandb": _write_wandb, "trackio": _write_trackio, "mlflow": _write_mlflow}[
        runs[0]["tracker"].split("_")[0]
    ]
    writer(runs)


if __name__ == "__main__":
    main(sys.argv[1])


# The corpus the tracker tests share: the same series through TensorBoard and through every tracker.

STEPS = np.arange(2, 402, 2)
"""TRL's global steps with ``logging_steps=2``: not wandb's call count or trackio's own step, so a reader that
takes the wrong step puts every finding's onset elsewhere."""
NAN_TAG = "train/always_nan"
"""Logged as NaN at every step of the TRL runs (besides a string and a nested dict, which are no scalars)."""
VERL_KEYS = {
    "train/reward": "critic/score/mean",
    "train/entropy": "actor/entropy",
    "train/kl": "actor/kl_loss",
    "train/grad_norm": "actor/grad_norm",
}
"""verl's names for some of TRL's series (the same quantities, logged by verl's trainer)."""


@dataclass(frozen=True)
class Corpus:
    """Where each run of the shared corpus is."""

    root: Path
    events_trl: Path
    events_verl: Path
    wandb: Path
    """``<dir>/wandb``: run directories ``offline-run-*`` of ``trl-collapsed`` and ``verl-collapsed``."""
    wandb_runs: dict[str, Path]
    """The run directory of each W&B run, by name."""
    trackio: Path
    """``TRACKIO_DIR``: ``trl-project.db`` (``trl-collapsed``, ``trl-healthy``), ``verl-project.db``."""
    mlflow_db: Path
    """Experiments ``trl`` (``trl-collapsed``, ``no-metrics``, ``deleted``) and ``verl`` (``verl-collapsed``)."""
    mlruns: Path
    """A file store with experiment ``trl``: ``trl-collapsed`` (and ``deleted``)."""
    empty_db: Path
    """An MLflow store with an experiment and no run."""


def verl_series(series: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {verl: series[trl] for trl, verl in VERL_KEYS.items()}


_CORPUS: list[Corpus] = []


def _corpus_at(root: Path) -> Corpus:
    written = root / "writers" / "wandb-runs.json"
    wandb_runs = {n: Path(d) for n, d in json.loads(written.read_text()).items()} if written.exists() else {}
    return Corpus(
        root=root,
        events_trl=root / "events" / "trl",
        events_verl=root / "events" / "verl",
        wandb=root / "wandb-dir" / "wandb",
        wandb_runs=wandb_runs,
        trackio=root / "trackio",
        mlflow_db=root / "mlflow" / "mlflow.db",
        mlruns=root / "mlflow-files" / "mlruns",
        empty_db=root / "mlflow-empty" / "mlflow.db",
    )


def shared_tracker_corpus(factory: Any) -> Corpus:
    """The corpus for a test session (``factory``: pytest's ``tmp_path_factory``): written once, by the first
    xdist worker that asks, and read by the others (the tests only read it)."""
    if _CORPUS:
        return _CORPUS[0]
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root, done, failed = shared / "tracker-corpus", shared / "tracker-corpus.done", shared / "tracker-corpus.failed"
    try:
        root.mkdir()
    except FileExistsError:
        deadline = time.monotonic() + 300
        while not done.exists():
            if failed.exists() or time.monotonic() > deadline:
                raise RuntimeError(f"another worker did not write the tracker corpus in {root}") from None
            time.sleep(0.2)
        _CORPUS.append(_corpus_at(root))
        return _CORPUS[0]
    try:
        corpus = tracker_corpus(root)
    except BaseException:
        failed.touch()
        raise
    done.touch()
    return corpus


def tracker_corpus(root: Path) -> Corpus:
    """Write the corpus under ``root`` once per process (wandb's offline init is the slow part)."""
    if _CORPUS:
        return _CORPUS[0]
    from tests.helpers.scalar_runs import collapsed_series, trl_series, write_events

    collapsed, healthy = collapsed_series(0), trl_series(0)
    corpus = _corpus_at(root)
    for path in (corpus.mlflow_db, corpus.mlruns, corpus.empty_db):
        path.parent.mkdir(parents=True, exist_ok=True)
    verl = verl_series(collapsed)
    noise = {"train/completions/sample": "text, not a scalar", "train/nested": {"a": 1.0}, NAN_TAG: float("nan")}
    runs = [
        tracker_run("wandb", "trl", "trl-collapsed", corpus.wandb.parent, collapsed, STEPS, **noise),
        tracker_run("wandb", "verl", "verl-collapsed", corpus.wandb.parent, verl, STEPS),
        tracker_run(
            "trackio", "trl", "trl-collapsed", corpus.trackio, collapsed, STEPS, project="trl-project", **noise
        ),
        tracker_run("trackio", "trl", "trl-healthy", corpus.trackio, healthy, STEPS, project="trl-project"),
        tracker_run("trackio", "verl", "verl-collapsed", corpus.trackio, verl, STEPS, project="verl-project"),
        tracker_run("mlflow_db", "trl", "trl-collapsed", corpus.mlflow_db, collapsed, STEPS, project="trl", **noise),
        tracker_run("mlflow_db", "trl", "deleted", corpus.mlflow_db, healthy, STEPS[:5], project="trl", delete=True),
        tracker_run("mlflow_db", "trl", "no-metrics", corpus.mlflow_db, {}, [], project="trl"),
        tracker_run("mlflow_db", "verl", "verl-collapsed", corpus.mlflow_db, verl, STEPS, project="verl"),
        tracker_run("mlflow_files", "trl", "trl-collapsed", corpus.mlruns, collapsed, STEPS, project="trl", **noise),
        tracker_run("mlflow_files", "trl", "deleted", corpus.mlruns, healthy, STEPS[:5], project="trl", delete=True),
        tracker_run("mlflow_db", "trl", "", corpus.empty_db, {}, [], project="empty", create_run=False),
    ]
    wait = write_runs(runs, root / "writers")
    write_events(corpus.events_trl, collapsed, STEPS)
    write_events(corpus.events_verl, verl, STEPS)
    wait()
    written = json.loads((root / "writers" / "wandb-runs.json").read_text())
    corpus.wandb_runs.update({name: Path(directory) for name, directory in written.items()})
    _CORPUS.append(corpus)
    return corpus


TRACKER_KINDS = ("wandb", "trackio", "mlflow_db", "mlflow_files")
"""The format registry's kinds of tracker files."""


_ONE_POINT: dict[str, Path] = {}


def one_point_file(kind: str, root: Path) -> Path:
    """A tracker file of format ``kind`` holding one run with one scalar point (``train/kl`` = 0.1 at step 1).

    The first call writes one of every kind under ``root`` (the trackers in parallel); later calls in the
    process return those files (they are only read).
    """
    if not _ONE_POINT:
        stores = {
            "wandb": root,
            "trackio": root / "trackio",
            "mlflow_db": root / "mlflow.db",
            "mlflow_files": root / "mlruns",
        }
        series = {"train/kl": np.array([0.1])}
        # MLflowCallback would add `epoch`: the MLflow files get verl's calls, one key as logged.
        runs = [
            tracker_run(k, "trl" if k in ("wandb", "trackio") else "verl", "run", stores[k], series, [1])
            for k in stores
        ]
        write_runs(runs, root / "writer")()
        _ONE_POINT["wandb"] = next(root.glob("wandb/offline-run-*/run-*.wandb"))
        _ONE_POINT["trackio"] = root / "trackio" / "collapse-doctor-tests.db"
        _ONE_POINT["mlflow_db"] = root / "mlflow.db"
        _ONE_POINT["mlflow_files"] = next(p for p in (root / "mlruns").glob("*/meta.yaml") if p.parent.name != "0")
    return _ONE_POINT[kind]
