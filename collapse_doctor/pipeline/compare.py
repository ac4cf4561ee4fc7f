"""Compare runs and gate a run against a known-good baseline: ``collapse-doctor compare`` and ``scan --baseline``.

Works on :class:`~collapse_doctor.core.result.Diagnosis` values, one per run, as
:func:`~collapse_doctor.pipeline.scan.run_scan` makes them (:func:`load_runs` reads ``RUN`` arguments through the same
pipeline, so every input ``scan`` accepts works here). :func:`compare` returns a frozen :class:`Comparison`: per run its
verdict, algorithm, signal budget, channel table and findings; the findings matched across runs by ``(code, channels)``
(channels in the order the finding names them: "`format` drowns `length`" is not "`length` drowns `format`"); and the
per-step series aligned by step, or by fraction of training (``align="fraction"``) when the runs have different step
counts.

:func:`regression_gate` judges a run against a baseline by stated criteria (:class:`GateCriterion`): a finding at
or above the gate level that the baseline does not have at or above it, the zero-advantage share worse by more than
an absolute margin, a channel's rel_gain (now) lower by more than a relative margin.

:func:`conclude` words a gate's result as a :class:`Conclusion` (the run worse, not cleared, no worse or better than
the baseline; the measures that got worse or better with both values; what could not be compared, counted against
the run; the findings new, escalated or eased; whether the gate fails it). :func:`compare` makes one per later run
whether or not it gates, from the gate ``--gate`` would run, so the answer a comparison opens with is the gate's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_doctor.core.config import GATE_KEYS
from collapse_doctor.core.errors import CollapseDoctorError, UsageError
from collapse_doctor.core.findings import VERDICT_ORDER, Finding, Severity, check_fail_on, plain

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.pipeline.scan import ScanResult

__all__ = [
    "ALIGNMENTS",
    "COMPARE_FORMAT_VERSION",
    "CONCLUSION_VERDICTS",
    "NOT_COMPARED",
    "ComparedRun",
    "Comparison",
    "Conclusion",
    "FindingChange",
    "FindingKey",
    "FindingMatch",
    "GateCriterion",
    "GateResult",
    "GateSettings",
    "RunArgument",
    "aligned_indices",
    "check_margin",
    "check_outputs",
    "compare",
    "compare_runs",
    "conclude",
    "finding_key",
    "load_runs",
    "match_findings",
    "parse_run_argument",
    "regression_gate",
    "run_series",
    "unique_labels",
]

COMPARE_FORMAT_VERSION = 1
ALIGNMENTS = ("step", "fraction")
DEFAULT_ZERO_ADVANTAGE_MARGIN = GATE_KEYS["zero_advantage_margin"]
"""The zero-advantage share may grow by this much (absolute: 0.05 = 5 points) before the gate fails."""
DEFAULT_REL_GAIN_MARGIN = GATE_KEYS["rel_gain_margin"]
"""A channel's rel_gain (now) may drop by this share of the baseline's before the gate fails."""
RUN_SEPARATOR = "@"


# -- inputs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunArgument:
    """One ``RUN`` argument: the path (file, directory, glob, URL) and the run it names, if any (``PATH@NAME``)."""

    path: str
    run_name: str | None = None

    @property
    def label(self) -> str:
        return self.path if self.run_name is None else f"{self.path}{RUN_SEPARATOR}{self.run_name}"


def parse_run_argument(text: str, *, exists: Any = None) -> RunArgument:
    """``PATH`` or ``PATH@NAME`` (NAME picks one run where PATH holds several, as ``scan --run``).

    A local path that exists is taken whole even when it holds an ``@``; otherwise the text is split at its last
    ``@``, except in a URL where a ``/`` follows it (``hf://datasets/org/repo@rev/logs`` names a revision).
    ``exists`` (a callable, default :meth:`pathlib.Path.exists`) is for tests.

    >>> parse_run_argument("logs@exp-b", exists=lambda p: False)
    RunArgument(path='logs', run_name='exp-b')
    >>> parse_run_argument("runs/a@2x", exists=lambda p: True)
    RunArgument(path='runs/a@2x', run_name=None)
    >>> parse_run_argument("hf://datasets/org/repo@main/logs", exists=lambda p: False)
    RunArgument(path='hf://datasets/org/repo@main/logs', run_name=None)
    >>> parse_run_argument("@sweep.txt@lr-1e-6", exists=lambda p: False)
    RunArgument(path='@sweep.txt', run_name='lr-1e-6')
    """
    exists = exists or (lambda p: Path(p).exists())
    if RUN_SEPARATOR not in text or ("://" not in text and exists(text)):
        return RunArgument(text)
    path, _, name = text.rpartition(RUN_SEPARATOR)
    if not path and name:  # `@FILE`: a list of inputs, as scan takes it (`@FILE@NAME` picks one of its runs)
        return RunArgument(text)
    if "://" in text and ("/" in name or "://" not in path):
        return RunArgument(text)
    if not path or not name:
        raise UsageError(f"run {text!r}: expected PATH or PATH@RUN", hint="e.g. logs/@exp-b picks run exp-b in logs/")
    return RunArgument(path, name)


def load_runs(
    arguments: Sequence[str],
    options: ScanOptions,
    *,
    minimum: int = 2,
    outputs: Mapping[str, Path | None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[RunArgument], list[ScanResult]]:
    """Scan each ``RUN`` argument (one run each: ``PATH@NAME`` picks one of several) through the scan pipeline.

    Every input is discovered, and every output in ``outputs`` (``{option: path}``) checked against every input,
    before any run is scanned, so a bad argument fails before the work starts.
    """
    from collapse_doctor.io.discovery import choose_run
    from collapse_doctor.pipeline.scan import ScanHooks, plan_scan, scan_runs

    if len(arguments) < minimum:
        hint = "collapse-doctor compare GOOD_RUN NEW_RUN"
        if len(arguments) == 1 and "@" not in arguments[0]:  # one directory of several runs: name them
            names = [r.name for r in plan_scan([arguments[0]], options).runs]
            if len(names) >= minimum:
                raise UsageError(
                    f"{arguments[0]}: one argument of {len(names)} runs ({', '.join(names)}); compare takes each run "
                    "as an argument",
                    hint="collapse-doctor compare " + " ".join(f"{arguments[0]}@{n}" for n in names[:2]),
                )
        raise UsageError(f"expected at least {minimum} runs, got {len(arguments)}", hint=hint)
    parsed = [parse_run_argument(a) for a in arguments]
    plans = []
    for argument in parsed:
        plan = plan_scan([argument.path], options.with_(run_name=argument.run_name))
        if len(plan.runs) > 1:
            try:
                choose_run(plan.runs, None)
            except UsageError as exc:
                raise UsageError(f"{argument.path}: {exc.message}", hint=f"pick one as {argument.path}@NAME") from None
        plans.append(plan)
    check_outputs(outputs or {}, [f for plan in plans for f in plan.files])
    outcomes = scan_runs([(plan, plan.runs[0]) for plan in plans], ScanHooks(on_progress=on_progress))
    for outcome in outcomes:  # a comparison needs every run: the first error (in argument order) stops it
        if isinstance(outcome, CollapseDoctorError):
            raise outcome
    return parsed, [o for o in outcomes if not isinstance(o, CollapseDoctorError)]


def check_outputs(outputs: Mapping[str, Path | None], inputs: Sequence[Path]) -> None:
    """Fail before any work when an output is an input, shares a path with another output, or cannot be written."""
    from collapse_doctor.io.storage.atomic import check_outputs as check

    check(outputs.items(), inputs)


def compare_runs(
    arguments: Sequence[str],
    options: ScanOptions | None = None,
    *,
    align: str = "step",
    gate: GateSettings | Callable[[Config], GateSettings | None] | None = None,
    outputs: Mapping[str, Path | None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[Comparison, list[Path]]:
    """Scan the runs named by ``arguments`` and compare them: what ``collapse-doctor compare`` does.

    ``gate``: settings, or a function of the first run's resolved config returning them (the CLI's margins over
    ``[tool.collapse-doctor.gate]``). Returns the comparison and every file read (outputs must not overwrite them).
    """
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.io.storage.remote import input_path

    if align not in ALIGNMENTS:
        raise UsageError(f"--align {align!r} is not one of {', '.join(ALIGNMENTS)}")
    parsed, results = load_runs(arguments, options or ScanOptions(), outputs=outputs, on_progress=on_progress)
    diagnoses = [r.diagnosis for r in results]
    settings = gate(diagnoses[0].config) if callable(gate) else gate
    comparison = compare(diagnoses, [a.label for a in parsed], align=align, gate=settings)
    seen: dict[Path, None] = {}
    for result in results:
        for path in [*result.inputs.files, *(input_path(s) for s in result.diagnosis.run.sources)]:
            seen.setdefault(path, None)
    return comparison, list(seen)


# -- findings --------------------------------------------------------------------------------------
FindingKey = tuple[str, tuple[str, ...]]
"""What matches a finding across runs (:func:`finding_key`)."""


def finding_key(finding: Finding) -> FindingKey:
    """What matches a finding across runs: its code and the channels it names, in order."""
    return finding.code, tuple(finding.channels)


@dataclass(frozen=True)
class FindingMatch:
    """One ``(code, channels)`` and the finding of each run that has it (``None`` where a run does not)."""

    code: str
    channels: tuple[str, ...]
    findings: tuple[Finding | None, ...]

    @property
    def present(self) -> tuple[int, ...]:
        """Indices of the runs that have it."""
        return tuple(i for i, f in enumerate(self.findings) if f is not None)

    @property
    def shared(self) -> bool:
        return len(self.present) == len(self.findings)

    @property
    def title(self) -> str:
        """The condition in the first run that has it (see :attr:`titles_differ`; whether it recovered is per run)."""
        return next(f.condition for f in self.findings if f is not None)

    @property
    def titles_differ(self) -> bool:
        """Whether the runs word it differently: one code and channels, another state (a channel saturated at its
        ceiling in one run, never earned in the other)."""
        return len({f.condition for f in self.findings if f is not None}) > 1

    @property
    def worst(self) -> Severity:
        return max(f.severity for f in self.findings if f is not None)


def match_findings(runs: Sequence[Sequence[Finding]]) -> tuple[FindingMatch, ...]:
    """Findings of several runs matched by :func:`finding_key`; most severe first, then by code.

    A run with two findings of one key keeps its most severe (findings come most severe first).
    """
    keys: dict[FindingKey, list[Finding | None]] = {}
    for i, findings in enumerate(runs):
        for finding in sorted(findings, key=lambda f: -f.severity):
            row = keys.setdefault(finding_key(finding), [None] * len(runs))
            if row[i] is None:
                row[i] = finding
    matches = [FindingMatch(code, channels, tuple(row)) for (code, channels), row in keys.items()]
    return tuple(sorted(matches, key=lambda m: (-m.worst, m.code, m.channels)))


# -- alignment -------------------------------------------------------------------------------------
def aligned_indices(steps: Sequence[np.ndarray], align: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """The shared x axis and, per run, the index of its step at each x (-1 where it has none).

    ``step``: x is every step any run has (sorted). ``fraction``: x is ``m`` evenly spaced fractions of training
    from 0 to 1, ``m`` the fewest steps of a run that has any; a run of ``n`` steps shows its step
    ``round(x * (n - 1))``. A run without per-step series (a scalar log only) has no step at any x.

    >>> x, idx = aligned_indices([np.array([0, 1, 2]), np.array([1, 3])], "step")
    >>> x.tolist(), [i.tolist() for i in idx]
    ([0, 1, 2, 3], [[0, 1, 2, -1], [-1, 0, -1, 1]])
    >>> x, idx = aligned_indices([np.arange(3), np.arange(5), np.arange(0)], "fraction")
    >>> x.tolist(), [i.tolist() for i in idx]
    ([0.0, 0.5, 1.0], [[0, 1, 2], [0, 2, 4], [-1, -1, -1]])
    """
    if align not in ALIGNMENTS:
        raise UsageError(f"--align {align!r} is not one of {', '.join(ALIGNMENTS)}")
    arrays = [np.asarray(s, dtype=np.int64) for s in steps]
    if align == "step":
        x = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, dtype=np.int64)
        out = []
        for run_steps in arrays:
            if not len(run_steps):
                out.append(np.full(len(x), -1, dtype=np.int64))
                continue
            at = np.searchsorted(run_steps, x)
            hit = (at < len(run_steps)) & (run_steps[np.minimum(at, len(run_steps) - 1)] == x)
            out.append(np.where(hit, at, -1))
        return x, out
    counts = [len(s) for s in arrays]
    points = min((n for n in counts if n), default=0)
    fractions = np.linspace(0.0, 1.0, points) if points > 1 else np.zeros(points)
    return fractions, [
        np.rint(fractions * (n - 1)).astype(np.int64) if n else np.full(points, -1, dtype=np.int64) for n in counts
    ]


def _algorithm_key(diagnosis: Diagnosis) -> str:
    return "gdpo" if diagnosis.run.algorithm == "gdpo" else "grpo"


def run_series(diagnosis: Diagnosis) -> dict[str, Any]:
    """The per-step series a comparison overlays, under the run's own algorithm (an unknown one as GRPO):
    ``{"zero_advantage_share": [S], "adv_std": [S], "rel_gain": {channel: [S]}, "signal_share": {channel: [S]}}``
    (only those the run has)."""
    series = diagnosis.series
    algo = _algorithm_key(diagnosis)
    out: dict[str, Any] = {}
    if f"zero_adv_rows_{algo}" in series and "valid_rows" in series:
        rows = series["valid_rows"]
        with np.errstate(invalid="ignore", divide="ignore"):
            out["zero_advantage_share"] = np.where(rows > 0, series[f"zero_adv_rows_{algo}"] / rows, np.nan)
    if f"adv_std_{algo}" in series:
        out["adv_std"] = series[f"adv_std_{algo}"]
    for name, key in (("rel_gain", "rel_gain"), ("signal_share", f"signal_share_{algo}")):
        if key in series:
            out[name] = {c: series[key][:, k] for k, c in enumerate(series.channels)}
    return out


# -- the comparison --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparedRun:
    """One run of a comparison: the label it is shown under and its diagnosis."""

    label: str
    diagnosis: Diagnosis

    def to_dict(self) -> dict[str, Any]:
        d = self.diagnosis
        return {
            "label": self.label,
            "verdict": d.verdict,
            "algorithm": d.run.algorithm,
            "algorithm_source": d.run.algorithm_source,
            "sources": list(d.run.sources),
            "steps": d.run.steps,
            "step_range": [d.run.first_step, d.run.last_step],
            "rollouts": d.run.rollouts,
            "signal": plain(dict(d.run.signal)) if d.run.signal is not None else None,
            "channels": plain(d.channel_table()),
            "findings": [f.to_dict() for f in d.findings],
        }


@dataclass(frozen=True)
class Comparison:
    """Several runs side by side: their values, the findings matched across them, the alignment of their steps."""

    runs: tuple[ComparedRun, ...]
    align: str
    findings: tuple[FindingMatch, ...]
    x: np.ndarray = field(repr=False)
    """The shared x axis: steps (``align="step"``) or fractions of training (``"fraction"``)."""
    indices: tuple[np.ndarray, ...] = field(repr=False)
    """Per run, the index of its step at each x (-1: no step there)."""
    gates: tuple[GateResult, ...] = ()
    """With ``gate``: each later run judged against the first (the baseline)."""
    conclusions: tuple[Conclusion, ...] = ()
    """Each later run against the first, in words of the gate (:func:`conclude`): what ``gates`` decides with
    ``gate``, what it would decide without."""

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.runs]

    @property
    def channels(self) -> list[str]:
        """Every channel of any run, in the order the runs name them."""
        return list(dict.fromkeys(c for r in self.runs for c in r.diagnosis.run.channels))

    def aligned(self) -> dict[str, Any]:
        """The overlaid series on the shared axis, ``None`` where a run has no step there (see :func:`run_series`)."""
        per_run = [run_series(r.diagnosis) for r in self.runs]

        def pick(values: np.ndarray | None, index: np.ndarray) -> list[float | None]:
            if values is None:
                return [None] * len(index)
            return [plain(float(values[i])) if i >= 0 else None for i in index.tolist()]

        out: dict[str, Any] = {}
        for name in ("zero_advantage_share", "adv_std"):
            out[name] = {
                r.label: pick(s.get(name), idx) for r, s, idx in zip(self.runs, per_run, self.indices, strict=True)
            }
        for name in ("rel_gain", "signal_share"):
            out[name] = {
                channel: {
                    r.label: pick(s.get(name, {}).get(channel), idx)
                    for r, s, idx in zip(self.runs, per_run, self.indices, strict=True)
                }
                for channel in self.channels
            }
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (no NaN: missing numbers are null)."""

        from collapse_doctor.core.json_text import dumps

        return dumps(self.to_dict(), indent=indent)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (collapse_doctor/report/schemas/compare-output.schema.json)."""
        labels = self.labels
        return {
            "format_version": COMPARE_FORMAT_VERSION,
            "align": self.align,
            "runs": [r.to_dict() for r in self.runs],
            "findings": [
                {
                    "code": m.code,
                    "channels": list(m.channels),
                    "title": m.title,
                    "present_in": [labels[i] for i in m.present],
                    "absent_in": [labels[i] for i in range(len(labels)) if i not in m.present],
                    "by_run": {
                        labels[i]: (
                            {
                                "severity": f.severity.label,
                                "onset_step": f.onset_step,
                                "step_range": list(f.step_range) if f.step_range else None,
                                "title": f.title,
                            }
                            if f is not None
                            else None
                        )
                        for i, f in enumerate(m.findings)
                    },
                }
                for m in self.findings
            ],
            "aligned": {
                "x": [plain(float(v)) if self.align == "fraction" else int(v) for v in self.x.tolist()],
                "series": self.aligned(),
            },
            "gates": [g.to_dict() for g in self.gates],
            "conclusion": {
                "baseline": labels[0],
                "gated": bool(self.gates),
                "runs": [c.to_dict() for c in self.conclusions],
            },
            "exit_code": max((g.exit_code for g in self.gates), default=0),
        }


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made unique by numbering repeats (``a``, ``a (2)``).

    >>> unique_labels(["a", "b", "a"])
    ['a', 'b', 'a (2)']
    """
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def compare(
    diagnoses: Sequence[Diagnosis],
    labels: Sequence[str] | None = None,
    *,
    align: str = "step",
    gate: GateSettings | None = None,
) -> Comparison:
    """Compare ``diagnoses`` (two or more): findings matched by ``(code, channels)``, steps aligned by ``align``.

    ``gate``: judge every run after the first against the first (:func:`regression_gate`). The conclusions come
    from that gate, or without ``gate`` from the one ``--gate`` would run (the first run's ``fail_on`` and
    ``[tool.collapse-doctor.gate]`` margins), so what they say is what the gate says.
    """
    if len(diagnoses) < 2:
        raise UsageError(f"a comparison needs at least 2 runs, got {len(diagnoses)}")
    names = unique_labels(
        list(labels) if labels is not None else [d.run.name or f"run {i + 1}" for i, d in enumerate(diagnoses)]
    )
    runs = tuple(ComparedRun(label, d) for label, d in zip(names, diagnoses, strict=True))
    x, indices = aligned_indices([d.series.steps for d in diagnoses], align)
    config = diagnoses[0].config
    settings = gate if gate is not None else GateSettings.resolve(config.gate, fail_on=config.fail_on)
    judged = tuple(regression_gate(runs[0], run, settings) for run in runs[1:])
    return Comparison(
        runs=runs,
        align=align,
        findings=match_findings([d.findings for d in diagnoses]),
        x=x,
        indices=tuple(indices),
        gates=judged if gate is not None else (),
        conclusions=tuple(conclude(g) for g in judged),
    )


# -- the regression gate ---------------------------------------------------------------------------
def check_margin(value: float | None, option: str) -> None:
    """A gate margin is a number from 0 to 1 (``None``: not given); a UsageError naming ``option`` otherwise.

    >>> check_margin(0.1, "--rel-gain-margin")
    """
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise UsageError(f"{option} {value!r}: expected a number between 0 and 1", hint=f"e.g. {option} 0.1")


@dataclass(frozen=True)
class GateSettings:
    """The gate's level and margins (CLI options, else ``[tool.collapse-doctor.gate]``, else the defaults)."""

    fail_on: str = "warning"
    zero_advantage_margin: float = DEFAULT_ZERO_ADVANTAGE_MARGIN
    rel_gain_margin: float = DEFAULT_REL_GAIN_MARGIN

    def __post_init__(self) -> None:
        object.__setattr__(self, "fail_on", check_fail_on(self.fail_on))
        check_margin(self.zero_advantage_margin, "--zero-adv-margin")
        check_margin(self.rel_gain_margin, "--rel-gain-margin")

    @classmethod
    def resolve(
        cls,
        config_gate: Mapping[str, float],
        *,
        fail_on: str,
        zero_advantage_margin: float | None = None,
        rel_gain_margin: float | None = None,
    ) -> GateSettings:
        """Explicit values over the configured ``gate`` table over the defaults."""
        return cls(
            fail_on=fail_on,
            zero_advantage_margin=zero_advantage_margin
            if zero_advantage_margin is not None
            else config_gate.get("zero_advantage_margin", DEFAULT_ZERO_ADVANTAGE_MARGIN),
            rel_gain_margin=rel_gain_margin
            if rel_gain_margin is not None
            else config_gate.get("rel_gain_margin", DEFAULT_REL_GAIN_MARGIN),
        )


@dataclass(frozen=True)
class GateCriterion:
    """One criterion of the gate: what it compares, the two numbers, the limit, and whether the run failed it."""

    name: str
    subject: str
    """What was compared: ``findings``, ``zero-advantage share``, ``rel_gain of `format` ``..."""
    baseline: Any
    run: Any
    limit: Any
    failed: bool
    detail: str
    compared: bool = True
    """Whether both numbers were there to compare (``False``: ``failed`` says whether that counts against the run)."""
    improved: bool = False
    """The mirror of ``failed``: better than the baseline by more than the margin (``verdict``: a better verdict)."""
    channel: str | None = None
    """The channel a ``rel_gain`` criterion compares."""
    codes: tuple[str, ...] = ()
    """``coverage``: the checks that ran on the baseline and not on the run."""
    reason: str = ""
    """Why it was not compared: one of :data:`NOT_COMPARED`."""

    @property
    def counts_against(self) -> bool:
        """Not compared, and that fails the gate (what one side lacks is never ok)."""
        return self.failed and not self.compared

    def measure_dict(self) -> dict[str, Any]:
        """The criterion as a measure of a conclusion's JSON (``conclusion.runs[].worse[]``...)."""
        return {
            "measure": self.name,
            "channel": self.channel,
            "baseline": plain(self.baseline),
            "run": plain(self.run),
            "codes": list(self.codes),
            "reason": self.reason or None,
            "counts_against": self.counts_against,
        }

    def to_dict(self) -> dict[str, Any]:
        """The gate's JSON shape (``compared``, ``improved``... feed :func:`conclude`, not this shape)."""
        return {
            "criterion": self.name,
            "subject": self.subject,
            "baseline": plain(self.baseline),
            "run": plain(self.run),
            "limit": plain(self.limit),
            "failed": self.failed,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class GateResult:
    """A run judged against its baseline: every criterion, and whether any failed."""

    baseline: str
    run: str
    settings: GateSettings
    criteria: tuple[GateCriterion, ...]
    new_findings: tuple[Finding, ...]
    shared_findings: tuple[Finding, ...]
    escalated_findings: tuple[Finding, ...] = ()
    """Shared findings more severe in the run than in the baseline."""
    eased_findings: tuple[Finding, ...] = ()
    """The baseline's findings at or above ``fail_on`` that the run no longer has at their severity (gone, or
    less severe): the mirror of the new and escalated ones."""
    severities: Mapping[FindingKey, tuple[Severity | None, Severity | None]] = field(default_factory=dict)
    """Per ``(code, channels)`` of either run, its worst severity in the baseline and in the run (any level)."""

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.criteria)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def summary(self) -> str:
        bad = [c for c in self.criteria if c.failed]
        if not bad:
            return f"no regression against the baseline ({len(self.criteria)} criteria) -> exit 0"
        return f"{len(bad)} of {len(self.criteria)} criteria regressed against the baseline -> exit 1"

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "run": self.run,
            "fail_on": self.settings.fail_on,
            "zero_advantage_margin": self.settings.zero_advantage_margin,
            "rel_gain_margin": self.settings.rel_gain_margin,
            "failed": self.failed,
            "exit_code": self.exit_code,
            "criteria": [c.to_dict() for c in self.criteria],
            "new_findings": [
                {"code": f.code, "channels": list(f.channels), "severity": f.severity.label, "title": f.title}
                for f in self.new_findings
            ],
            "shared_findings": [
                {"code": f.code, "channels": list(f.channels), "severity": f.severity.label, "title": f.title}
                for f in self.shared_findings
            ],
        }


REL_GAIN_FLOOR = 1e-6
"""A baseline channel whose rel_gain (now) is below this ranks nothing already: the run cannot be worse on it."""


def regression_gate(baseline: ComparedRun, run: ComparedRun, settings: GateSettings) -> GateResult:
    """Judge ``run`` against ``baseline``.

    Criteria, each reported with its numbers:

    - ``judged``: the run was judged (a verdict other than inconclusive; the gate never passes what no detector
      could judge, except with ``fail_on="never"``);
    - ``coverage``: every check that ran on the baseline ran on the run (a check the run could not feed, for want
      of rollouts, a scalar log or data, is a regression it cannot be cleared of; not with ``fail_on="never"``);
    - ``new findings``: findings of the run at or above ``fail_on`` whose ``(code, channels)`` the baseline does not
      have at or above ``fail_on`` (a finding the baseline shares is not new; a more severe one is escalated);
    - ``zero-advantage share``: the run's signal budget share minus the baseline's exceeds
      ``zero_advantage_margin`` (absolute); with rollouts on one side only it is not compared, and fails;
    - ``verdict``: the run's verdict is worse than the baseline's (not with ``fail_on="never"``);
    - ``escalated findings``: a finding the baseline shares is more severe in the run;
    - ``rel_gain``: per channel of the baseline that still ranks (rel_gain now above 0), the run's rel_gain (now)
      is below the baseline's times ``1 - rel_gain_margin``, or the run has no such channel or no value of it now
      (not compared, and that counts against the run).

    Each criterion also says whether the run is better by the same margin (``improved``: a lower zero-advantage
    share by more than the margin, a rel_gain above the baseline's times ``1 + rel_gain_margin``, a better
    verdict), and the result names the baseline's findings the run no longer has at their severity: what
    :func:`conclude` words, so the conclusion is this gate's and no other judgement.
    """
    level = settings.fail_on
    criteria: list[GateCriterion] = []
    b, r = baseline.diagnosis, run.diagnosis
    ran_base = {code for code in b.detectors if code not in b.skipped}
    ran_run = {code for code in r.detectors if code not in r.skipped}
    if level != "never":
        inconclusive = r.verdict == "inconclusive"
        criteria.append(
            GateCriterion(
                "judged",
                "verdict",
                b.verdict,
                r.verdict,
                "not inconclusive",
                inconclusive,
                "no selected detector could judge the run" if inconclusive else "the run was judged",
                compared=not inconclusive,
                reason="inconclusive" if inconclusive else "",
            )
        )
        lost = sorted(ran_base - ran_run)
        criteria.append(
            GateCriterion(
                "coverage",
                "checks that ran",
                len(ran_base),
                len(ran_run),
                "the baseline's",
                bool(lost),
                f"not run: {', '.join(lost)} ({r.coverage_clause() or 'see its skipped checks'})"
                if lost
                else "as on the baseline",
                compared=not lost,
                codes=tuple(lost),
                reason="not_run" if lost else "",
            )
        )
    if level != "never" and "inconclusive" not in (b.verdict, r.verdict):
        steps_worse = VERDICT_ORDER.index(r.verdict) - VERDICT_ORDER.index(b.verdict)
        criteria.append(
            GateCriterion(
                "verdict",
                "verdict change",
                b.verdict,
                r.verdict,
                "no worse",
                steps_worse > 0,
                f"{b.verdict} -> {r.verdict}" if steps_worse > 0 else "no worse than the baseline",
                improved=steps_worse < 0,
            )
        )
    failing_run = r.failing(level)
    baseline_worst: dict[FindingKey, Severity] = {}
    for f in b.failing(level):
        baseline_worst[finding_key(f)] = max(f.severity, baseline_worst.get(finding_key(f), f.severity))
    run_worst: dict[FindingKey, Severity] = {}
    for f in failing_run:
        run_worst[finding_key(f)] = max(f.severity, run_worst.get(finding_key(f), f.severity))
    new = tuple(f for f in failing_run if finding_key(f) not in baseline_worst)
    shared = tuple(f for f in failing_run if finding_key(f) in baseline_worst)
    # The mirror of new and escalated: a baseline finding at the gate level the run has less severe, or not at all,
    # where its check ran on the run (a check that did not run found nothing: that is no recovery).
    worst_of: dict[FindingKey, Finding] = {}
    for f in b.failing(level):
        if f.severity == baseline_worst[finding_key(f)] and f.code in ran_run:
            worst_of.setdefault(finding_key(f), f)
    eased = tuple(f for key, f in worst_of.items() if key not in run_worst or run_worst[key] < f.severity)
    shown = ", ".join(f"{f.code}{_channels(f)}" for f in new) or "none"
    criteria.append(
        GateCriterion(
            "new_findings",
            f"findings >= {level}",
            len(b.failing(level)),
            len(failing_run),
            "none new",
            bool(new),
            f"new: {shown}" + (f"; shared: {len(shared)}" if shared else ""),
            improved=bool(eased),
        )
    )
    # A finding the baseline shares is no regression at the baseline's severity; a worse one is.
    escalated = tuple(f for f in shared if f.severity > baseline_worst[finding_key(f)])
    if shared:
        criteria.append(
            GateCriterion(
                "escalated_findings",
                "shared findings",
                len(shared),
                len(escalated),
                "none more severe",
                bool(escalated),
                "escalated: "
                + (
                    ", ".join(
                        f"{f.code}{_channels(f)} {baseline_worst[finding_key(f)].label} -> {f.severity.label}"
                        for f in escalated
                    )
                    or "none"
                ),
            )
        )
    base_zero, run_zero = _zero_share(b), _zero_share(r)
    if base_zero is not None and run_zero is not None:
        limit = base_zero + settings.zero_advantage_margin
        criteria.append(
            GateCriterion(
                "zero_advantage_share",
                "zero-advantage share",
                base_zero,
                run_zero,
                limit,
                run_zero > limit + 1e-12,
                f"{_signed(run_zero - base_zero, '.1%')} (margin +{settings.zero_advantage_margin:.1%})",
                improved=run_zero < base_zero - settings.zero_advantage_margin - 1e-12,
            )
        )
    else:
        # What one side lacks cannot be compared, and that counts against the run: a gate that passes says "no
        # worse". Neither side having rollouts is the same kind of run twice (scalar logs): nothing to compare.
        one_side = (base_zero is None) != (run_zero is None)
        where = "either run" if not one_side else "the baseline" if base_zero is None else "the run"
        criteria.append(
            GateCriterion(
                "zero_advantage_share",
                "zero-advantage share",
                base_zero,
                run_zero,
                None,
                one_side,
                f"not compared: no rollouts in {where}" + (" (counts against the run)" if one_side else ""),
                compared=False,
                reason="no_rollouts_" + ("both" if not one_side else "baseline" if base_zero is None else "run"),
            )
        )
    run_rows = {row["channel"]: row for row in r.channel_table()}
    for base_row in b.channel_table():
        channel = base_row["channel"]
        row = run_rows.get(channel)
        base_now, run_now = _number(base_row.get("rel_gain_now")), _number((row or {}).get("rel_gain_now"))
        if base_now is None or base_now < REL_GAIN_FLOOR:
            continue  # the baseline's channel ranks nothing now: the run cannot be worse on it
        if run_now is None:  # a channel the gate cannot compare counts against the run
            missing = row is None
            others = sorted(set(run_rows) - {c["channel"] for c in b.channel_table()})
            criteria.append(
                GateCriterion(
                    "rel_gain",
                    f"rel_gain now of `{channel}`",
                    base_now,
                    None,
                    base_now * (1.0 - settings.rel_gain_margin),
                    True,
                    (
                        "not compared: the run has no channel of this name"
                        + (f" (it has {', '.join(f'`{c}`' for c in others)}: renamed?)" if others else "")
                        if missing
                        else "not compared: the channel has no value now in the run (its reward stopped?)"
                    ),
                    compared=False,
                    channel=channel,
                    reason="no_channel" if missing else "no_value",
                )
            )
            continue
        limit = base_now * (1.0 - settings.rel_gain_margin)
        change = run_now / base_now - 1.0
        criteria.append(
            GateCriterion(
                "rel_gain",
                f"rel_gain now of `{channel}`",
                base_now,
                run_now,
                limit,
                run_now < limit - 1e-12,
                f"{_signed(change, '.0%')} (margin -{settings.rel_gain_margin:.0%})",
                improved=run_now > base_now * (1.0 + settings.rel_gain_margin) + 1e-12,
                channel=channel,
            )
        )
    severities: dict[FindingKey, tuple[Severity | None, Severity | None]] = {}
    for side, findings in enumerate((b.findings, r.findings)):
        for f in findings:
            pair = list(severities.get(finding_key(f), (None, None)))
            pair[side] = max(f.severity, pair[side] or f.severity)
            severities[finding_key(f)] = (pair[0], pair[1])
    return GateResult(
        baseline.label,
        run.label,
        settings,
        tuple(criteria),
        new,
        shared,
        escalated_findings=escalated,
        eased_findings=eased,
        severities=severities,
    )


# -- the conclusion ---------------------------------------------------------------------------------
CONCLUSION_VERDICTS = ("worse", "not_cleared", "no_worse", "better")
"""A run against its baseline: ``worse`` (a measure the gate compared got worse: the gate fails it),
``not_cleared`` (nothing compared got worse, but something could not be compared, which counts against the run: the
gate fails it), ``no_worse`` (the gate passes it), ``better`` (the gate passes it, and a measure is better by the
gate's margin or a finding of the baseline eased)."""

NOT_COMPARED = {
    "inconclusive": "no selected detector could judge the run",
    "not_run": "checks that ran on the baseline did not run on the run",
    "no_rollouts_run": "the run has no rollouts",
    "no_rollouts_baseline": "the baseline has no rollouts",
    "no_rollouts_both": "neither run has rollouts",
    "no_channel": "the run has no channel of this name",
    "no_value": "the channel has no value now in the run",
}
"""Why a gate criterion could not compare (:attr:`GateCriterion.reason`)."""


@dataclass(frozen=True)
class FindingChange:
    """A finding whose severity the gate weighs differently in the two runs (``None``: the run has none of it)."""

    code: str
    channels: tuple[str, ...]
    baseline: Severity | None
    run: Severity | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "channels": list(self.channels),
            "baseline": self.baseline.label if self.baseline is not None else None,
            "run": self.run.label if self.run is not None else None,
        }


@dataclass(frozen=True)
class Conclusion:
    """What the gate says of ``run`` against ``baseline``, measure by measure (:func:`conclude`)."""

    baseline: str
    run: str
    verdict: str
    """One of :data:`CONCLUSION_VERDICTS`."""
    gate_failed: bool
    fail_on: str
    worse: tuple[GateCriterion, ...] = ()
    """The gate's criteria that it compared and the run failed (past the margin)."""
    better: tuple[GateCriterion, ...] = ()
    """Its criteria on which the run is better by the same margin (``improved``)."""
    not_compared: tuple[GateCriterion, ...] = ()
    """Its criteria that could not compare (``counts_against``: and that fails the run)."""
    new_findings: tuple[FindingChange, ...] = ()
    """At or above ``fail_on`` in the run, not in the baseline (``baseline``: its severity there, below the level)."""
    escalated_findings: tuple[FindingChange, ...] = ()
    eased_findings: tuple[FindingChange, ...] = ()
    """At or above ``fail_on`` in the baseline, less severe or gone in the run."""

    @property
    def counted_against(self) -> tuple[GateCriterion, ...]:
        return tuple(c for c in self.not_compared if c.counts_against)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "verdict": self.verdict,
            "gate": "fails" if self.gate_failed else "passes",
            "fail_on": self.fail_on,
            "worse": [c.measure_dict() for c in self.worse],
            "better": [c.measure_dict() for c in self.better],
            "not_compared": [c.measure_dict() for c in self.not_compared],
            "new_findings": [f.to_dict() for f in self.new_findings],
            "escalated_findings": [f.to_dict() for f in self.escalated_findings],
            "eased_findings": [f.to_dict() for f in self.eased_findings],
        }


FINDING_CRITERIA = ("new_findings", "escalated_findings")
"""Criteria a conclusion words finding by finding (:attr:`Conclusion.new_findings`...), not as one measure."""


def conclude(gate: GateResult) -> Conclusion:
    """The gate's result as a conclusion: which measures got worse or better, what could not be compared, the
    findings that are new, escalated or eased, and whether the gate fails the run. Nothing is judged again here:
    every entry is one of the gate's criteria or findings, so ``verdict`` is ``worse`` or ``not_cleared`` exactly
    when the gate fails."""
    measures = [c for c in gate.criteria if c.name not in FINDING_CRITERIA]
    worse = [c for c in measures if c.compared and c.failed]
    better = [c for c in measures if c.compared and c.improved]
    not_compared = [c for c in measures if not c.compared]

    def changes(findings: Sequence[Finding]) -> tuple[FindingChange, ...]:
        keys = dict.fromkeys(finding_key(f) for f in findings)  # a run's two findings of one key: once
        return tuple(
            FindingChange(code, channels, *gate.severities.get((code, channels), (None, None)))
            for code, channels in keys
        )

    new, escalated = changes(gate.new_findings), changes(gate.escalated_findings)
    eased = changes(gate.eased_findings)
    if gate.failed:
        verdict = "worse" if worse or new or escalated else "not_cleared"
    else:
        verdict = "better" if better or eased else "no_worse"
    return Conclusion(
        gate.baseline,
        gate.run,
        verdict,
        gate.failed,
        gate.settings.fail_on,
        tuple(worse),
        tuple(better),
        tuple(not_compared),
        new,
        escalated,
        eased,
    )


def _signed(value: float, spec: str) -> str:
    """``value`` with its sign, never ``-0%`` for a change that rounds to nothing.

    >>> _signed(-1e-5, ".1%"), _signed(-0.25, ".0%")
    ('+0.0%', '-25%')
    """
    text = format(value, "+" + spec)
    return "+" + text[1:] if text.startswith("-") and not any(ch in "123456789" for ch in text) else text


def _channels(finding: Finding) -> str:
    return f" ({', '.join(finding.channels)})" if finding.channels else ""


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value):
        return None
    return float(value)


def _zero_share(diagnosis: Diagnosis) -> float | None:
    signal = diagnosis.run.signal
    if signal is None:
        return None
    return _number(signal.get("zero_advantage_rollout_share"))
