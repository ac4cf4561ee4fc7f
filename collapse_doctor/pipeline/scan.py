"""The scan pipeline: discover once -> open -> reduce -> summarise -> detect.

``scan``, ``report``, ``watch`` (through :mod:`collapse_doctor.pipeline.incremental`) and the Python API all run
these steps; each is a function of values, so a caller composes the ones it needs:

- :func:`plan_scan` discovers the runs under the paths once, picks the one(s) asked for, and resolves the
  configuration and the detector selection (a :class:`ScanPlan`); outputs are checked against its files
  before any work;
- :func:`scan_run` opens one run's rollouts and scalar log, reduces the rollouts to per-step series
  (:mod:`collapse_doctor.engine.reduce`), summarises the run (:mod:`collapse_doctor.judge.summary`) and runs
  the detectors (:func:`detect`);
- :func:`run_scan` does that for every run of a plan; :func:`diagnose` and :func:`diagnose_runs` are the
  one-call forms.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from collapse_doctor.core.config import Config, check_fail_on, check_thresholds, load_config
from collapse_doctor.core.errors import CollapseDoctorError, InputError
from collapse_doctor.core.findings import Finding, Severity, verdict_of
from collapse_doctor.core.options import ReadOptions, ScanOptions
from collapse_doctor.core.reduction import RunReduction, without_reused_steps
from collapse_doctor.core.result import Diagnosis, Phase, RunSummary
from collapse_doctor.core.schema import ACTIVE_CHANNELS, AGGREGATION, resolve_weights
from collapse_doctor.core.series import CALLBACK_SCALARS, RunSeries
from collapse_doctor.engine.memory import release_free_memory
from collapse_doctor.engine.parallel import available_cores, map_ordered
from collapse_doctor.engine.reduce import SCAN_CHUNK_ROWS, ReadAhead, empty_series, reduce_rollouts
from collapse_doctor.io.discovery import RunInputs, choose_run, discover_runs
from collapse_doctor.io.open import open_rollouts, read_scalar_log
from collapse_doctor.io.storage.list_files import expand_list_files
from collapse_doctor.judge.algorithm import detect_algorithm, matches_both, phases_from_labels, without_uncompared
from collapse_doctor.judge.detectors import REGISTRY, DetectionContext
from collapse_doctor.judge.detectors.base import select, threshold_defaults, threshold_ranges
from collapse_doctor.judge.detectors.runner import run_detectors
from collapse_doctor.judge.logged_channels import callback_channel_series, logged_aggregation, logged_weights
from collapse_doctor.judge.summary import (
    channel_table,
    rollout_summary,
    scalar_only_summary,
    with_scalar_log,
    with_signal,
)
from collapse_doctor.judge.weights import weight_inference

if TYPE_CHECKING:
    from collapse_doctor.core.scalars import ScalarSeries
    from collapse_doctor.engine.cluster import Executor
    from collapse_doctor.engine.stats import ChunkInput, DenseChunk
    from collapse_doctor.io.logs.scalar_cache import ScalarCache

__all__ = [
    "Judged",
    "RunCollector",
    "RunsFailed",
    "ScanHooks",
    "ScanPlan",
    "ScanResult",
    "aggregation_phases",
    "detect",
    "diagnose",
    "diagnose_reduction",
    "diagnose_runs",
    "is_history",
    "plan_scan",
    "reduction_of",
    "resolve_config",
    "results_or_raise",
    "run_scan",
    "scan_run",
    "scan_runs",
    "step_aggregation",
]


class RunCollector(Protocol):
    """Keeps more of one run than its series (the HTML report): sees every chunk, finishes on the diagnosis."""

    def collect(self, steps: np.ndarray, chunk: ChunkInput | DenseChunk) -> None: ...

    def finish(self, diagnosis: Diagnosis) -> Any: ...


@dataclass(frozen=True)
class ScanHooks:
    """Optional callbacks of a scan: progress, a per-run collector, and a scalar cache for repeated scans."""

    on_progress: Callable[[int, int], None] | None = None
    collector: Callable[[RunInputs, ReadOptions], RunCollector] | None = None
    """Called once per run before its rollouts are read; its ``finish()`` result is the run's ``extra``."""
    scalar_cache: ScalarCache | None = None
    """Lets a caller that scans a growing log again (``watch``) parse only what is new."""


@dataclass(frozen=True)
class ScanPlan:
    """The runs found under the inputs (discovered once), the configuration and the detectors selected."""

    paths: tuple[str, ...]
    runs: tuple[RunInputs, ...]
    """The runs to scan: every run found, or the one ``--run`` named."""
    options: ScanOptions
    config: Config
    codes: tuple[str, ...]
    named: bool
    """Whether runs are reported under their names (the inputs held several, or ``--run`` picked one)."""

    @property
    def files(self) -> list[Path]:
        """Every input file of the runs to scan (outputs must not overwrite any of them)."""
        return [f for run in self.runs for f in run.files]


@dataclass(frozen=True)
class ScanResult:
    """One run's diagnosis, the inputs it was read from, and what the run's collector finished with."""

    diagnosis: Diagnosis
    inputs: RunInputs
    extra: Any = None


def resolve_config(files: Sequence[Path], options: ScanOptions) -> tuple[Config, tuple[str, ...]]:
    """The configuration with the explicit options applied, and the detector codes it selects.

    ``options.config`` is a :class:`Config` (used as it is), a config file path, or ``None`` (discovered from
    ``files``). ``fail_on`` and ``only`` replace the configured values; ``ignore`` adds to the configured list.
    """
    config = options.config
    if not isinstance(config, Config):
        config = load_config(list(files), config, defaults=threshold_defaults(), ranges=threshold_ranges())
    else:  # a Config built in code (the TRL callback's config=): its thresholds are checked as a file's are
        config = replace(config, defaults=config.defaults or threshold_defaults(), ranges=threshold_ranges())
        check_thresholds(config, source="config")
    overrides: dict[str, Any] = {}
    if options.fail_on is not None:
        overrides["fail_on"] = check_fail_on(options.fail_on)
    if options.only:
        overrides["only"] = tuple(options.only)
    if options.ignore:
        overrides["ignore"] = tuple(config.ignore) + tuple(options.ignore)
    config = replace(config, **overrides)
    return config, tuple(select(None, config.only or None, config.ignore or None))


def plan_scan(paths: str | Path | Sequence[str | Path], options: ScanOptions | None = None) -> ScanPlan:
    """Discover the runs under ``paths`` (one path or several, once; ``@FILE`` lists inputs one per line), pick
    ``options.run_name`` if given, resolve the configuration."""
    options = options or ScanOptions()
    paths = expand_list_files([paths] if isinstance(paths, (str, Path)) else paths)
    found = discover_runs(paths)
    runs = [choose_run(found, options.run_name)] if options.run_name is not None else found
    config, codes = resolve_config(runs[0].files, options)
    return ScanPlan(
        paths=tuple(str(p) for p in paths),
        runs=tuple(runs),
        options=options,
        config=config,
        codes=codes,
        named=options.run_name is not None or len(found) > 1,
    )


def detect(
    summary: RunSummary,
    series: RunSeries,
    scalars: ScalarSeries | None,
    config: Config,
    codes: Sequence[str],
    *,
    started: float | None = None,
    detector_series: RunSeries | None = None,
) -> Diagnosis:
    """Run the selected detectors on a run's values and assemble its Diagnosis.

    ``started`` is the ``time.perf_counter()`` value the scan began at (``seconds`` stays 0 without it).
    ``detector_series``: the series the detectors and the channel table read instead of ``series`` (a scalar-only run's
    per-channel series rebuilt from the TRL callback's scalars; ``series`` stays the run's own, empty).
    """
    checked = series if detector_series is None else detector_series
    if len(summary.phases) > 1:
        summary, findings, skipped = _detect_by_phase(summary, series, scalars, config, codes)
    else:
        summary = with_signal(summary, series)
        ctx = DetectionContext(run=summary, series=checked, config=config, scalars=scalars)
        findings, skipped = run_detectors(ctx, codes)
    judged = any(code not in skipped for code in codes)
    current = [f for f in findings if not is_history(f)]  # an earlier phase's findings do not judge the run now
    return Diagnosis(
        verdict=verdict_of(current, judged=judged),
        findings=tuple(findings),
        run=summary,
        series=series,
        detectors={code: REGISTRY[code].name for code in codes},
        skipped=skipped,
        config=config,
        seconds=time.perf_counter() - started if started is not None else 0.0,
        scalars=scalars,
        channels=_with_finding_states(channel_table(summary, checked, scalars, config), findings),
    )


def _detect_by_phase(
    summary: RunSummary, series: RunSeries, scalars: ScalarSeries | None, config: Config, codes: Sequence[str]
) -> tuple[RunSummary, list[Finding], dict[str, str]]:
    """A run that switched aggregation: each phase's steps judged under that phase's aggregation.

    The last phase is the run as it trains now: its findings and skipped detectors are the run's, and the signal
    budget is its own. A finding of an earlier phase is history: it is kept as information, its message saying
    where it held and at which severity (a crashed detector stays an error).
    """
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    phases = summary.phases
    last = len(phases) - 1
    for index, phase in enumerate(phases):
        # A phase runs until the next one starts; the first from the run's start, the last to its end (steps
        # without a label, scalar points logged after the last rollout step).
        first = phase.first_step if index else np.iinfo(np.int64).min
        end = phases[index + 1].first_step - 1 if index < last else np.iinfo(np.int64).max
        part = series.between(first, end)
        run = with_signal(
            replace(
                summary,
                algorithm=phase.algorithm,
                steps=part.num_steps,
                first_step=int(part.steps[0]) if part.num_steps else phase.first_step,
                last_step=int(part.steps[-1]) if part.num_steps else phase.last_step,
                # per-step weights only matter where they adapt (gdpo-dynamic): a GRPO phase used them fixed
                dynamic_weight_channels=summary.dynamic_weight_channels if phase.algorithm == "gdpo" else (),
            ),
            part,
        )
        part_scalars = scalars.between(first, end) if scalars is not None else None
        ctx = DetectionContext(run=run, series=part, config=config, scalars=part_scalars)
        found, phase_skipped = run_detectors(ctx, codes)
        if index == last:
            findings = found + findings
            where = f"{phase.algorithm.upper()} phase since step {phase.first_step}"
            skipped = {code: f"{where}: {reason}" for code, reason in phase_skipped.items()}
            summary = replace(summary, signal=run.signal)
        else:
            findings += [_before_switch(f, phase, summary.phases[index + 1]) for f in found]
    findings.sort(key=lambda f: -f.severity)  # stable: the last phase's first among equals
    return summary, findings, skipped


def is_history(finding: Finding) -> bool:
    """Whether a finding is from an earlier phase of a run that switched aggregation (reported, not acted on)."""
    return "judged_under" in finding.evidence and finding.severity != Severity.ERROR


def _before_switch(finding: Finding, phase: Phase, after: Phase) -> Finding:
    if finding.severity == Severity.ERROR:
        return finding
    where = (
        f"Before the switch to {after.algorithm.upper()} at step {after.first_step} (judged under "
        f"{phase.algorithm.upper()}, steps {phase.first_step}-{phase.last_step}, where it was {finding.severity.label})"
    )
    evidence = {
        **finding.evidence,
        "phase": phase.label(),
        "phase_severity": finding.severity.label,
        "judged_under": phase.algorithm,
    }
    return replace(finding, severity=Severity.INFO, message=f"{where}: {finding.message}", evidence=evidence)


def _with_finding_states(rows: tuple[dict[str, Any], ...], findings: Sequence[Finding]) -> tuple[dict[str, Any], ...]:
    """Channel rows with the state a detector's finding gives the channels it names (``Detector.channel_state``:
    CD104's channels follow the length cap, so they are "clipped", saturated for the wrong reason)."""
    states = {
        c: state
        for f in findings
        if (state := REGISTRY[f.code].channel_state) and not is_history(f)
        for c in f.channels
    }
    return tuple(
        row | {"state": states[row["channel"]]} if row["channel"] in states and "state" in row else row for row in rows
    )


def scan_run(
    plan: ScanPlan, run: RunInputs, hooks: ScanHooks | None = None, executor: Executor | None = None
) -> ScanResult:
    """Open, reduce, summarise and diagnose one run of a plan (its rollouts' shards on ``executor``, if given).

    A run with only a scalar log that holds no points is an :class:`InputError` when it is the only run; one
    of several runs is reported with a warning, and the others are scanned.
    """
    hooks = hooks or ScanHooks()
    options = plan.options
    started = time.perf_counter()
    # Nothing is written before the end, so rewards are checked while streaming: one less read of them.
    reader = open_rollouts(run, options.read, check_rewards_first=False)
    scalars = read_scalar_log(run, hooks.scalar_cache)
    release_free_memory()  # the read's freed blocks: the detectors' temporaries reuse no fragmented heap
    collector = hooks.collector(run, options.read) if hooks.collector is not None else None
    reduction = None
    reduce_with = None
    fresh: dict[str, RunCollector | None] = {}
    if reader is None:  # a scalar log only: nothing to recompute, and torch is not even imported
        if len(plan.runs) == 1 and (scalars is None or not scalars.points):
            files = run.scalar_files()
            where = str(files[0]) if len(files) == 1 else f"{run.name} ({len(files)} scalar log files)"
            raise InputError(
                f"{where}: the scalar log holds no scalar points, so there is nothing to diagnose",
                hint="the trainer has not logged a step yet (watch waits for one), or point at the run's rollouts",
            )
    else:
        ahead = None
        if executor is None:  # start reading now: the first chunks are read while torch is imported
            ahead = ReadAhead(reader.iter_chunks(SCAN_CHUNK_ROWS))
        try:
            from collapse_doctor.engine.advantages import device_name

            device = "cpu" if executor is not None else device_name(options.device)
        except BaseException:
            if ahead is not None:
                ahead.close()
            raise
        collectors = [collector] if collector is not None else []
        series = reduce_rollouts(
            reader, device, collectors=collectors, on_progress=hooks.on_progress, executor=executor, chunks=ahead
        )
        reduction = reduction_of(reader, series, device)

        def reduce_with(weights: dict[str, float]) -> RunReduction:
            """The run read again with other weights (a new collector sees that pass)."""
            read = replace(options.read, weights=weights)
            again = open_rollouts(run, read, check_rewards_first=False)
            assert again is not None  # the run opened once already
            fresh["collector"] = hooks.collector(run, read) if hooks.collector is not None else None
            pass_collectors = [c for c in fresh.values() if c is not None]
            reweighed = reduce_rollouts(
                again, device, collectors=pass_collectors, on_progress=hooks.on_progress, executor=executor
            )
            return reduction_of(again, reweighed, device)

    judged = diagnose_reduction(
        plan,
        reduction,
        scalars,
        name=run.name if plan.named else None,
        scalar_files=run.scalar_files(),
        set_aside=run.set_aside,
        run_notes=run.warnings,
        reduce_with=reduce_with,
        started=started,
    )
    if fresh and judged.reduction is not reduction:  # judged on the second pass: its collector saw it
        collector = fresh["collector"]
    extra = collector.finish(judged.diagnosis) if collector is not None else None
    release_free_memory()  # the detectors' freed temporaries, before the outputs are rendered
    return ScanResult(diagnosis=judged.diagnosis, inputs=run, extra=extra)


def reduction_of(reader: Any, series: RunSeries, device: str) -> RunReduction:
    """What a rollout reader read, with the series its chunks reduced to: the run's :class:`RunReduction`."""
    return RunReduction(
        series=series,
        channels=tuple(reader.channels),
        weights=dict(reader.weights),
        weights_source=reader.weights_source,
        sources=tuple(str(f) for f in reader.files),
        rollouts=reader.num_rows,
        notes=reader.notes,
        logged_advantage=reader.columns.advantage is not None,
        dynamic_weight_channels=tuple(reader.dynamic_weight_channels),
        declared_algorithm=getattr(reader, "declared_algorithm", None),
        step_labels=step_aggregation(reader) or {},
        step_active=(reader.step_labels(ACTIVE_CHANNELS) if hasattr(reader, "step_labels") else None) or {},
        ground_truth=reader.ground_truth,
        device=device,
        step_digests=dict(getattr(reader, "step_digests", None) or {}),
    )


@dataclass(frozen=True)
class Judged:
    """A run's diagnosis and the reduction it was judged on (another than the one handed in when the weights
    the logged advantages imply were inferred and the rollouts reduced again with them)."""

    diagnosis: Diagnosis
    reduction: RunReduction | None


def diagnose_reduction(
    plan: ScanPlan,
    reduction: RunReduction | None,
    scalars: ScalarSeries | None,
    *,
    name: str | None = None,
    scalar_files: Sequence[Path] = (),
    set_aside: Sequence[str] = (),
    run_notes: Sequence[str] = (),
    reduce_with: Callable[[dict[str, float]], RunReduction] | None = None,
    started: float | None = None,
) -> Judged:
    """THE path from a run's reduction to its diagnosis: ``scan``, ``report``, ``compare``, sweeps, Ray, every
    ``watch`` poll and the TRL callback all come here.

    ``reduction`` is ``None`` for a run with a scalar log only. The algorithm is detected (``--algo``, the logged
    advantages, dynamic-weight columns); for a run read with default weights whose logged advantages match no
    recomputation, the weights they imply are inferred and, given ``reduce_with`` (the rollouts reduced again
    with other weights), the run is judged on that reduction; the aggregation column makes phases; then the
    summary, the scalar log's share and the detectors.
    """
    options = plan.options
    callback_series: RunSeries | None = None
    if reduction is None:
        summary, series, callback_series = _scalar_only(options, scalars, scalar_files)
    else:
        reduction, reuse_notes = without_reused_steps(reduction)
        reduction, active_notes = with_inactive_channels_uncompared(reduction)
        reduction = replace(reduction, series=without_uncompared(reduction.series))
        reuse_notes += active_notes
        algorithm = detect_algorithm(
            reduction.series, options.algo, reduction.dynamic_weight_channels, reduction.declared_algorithm
        )
        reduction, algorithm, notes = _with_inferred_weights(reduction, algorithm, options, reduce_with)
        algorithm, phases, phase_notes = aggregation_phases(
            reduction.step_labels or None, options.algo, algorithm, ambiguous=matches_both(reduction.series)
        )
        series = reduction.series
        summary = rollout_summary(reduction, algorithm=algorithm)
        summary = replace(summary, phases=phases, warnings=summary.warnings + reuse_notes + notes + phase_notes)
    summary = with_scalar_log(summary, scalars, name=name, has_rollouts=reduction is not None)
    summary = replace(summary, set_aside=tuple(set_aside), warnings=summary.warnings + tuple(run_notes))
    diagnosis = detect(
        summary, series, scalars, plan.config, plan.codes, started=started, detector_series=callback_series
    )
    return Judged(diagnosis=diagnosis, reduction=reduction)


CALLBACK_WEIGHTS_SOURCE = "the callback's collapse_doctor/weight/<channel> scalars"
CALLBACK_AGGREGATION_SOURCE = "the callback's collapse_doctor/aggregation_gdpo scalar"


def _scalar_only(
    options: ScanOptions, scalars: ScalarSeries | None, files: Sequence[Path]
) -> tuple[RunSummary, RunSeries, RunSeries | None]:
    """A run with a scalar log only: its summary, its (empty) per-step series, and the per-channel series the
    channel checks judge where the log holds the TRL callback's (:mod:`collapse_doctor.judge.logged_channels`).

    The callback's logged aggregation and weights are the run's (``--algo`` and ``--weights`` still win); its
    series are used only under the aggregation they were computed under."""
    channels = scalars.channels if scalars is not None else ()
    logged = logged_weights(scalars)
    weights = resolve_weights(channels, dict(options.read.weights or {}), logged)
    series = empty_series(channels)
    algorithm, source = detect_algorithm(series, options.algo)
    aggregation = logged_aggregation(scalars)
    if algorithm == "unknown" and aggregation is not None:
        algorithm, source = aggregation, CALLBACK_AGGREGATION_SOURCE
    device = "cpu" if options.device == "auto" else options.device
    summary = scalar_only_summary(files, scalars, weights, algorithm=algorithm, device=device)
    judged_as = "gdpo" if algorithm == "gdpo" else "grpo"
    judged = callback_channel_series(scalars, aggregation) if aggregation == judged_as else None
    changes: dict[str, Any] = {"algorithm_source": source} if source == CALLBACK_AGGREGATION_SOURCE else {}
    if logged and not options.read.weights:
        changes["weights_source"] = CALLBACK_WEIGHTS_SOURCE
    if judged is not None:
        changes["channel_series"] = CALLBACK_SCALARS
    return replace(summary, **changes), series, judged


def with_inactive_channels_uncompared(reduction: RunReduction) -> tuple[RunReduction, tuple[str, ...]]:
    """The reduction with its logged-advantage comparisons left out (NaN) at the steps that trained with some
    channels off (the ``active_channels`` column: ``retrain``'s ``channel_start`` gives a channel weight 0 until its
    start), and the note that says so. Every recomputation weights every channel, so at those steps it cannot be the
    trainer's: comparing would call the tool's own corrective runs a mismatch (CD202).

    >>> from collapse_doctor.core.reduction import IngestNotes
    >>> series = RunSeries(np.array([0, 1, 2]), ("a", "b"), [], {"logged_mae_gdpo": np.array([0.4, 0.0, 0.0])})
    >>> run = RunReduction(series, ("a", "b"), {"a": 1.0, "b": 1.0}, "default 1.0", (), 12, IngestNotes(), True,
    ...     step_active={0: "a", 1: "a,b", 2: "a,b"})
    >>> kept, notes = with_inactive_channels_uncompared(run)
    >>> kept.series["logged_mae_gdpo"].tolist(), notes[0][:29]
    ([nan, 0.0, 0.0], 'steps 0-0 trained with b off ')
    """
    if not reduction.step_active or not reduction.logged_advantage:
        return reduction, ()
    everything = set(reduction.channels)
    partial = {
        step: everything - {c.strip() for c in active.split(",") if c.strip()}
        for step, active in reduction.step_active.items()
    }
    partial = {step: off for step, off in partial.items() if off}
    if not partial:
        return reduction, ()
    series = reduction.series
    masked = np.isin(series.steps, np.array(sorted(partial)))
    # every comparison with the log (MAE, the group bound) is left out there; the support (logged_rows) stays
    values = {
        name: np.where(masked, np.nan, array) if name.startswith("logged_") and name != "logged_rows" else array
        for name, array in series.values.items()
    }
    off = sorted(set().union(*partial.values()))
    note = (
        f"steps {min(partial)}-{max(partial)} trained with {', '.join(off)} off (the rollouts' active_channels "
        "column, as retrain's channel_start writes it): their logged advantages are not compared with the "
        "recomputations, which weight every channel"
    )
    return replace(reduction, series=replace(series, values=values)), (note,)


def step_aggregation(reader: Any) -> dict[int, str] | None:
    """``{step: aggregation}`` from the rollouts' ``aggregation`` column, if the reader has one."""
    return reader.step_labels(AGGREGATION) if hasattr(reader, "step_labels") else None


def aggregation_phases(
    labels: Mapping[int, str] | None, algo: str, algorithm: tuple[str, str], *, ambiguous: bool = False
) -> tuple[tuple[str, str], tuple[Phase, ...], tuple[str, ...]]:
    """The algorithm, the phases of a run whose rollouts' ``aggregation`` column changes (a hybrid switch) and
    warning lines, from ``{step: aggregation}`` (:func:`step_aggregation`).

    ``--algo`` wins over the column; the column names the algorithm of a run whose logged advantages did not, or
    matched GRPO and GDPO alike (``ambiguous``: one channel constant within every group makes the two equal); a run
    under one aggregation has no phases.
    """
    if not labels or algo != "auto":
        return algorithm, (), ()
    phases, warning = phases_from_labels(labels)
    if warning is not None:
        return algorithm, (), (warning,)
    if len(phases) == 1:
        if algorithm[0] != "unknown" and not ambiguous:
            return algorithm, (), ()
        why = "; the logged advantages match GRPO and GDPO alike" if algorithm[0] != "unknown" else ""
        return (phases[0].algorithm, f"the rollouts' aggregation column{why}"), (), ()
    shown = ", then ".join(p.label() for p in phases)
    source = f"the rollouts' aggregation column: {shown}; each phase judged under its own aggregation"
    return (phases[-1].algorithm, source), phases, ()


INFERRED_WEIGHTS_SOURCE = "inferred from logged advantages"
"""``RunSummary.weights_source`` of a run rescanned with the weights its logged advantages imply."""
INFERRED_WEIGHT_DIGITS = 6
"""Significant digits an inferred weight is kept to: the fit pins a weight to about 1e-7 (float32 advantages), and
a run that grows (``watch``, the callback) keeps the same weights from poll to poll, so its parts are reduced with
them once."""


def _with_inferred_weights(
    reduction: RunReduction,
    algorithm: tuple[str, str],
    options: ScanOptions,
    reduce_with: Callable[[dict[str, float]], RunReduction] | None,
) -> tuple[RunReduction, tuple[str, str], tuple[str, ...]]:
    """The reduction to judge, its algorithm, and warning lines: a second pass with the weights the logged
    advantages imply.

    Only for a run read with default weights (no ``--weights``, none in the files) whose logged advantages
    match no recomputation: TRL keeps ``reward_weights`` only in training_args.bin. When
    :func:`~collapse_doctor.judge.weights.weight_inference` finds other weights that reproduce the logged
    advantages, the rollouts are reduced again with them (``reduce_with``) and the algorithm detected again;
    every other run keeps its one pass.
    """
    sources = reduction.weights_source.split(" + ")
    if algorithm[0] != "unknown" or not reduction.logged_advantage or {"--weights", "file metadata"} & set(sources):
        return reduction, algorithm, ()
    found = weight_inference(reduction.series, reduction.channels, reduction.weights)
    fit = found.fit
    if fit is not None:
        fit = replace(fit, weights={c: float(f"{w:.{INFERRED_WEIGHT_DIGITS}g}") for c, w in fit.weights.items()})
    if fit is None or all(abs(w - reduction.weights[c]) <= 1e-6 for c, w in fit.weights.items()):
        tried = bool(found.residuals or found.unidentified)  # not for a run with one channel or no fit series
        notes = (f"channel weights not inferred from the logged advantages: {found.reason}",) if tried else ()
        return reduction, algorithm, notes
    shown = ", ".join(f"{c}={w:.4g}" for c, w in fit.weights.items())
    if reduce_with is None:
        note = (
            f"the logged advantages fit channel weights {shown} under {fit.algorithm.upper()}; pass the run's "
            "reward_weights with --weights"
        )
        return reduction, algorithm, (note,)
    again = reduce_with(fit.weights)
    detected = detect_algorithm(again.series, options.algo, again.dynamic_weight_channels, again.declared_algorithm)
    if detected[0] == "unknown":  # right up to scale only (scale_rewards="none"): keep the configured weights
        note = (
            f"the logged advantages fit channel weights {shown} under {fit.algorithm.upper()} up to scale, but the "
            "recomputation with them still differs; pass the run's reward_weights with --weights"
        )
        return reduction, algorithm, (note,)
    note = (
        f"channel weights inferred from the logged advantages: {shown} ({fit.algorithm.upper()} reproduces them "
        f"to {fit.residual:.0e} relative; the logs do not record reward_weights); --weights overrides"
    )
    again = replace(again, weights_source=INFERRED_WEIGHTS_SOURCE)
    return again, (detected[0], f"{detected[1]} with the inferred weights"), (note,)


def run_scan(plan: ScanPlan, hooks: ScanHooks | None = None) -> list[ScanResult]:
    """Scan every run of a plan, in discovery order (:func:`scan_runs`).

    When some runs of several fail (a corrupt file), the others are still scanned: :class:`RunsFailed` carries
    their results and each failure. One run's failure is raised as it is.
    """
    outcomes = scan_runs([(plan, run) for run in plan.runs], hooks)
    return results_or_raise(outcomes, [run.name for run in plan.runs])


def scan_runs(
    jobs: Sequence[tuple[ScanPlan, RunInputs]], hooks: ScanHooks | None = None
) -> list[ScanResult | CollapseDoctorError]:
    """Scan each ``(plan, run)``; a run's :class:`CollapseDoctorError` is returned in its place.

    Locally, several runs are scanned at once, one thread per core (each run's chunks go to
    :class:`~collapse_doctor.engine.workers.ChunkWorkers` as usual). With ``--ray`` (the plans' ``options.ray``) one run
    is reduced shard by shard on the cluster, and several runs (a sweep) go out one run per task.
    """
    address = jobs[0][0].options.ray if jobs else None
    if address is None:
        return map_ordered(lambda job: _outcome(*job, hooks), jobs, available_cores())
    from collapse_doctor.engine.cluster import ray_session
    from collapse_doctor.io.rollouts.parquet import steps_read_in_tasks

    # A run opened here reads its footers only: its shards' tasks read the steps.
    with ray_session(address) as executor, steps_read_in_tasks():
        if len(jobs) == 1:
            return [_outcome(*jobs[0], hooks, executor)]
        # The progress bar lives here, not in the task; the report's collector (a class) travels.
        task_hooks = replace(hooks or ScanHooks(), on_progress=None)
        # In the task the run is reduced locally, on the worker's CPU (as the shards of one run are).
        tasks = [(replace(plan, options=plan.options.with_(ray=None, device="cpu")), run) for plan, run in jobs]
        work = functools.partial(_scan_task, hooks=task_hooks)
        return list(executor.map(work, tasks, lambda job: job[1].name, keep_going=True))


def _scan_task(job: tuple[ScanPlan, RunInputs], hooks: ScanHooks) -> ScanResult:
    return scan_run(*job, hooks)


def _outcome(
    plan: ScanPlan, run: RunInputs, hooks: ScanHooks | None, executor: Executor | None = None
) -> ScanResult | CollapseDoctorError:
    try:
        return scan_run(plan, run, hooks, executor)
    except CollapseDoctorError as exc:
        return exc


class RunsFailed(InputError):
    """Some runs of several could not be scanned: ``results`` holds the others', ``failures`` each
    ``(run name, error)``."""

    def __init__(self, results: list[ScanResult], failures: list[tuple[str, CollapseDoctorError]]) -> None:
        self.results = results
        self.failures = failures
        total = len(results) + len(failures)
        shown = "; ".join(f"{name}: {exc.one_line()}" for name, exc in failures)
        super().__init__(f"{len(failures)} of {total} runs could not be scanned: {shown}")

    def __reduce__(self) -> tuple[object, ...]:
        return RunsFailed, (self.results, self.failures)


def results_or_raise(outcomes: Sequence[ScanResult | CollapseDoctorError], names: Sequence[str]) -> list[ScanResult]:
    """The results, when every run was scanned; else the one run's error, or :class:`RunsFailed`."""
    failures = [(name, o) for name, o in zip(names, outcomes, strict=True) if isinstance(o, CollapseDoctorError)]
    if not failures:
        return [o for o in outcomes if isinstance(o, ScanResult)]
    if len(outcomes) == 1:
        raise failures[0][1]
    raise RunsFailed([o for o in outcomes if isinstance(o, ScanResult)], failures)


def diagnose(paths: str | Path | Sequence[str | Path], options: ScanOptions | None = None) -> Diagnosis:
    """Scan the one run under ``paths`` (a path or several; several runs need ``options.run_name``, or
    :func:`diagnose_runs`).

    >>> import collapse_doctor
    >>> collapse_doctor.diagnose is diagnose
    True
    """
    plan = plan_scan(paths, options)
    if len(plan.runs) > 1:
        choose_run(plan.runs, None)  # raises: names the runs and the --run hint
    return scan_run(plan, plan.runs[0]).diagnosis


def diagnose_runs(paths: str | Path | Sequence[str | Path], options: ScanOptions | None = None) -> list[Diagnosis]:
    """Scan every run found in ``paths`` (or only ``options.run_name``), one Diagnosis each, in discovery order."""
    return [result.diagnosis for result in run_scan(plan_scan(paths, options))]
