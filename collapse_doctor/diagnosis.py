"""``diagnose(paths) -> Diagnosis``: read a run, recompute advantages, reduce to series, run detectors.

This is the library behind ``collapse-doctor scan``; the CLI only renders what it returns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_doctor.config import Config, check_fail_on, load_config
from collapse_doctor.detectors import REGISTRY, DetectionContext, Finding, Severity
from collapse_doctor.detectors.base import select
from collapse_doctor.errors import InputError, UsageError
from collapse_doctor.memory import release_free_memory
from collapse_doctor.series import RunSeries, SeriesBuilder, channel_pairs

if TYPE_CHECKING:
    from collapse_doctor.batching import StackedChunk
    from collapse_doctor.io.sources import ScalarCache
    from collapse_doctor.scalars import ScalarSeries
    from collapse_doctor.stats import ChunkInput

ALGORITHMS = ("auto", "grpo", "gdpo")
ALGO_MATCH_MAE = 0.01
"""Logged advantages within this mean absolute difference of a recomputation identify the algorithm."""
VERDICTS = {"healthy": "HEALTHY", "at_risk": "AT RISK", "collapsed": "COLLAPSED"}
JSON_FORMAT_VERSION = 1
SCAN_CHUNK_ROWS = 1 << 18
"""Rows per statistics pass: the statistics make many temporaries, so smaller chunks keep the peak low."""
TRIM_EVERY_ROWS = 1 << 20
"""Give freed heap memory back to the OS this often (see collapse_doctor.memory)."""

ChunkCollector = Callable[[np.ndarray, "ChunkInput"], None]
"""Called once per chunk with the chunk's step numbers ``[S]`` (ascending) and its ChunkInput."""


@dataclass(frozen=True)
class RunSummary:
    """What was read: sizes, channels, weights and the aggregation the run used."""

    sources: tuple[str, ...]
    steps: int
    rollouts: int
    groups: int
    group_size_min: int
    group_size_max: int
    first_step: int | None
    last_step: int | None
    channels: tuple[str, ...]
    weights: dict[str, float]
    algorithm: str
    algorithm_source: str
    logged_advantage: bool
    device: str
    warnings: tuple[str, ...] = ()
    ground_truth: dict[str, Any] | None = None
    name: str | None = None
    """The run's name when the input held several runs (a log directory with one subdirectory per run)."""
    scalar_points: int = 0
    """Scalar points read from the run's scalar log (every point, before duplicates were dropped)."""
    scalar_framework: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return ({"name": self.name} if self.name is not None else {}) | {
            "sources": list(self.sources),
            "steps": self.steps,
            "rollouts": self.rollouts,
            "groups": self.groups,
            "group_size": {"min": self.group_size_min, "max": self.group_size_max},
            "step_range": [self.first_step, self.last_step],
            "channels": list(self.channels),
            "weights": self.weights,
            "algorithm": self.algorithm,
            "algorithm_source": self.algorithm_source,
            "logged_advantage": self.logged_advantage,
            "device": self.device,
            "warnings": list(self.warnings),
            "scalar_points": self.scalar_points,
            "scalar_framework": self.scalar_framework,
        }


@dataclass(frozen=True)
class Diagnosis:
    """The result of a scan: verdict, findings (most severe first), run summary and per-step series."""

    verdict: str
    findings: tuple[Finding, ...]
    run: RunSummary
    series: RunSeries
    detectors: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    config: Config = field(default_factory=Config)
    seconds: float = 0.0
    scalars: ScalarSeries | None = None
    """The run's scalar log in canonical names (TensorBoard, trainer_state.json, verl file logger)."""

    def failing(self, fail_on: str | None = None) -> list[Finding]:
        """Findings at or above ``fail_on`` (crashed detectors always count, except with ``never``)."""
        level = check_fail_on(fail_on or self.config.fail_on)
        if level == "never":
            return []
        threshold = Severity[level.upper()]
        return [f for f in self.findings if f.severity >= threshold]

    def exit_code(self, fail_on: str | None = None) -> int:
        return 1 if self.failing(fail_on) else 0

    def channel_table(self) -> list[dict[str, Any]]:
        """Per channel: weight, rel_gain peak -> now, variance share, constant-group share.

        The peak is taken on rel_gain smoothed the way the detectors smooth it (a rolling median over
        half the persistence window), so it matches CD101's message; "now" is the median of the last
        10% of steps.
        """
        series = self.series
        if "rel_gain" not in series:
            from collapse_doctor.scalar_run import scalar_channel_table

            return scalar_channel_table(self)
        from collapse_doctor.series import rolling

        rows = []
        n = series.num_steps
        tail = slice(max(0, n - max(1, n // 10)), n)
        smoothing = max(1, self.config.persistence_steps(n) // 2) | 1  # as the detectors see it (CD101)
        for k, channel in enumerate(series.channels):
            raw = series["rel_gain"][:, k]
            rel = rolling(raw, smoothing)
            finite = np.isfinite(rel)
            peak = float(np.nanmax(rel)) if finite.any() else float("nan")
            peak_step = int(series.steps[int(np.nanargmax(np.where(finite, rel, -np.inf)))]) if finite.any() else None
            rows.append(
                {
                    "channel": channel,
                    "weight": self.run.weights.get(channel, 1.0),
                    "rel_gain_peak": peak,
                    "rel_gain_peak_step": peak_step,
                    "rel_gain_now": _median(raw[tail]),
                    "signal_share_grpo": _median(series["signal_share_grpo"][tail, k]),
                    "signal_share_gdpo": _median(series["signal_share_gdpo"][tail, k]),
                    "zero_variance_share": _median(series["channel_zero_var_share"][tail, k]),
                    "reward_mean": _median(series["reward_mean"][tail, k]),
                }
            )
        return rows

    def to_dict(self, *, include_series: bool = True) -> dict[str, Any]:
        from collapse_doctor.detectors.base import _plain

        out: dict[str, Any] = {
            "format_version": JSON_FORMAT_VERSION,
            "verdict": self.verdict,
            "fail_on": self.config.fail_on,
            "exit_code": self.exit_code(),
            "run": _plain(self.run.to_dict()),
            "channels": _plain(self.channel_table()),
            "detectors": {
                code: {"name": REGISTRY[code].name, "status": "skipped" if code in self.skipped else "ran"}
                | ({"reason": self.skipped[code]} if code in self.skipped else {})
                for code in self.detectors
            },
            "findings": [f.to_dict() for f in self.findings],
        }
        if include_series:
            out["series"] = self.series.to_json()
            if self.scalars is not None:
                out["scalars"] = self.scalars.to_json()
        return out

    def to_json(self, *, include_series: bool = True, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(include_series=include_series), indent=indent, allow_nan=False)


def _median(values: np.ndarray) -> float:
    from collapse_doctor.detectors.remedies import nanmedian

    return nanmedian(values)


def verdict_of(findings: Sequence[Finding]) -> str:
    """``collapsed`` with a critical finding, ``at_risk`` with a warning, else ``healthy``."""
    levels = {f.severity for f in findings}
    if Severity.CRITICAL in levels:
        return "collapsed"
    if Severity.WARNING in levels:
        return "at_risk"
    return "healthy"


def detect_algorithm(series: RunSeries, algo: str, rollout_files: Sequence[str | Path]) -> tuple[str, str]:
    """(algorithm, how it was decided): ``--algo``, else the logged advantages, else dynamic-weight columns."""
    from collapse_doctor.io.sources import DYNAMIC_WEIGHTS_SOURCE, dynamic_weight_channels

    algorithm, source = _detect_algorithm(series, algo)
    if algorithm == "unknown" and (dynamic := dynamic_weight_channels(rollout_files)):
        # gdpo-dynamic (collapse-doctor retrain) logs per-step weights; the recomputation uses fixed ones.
        algorithm, source = "gdpo", f"{DYNAMIC_WEIGHTS_SOURCE}: weight/ columns for {', '.join(dynamic)}"
    return algorithm, source


def _detect_algorithm(series: RunSeries, algo: str) -> tuple[str, str]:
    if algo != "auto":
        return algo, "--algo"
    if "logged_mae_grpo" not in series:
        return "unknown", "no logged advantage column"
    candidates = {
        name: float(np.nanmean(series[f"logged_mae_{name}"])) for name in ("grpo", "grpo_batch", "grpo_none", "gdpo")
    }
    best = min(candidates, key=lambda k: candidates[k] if np.isfinite(candidates[k]) else np.inf)
    if candidates[best] <= ALGO_MATCH_MAE:
        scale = {"grpo": "group", "grpo_batch": "batch", "grpo_none": "none"}.get(best)
        label = "gdpo" if best == "gdpo" else "grpo"
        detail = f"logged advantages match {label.upper()}" + (f" (scale {scale})" if scale else "")
        return label, detail
    return "unknown", f"logged advantages match no recomputation (closest: {best}, {candidates[best]:.3g})"


def run_detectors(ctx: DetectionContext, codes: Sequence[str]) -> tuple[list[Finding], dict[str, str]]:
    """Run the selected detectors; a crash becomes an ``error`` finding and the others go on."""
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    for code in codes:
        detector = REGISTRY[code]
        if "rollouts" in detector.requires and not ctx.run.rollouts:
            skipped[code] = "needs rollouts; the input is a scalar log only"
            continue
        if "logged_advantage" in detector.requires and not ctx.run.logged_advantage:
            skipped[code] = "needs a logged 'advantage' column"
            continue
        if "scalars" in detector.requires and ctx.scalars is None:
            skipped[code] = "needs a scalar log (events, trainer_state, verl JSONL)"
            continue
        try:
            found = detector().detect(ctx)
        except Exception as exc:  # a broken detector must not hide the others' findings
            found = [
                Finding(
                    code=code,
                    severity=Severity.ERROR,
                    title=f"detector {code} crashed",
                    message=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                    remedy="report this with the input file; the other detectors ran",
                )
            ]
        override = ctx.config.severity.get(code)
        if override:
            level = Severity[override.upper()]
            found = [replace(f, severity=level) if f.severity != Severity.ERROR else f for f in found]
        findings.extend(found)
    findings.sort(key=lambda f: (-int(f.severity), f.code, f.onset_step if f.onset_step is not None else -1))
    return findings, skipped


def resolve_config(
    files: Sequence[Path],
    config: Config | str | Path | None,
    *,
    fail_on: str | None = None,
    only: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> tuple[Config, list[str]]:
    """The configuration with the explicit options applied, and the detector codes it selects.

    ``config`` is a :class:`Config`, a config file path, or ``None`` (discovered from ``files``).
    ``fail_on`` and ``only`` replace the configured values; ``ignore`` adds to the configured list.
    """
    if not isinstance(config, Config):
        config = load_config(list(files), config)
    overrides: dict[str, Any] = {}
    if fail_on is not None:
        overrides["fail_on"] = check_fail_on(fail_on)
    if only:
        overrides["only"] = tuple(only)
    if ignore:
        overrides["ignore"] = tuple(config.ignore) + tuple(ignore)
    config = replace(config, **overrides)
    return config, select(None, config.only or None, config.ignore or None)


def diagnosis_from_series(
    summary: RunSummary,
    series: RunSeries,
    config: Config,
    codes: Sequence[str],
    scalars: ScalarSeries | None,
    *,
    started: float | None = None,
) -> Diagnosis:
    """Run the selected detectors on a run's series and scalar log, and assemble its Diagnosis.

    ``started`` is the ``time.perf_counter()`` value the scan began at (``seconds`` stays 0 without it).
    """
    ctx = DetectionContext(run=summary, series=series, config=config, scalars=scalars)
    findings, skipped = run_detectors(ctx, codes)
    return Diagnosis(
        verdict=verdict_of(findings),
        findings=tuple(findings),
        run=summary,
        series=series,
        detectors=tuple(codes),
        skipped=skipped,
        config=config,
        seconds=time.perf_counter() - started if started is not None else 0.0,
        scalars=scalars,
    )


def reduce_rollouts(
    run: Any,
    device: str,
    *,
    collectors: Sequence[ChunkCollector] = (),
    on_progress: Callable[[int, int], None] | None = None,
) -> RunSeries:
    """Stream a rollout reader's chunks through the advantage engine and the statistics: per-step series.

    ``run`` is a :class:`ParquetRun` or anything with its ``channels``, ``weights``, ``num_rows`` and
    ``iter_chunks()``; chunks are reduced on one thread per core (:class:`ChunkWorkers`).
    """
    from collapse_doctor.advantages import compute_advantages
    from collapse_doctor.stats import ChunkInput, step_statistics
    from collapse_doctor.workers import ChunkWorkers

    channels = run.channels
    builder = SeriesBuilder(channels, channel_pairs(channels))
    done = trimmed_at = 0

    def reduce_chunk(stacked: StackedChunk) -> tuple[StackedChunk, ChunkInput, dict[str, np.ndarray]]:
        rewards, group_index, step_index, weight_t, logged = stacked.tensors(channels, run.weights, device)
        adv = compute_advantages(rewards, group_index, weights=weight_t, step_index=step_index)
        num = stacked.num_groups, len(stacked.steps)
        chunk_input = ChunkInput(rewards, group_index, step_index, weight_t, adv, *num, logged)
        return stacked, chunk_input, {k: v.cpu().numpy() for k, v in step_statistics(chunk_input).items()}

    with ChunkWorkers(device) as workers:
        for stacked, chunk_input, stats in workers.map(reduce_chunk, run.iter_chunks(SCAN_CHUNK_ROWS)):
            for collect in collectors:
                collect(stacked.steps, chunk_input)
            builder.add(stacked.steps, stats)
            del chunk_input, stats
            done += len(stacked.rewards)
            if done - trimmed_at >= TRIM_EVERY_ROWS:
                release_free_memory()
                trimmed_at = done
            if on_progress is not None:
                on_progress(done, run.num_rows)
    return builder.build()


def diagnose(
    paths: Sequence[str | Path],
    *,
    weights: dict[str, float] | None = None,
    algo: str = "auto",
    config: Config | str | Path | None = None,
    fail_on: str | None = None,
    only: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    device: str = "auto",
    step_col: str | None = None,
    group_col: str | None = None,
    reward_cols: Sequence[str] | None = None,
    group_size: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    collectors: Sequence[ChunkCollector] = (),
    run_name: str | None = None,
    scalar_cache: ScalarCache | None = None,
    allow_empty: bool = False,
) -> Diagnosis:
    """Scan a run: ingest, recompute GRPO/GDPO advantages, reduce per step, run detectors.

    ``config`` is a :class:`Config`, a config file path, or ``None`` (discover a ``collapse-doctor.toml``
    or ``pyproject.toml`` walking up from the first input). Explicit options override the config.
    Each of ``collectors`` is called with every chunk's step numbers and its :class:`ChunkInput` (rewards,
    indices and recomputed advantages), for consumers that keep more than the series (the HTML report).
    Inputs may be rollout tables, framework layouts or scalar logs (see :mod:`collapse_doctor.io.sources`);
    when they hold several runs, ``run_name`` picks one (:func:`diagnose_runs` scans them all).
    ``scalar_cache`` lets a caller that scans a growing log again (``watch``) parse only what is new.
    A run with only a scalar log that holds no points is an :class:`InputError`, unless ``allow_empty``
    (one of several runs scanned together: it is reported with a warning, and the others are scanned).
    """
    from collapse_doctor.io.sources import choose_run, discover_runs, open_rollouts, read_scalar_log
    from collapse_doctor.scalar_run import ScalarOnlyRun, summary_extras

    if algo not in ALGORITHMS:
        raise UsageError(f"--algo {algo!r} is not one of {', '.join(ALGORITHMS)}")
    started = time.perf_counter()
    inputs = choose_run(discover_runs(paths), run_name)
    config, codes = resolve_config(inputs.files, config, fail_on=fail_on, only=only, ignore=ignore)

    read_options = {"step_col": step_col, "group_col": group_col, "reward_cols": reward_cols}
    # Nothing is written before the end, so rewards are checked while streaming: one less read of them.
    rollouts = open_rollouts(inputs, check_rewards_first=False, group_size=group_size, weights=weights, **read_options)
    scalars = read_scalar_log(inputs, scalar_cache)
    run: Any
    if rollouts is None:  # a scalar log only: nothing to recompute, and torch is not even imported
        if not allow_empty and (scalars is None or not scalars.points):
            files = inputs.scalar_files()
            where = str(files[0]) if len(files) == 1 else f"{inputs.name} ({len(files)} scalar log files)"
            raise InputError(
                f"{where}: the scalar log holds no scalar points, so there is nothing to diagnose",
                hint="the trainer has not logged a step yet (watch waits for one), or point at the run's rollouts",
            )
        run = ScalarOnlyRun.build(inputs, scalars, weights)
        dev = "cpu" if device == "auto" else device
        series = SeriesBuilder(run.channels, channel_pairs(run.channels)).build()
    else:
        from collapse_doctor.advantages import resolve_device

        run = rollouts
        dev = str(resolve_device(device))
        series = reduce_rollouts(run, dev, collectors=collectors, on_progress=on_progress)
    channels = run.channels

    algorithm, source = detect_algorithm(series, algo, run.files if rollouts is not None else ())
    sizes = run.notes.group_sizes
    summary = RunSummary(
        sources=tuple(str(f) for f in run.files),
        steps=series.num_steps,
        rollouts=run.num_rows,
        groups=int(sum(sizes.values())),
        group_size_min=int(min(sizes)) if sizes else 0,
        group_size_max=int(max(sizes)) if sizes else 0,
        first_step=int(series.steps[0]) if series.num_steps else None,
        last_step=int(series.steps[-1]) if series.num_steps else None,
        channels=channels,
        weights=run.weights,
        algorithm=algorithm,
        algorithm_source=source,
        logged_advantage=run.columns.advantage is not None,
        device=dev,
        warnings=tuple(run.notes.warnings()),
        ground_truth=run.ground_truth,
    )
    summary, scalar_series = summary_extras(summary, inputs, run, scalars, multiple=run_name is not None)
    return diagnosis_from_series(summary, series, config, codes, scalar_series, started=started)


def diagnose_runs(paths: Sequence[str | Path], *, run_name: str | None = None, **options: Any) -> list[Diagnosis]:
    """Scan every run found in ``paths`` (or only ``run_name``), one Diagnosis each, in discovery order."""
    from collapse_doctor.io.sources import choose_run, discover_runs

    runs = discover_runs(paths)
    if run_name is not None:
        return [diagnose(paths, run_name=choose_run(runs, run_name).name, **options)]
    if len(runs) == 1:
        return [diagnose(paths, **options)]
    return [diagnose(paths, run_name=run.name, allow_empty=True, **options) for run in runs]
