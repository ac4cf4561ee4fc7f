"""Detectors on runs made for them (positive) and on healthy runs (negative), plus registry meta-tests."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from collapse_doctor import diagnose
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors import REGISTRY, Severity
from collapse_doctor.judge.detectors.base import EXPLAIN_HEADINGS, Detector, register
from tests.helpers import runs
from tests.helpers.scalar_runs import SCALAR_CASES

Builder = Callable[[Path], Path]

# code -> (positive run, negative run). Every registered detector must appear here.
CASES: dict[str, tuple[Builder, Builder]] = {
    "CD101": (
        lambda d: runs.lost_channel_run(d / "lost.parquet"),
        lambda d: runs.simulated(d / "healthy.parquet", "healthy"),
    ),
    "CD103": (
        lambda d: runs.sparse_run(d / "sparse.parquet"),
        lambda d: runs.simulated(d / "healthy.parquet", "healthy"),
    ),
    "CD102": (
        lambda d: runs.zero_variance_run(d / "zero.parquet"),
        lambda d: runs.binary_run(d / "binary.parquet", pass_rates={"correct": 0.5}),
    ),
    "CD105": (
        lambda d: runs.completions_run(d / "collapsed.parquet", collapse_from=40),
        lambda d: runs.completions_run(d / "healthy.parquet", collapse_from=None),
    ),
    "CD201": (
        lambda d: runs.simulated(d / "outliers.parquet", "outlier-groups"),
        lambda d: runs.binary_run(
            d / "binary.parquet",
            pass_rates={"format": 0.4, "correct": 0.6},
            weights={"format": 1.0, "correct": 0.7},
        ),
    ),
    "CD202": (
        lambda d: runs.logged_beyond_bound_run(d / "bound.parquet"),
        lambda d: runs.simulated(d / "healthy.parquet", "healthy"),
    ),
    "CD301": (
        lambda d: runs.simulated(d / "tied.parquet", "tied-sums"),
        lambda d: runs.simulated(d / "single.parquet", "single-reward"),
    ),
    "CD401": (
        lambda d: runs.simulated(d / "collinear.parquet", "collinear"),
        lambda d: runs.simulated(d / "healthy.parquet", "healthy"),
    ),
    "CD402": (
        lambda d: runs.dominant_run(d / "dominant.parquet"),
        lambda d: runs.simulated(d / "healthy.parquet", "healthy"),
    ),
}
CASES.update(SCALAR_CASES)  # CD5xx: scalar logs written with SummaryWriter
INFORMATION = {"CD103"}
"""Detectors whose positive case is information by design (they report a fact, not a harm)."""


def codes_at_or_above(path: Path, level: Severity = Severity.WARNING) -> set[str]:
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    return {f.code for f in diagnosis.findings if f.severity >= level}


@pytest.mark.parametrize("code", sorted(CASES))
def test_detector_fires_on_its_scenario(code: str, tmp_path: Path) -> None:
    positive, _ = CASES[code]
    assert code in codes_at_or_above(positive(tmp_path), Severity.INFO if code in INFORMATION else Severity.WARNING)


@pytest.mark.parametrize("code", sorted(CASES))
def test_detector_is_silent_on_a_healthy_run(code: str, tmp_path: Path) -> None:
    _, negative = CASES[code]
    assert code not in codes_at_or_above(negative(tmp_path), Severity.INFO)


def test_every_detector_has_cases_docs_and_a_unique_code() -> None:
    assert set(REGISTRY) == set(CASES), "add a positive and a negative case for each detector"
    for code, detector in REGISTRY.items():
        assert detector.code == code
        assert re.fullmatch(r"CD[1-9]\d\d", code)
        text = detector.explain()
        for heading in EXPLAIN_HEADINGS:
            assert re.search(rf"^{heading}$", text, re.MULTILINE), (code, heading)
        assert detector.name and detector.default_severity in Severity


def test_registry_refuses_bad_detectors() -> None:
    class NoDocs(Detector):
        code = "CD999"
        name = "no docs"

    with pytest.raises(ValueError, match="lacks the heading"):
        register(NoDocs)

    class Duplicate(Detector):
        """Dup.

        What it detects
            x
        Why it matters
            x
        Evidence
            x
        Remedy
            x
        """

        code = "CD101"
        name = "duplicate"

    with pytest.raises(ValueError, match="already used"):
        register(Duplicate)
    Duplicate.code = "XX1"
    with pytest.raises(ValueError, match="must look like CD101"):
        register(Duplicate)
    assert "CD999" not in REGISTRY


def test_saturation_onset_is_close_to_the_truth(tmp_path: Path) -> None:
    """`format` saturates at its ceiling at the onset step: CD101 reports it there, as information (a channel
    constant within its groups changes no advantage), and GDPO would not change that."""
    for seed, onset in [(0, 80), (1, 120), (2, 50)]:
        path = tmp_path / f"sat{seed}.parquet"
        from collapse_doctor.pipeline.simulate import write_simulation

        write_simulation(path, "saturating-format", steps=200, groups=16, group_size=8, seed=seed, onset_step=onset)
        diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
        found = [f for f in diagnosis.findings if f.code == "CD101"]
        assert [f.channels for f in found] == [("format",)]
        assert found[0].severity == Severity.INFO and found[0].evidence["state"] == "ceiling"
        assert abs(found[0].onset_step - onset) <= 0.05 * 200, (seed, found[0].onset_step, onset)
        assert found[0].gdpo_resolves is False


@pytest.mark.parametrize("scenario", ["healthy", "single-reward"])
def test_healthy_scenarios_stay_quiet_over_20_seeds(scenario: str, tmp_path: Path) -> None:
    from collapse_doctor.pipeline.simulate import write_simulation

    noisy = {}
    for seed in range(20):
        path = tmp_path / f"{seed}.parquet"
        write_simulation(path, scenario, steps=100, groups=16, group_size=8, seed=seed)
        diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
        bad = [f.code for f in diagnosis.findings if f.severity >= Severity.WARNING]
        if bad:
            noisy[seed] = bad
    assert noisy == {}


@pytest.mark.parametrize(
    ("pass_rates", "weights"),
    [({"correct": 0.5}, None), ({"format": 0.4, "correct": 0.6}, {"format": 1.0, "correct": 0.7})],
    ids=["one-binary-channel", "two-binary-channels"],
)
def test_healthy_binary_runs_have_no_warning(pass_rates, weights, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for seed in range(3):
        path = runs.binary_run(tmp_path / f"b{seed}.parquet", pass_rates=pass_rates, weights=weights, seed=seed)
        diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
        assert [f.code for f in diagnosis.findings if f.severity >= Severity.WARNING] == []


def test_a_crashing_detector_becomes_an_error_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self, ctx):  # type: ignore[no-untyped-def]
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(REGISTRY["CD301"], "detect", boom)
    diagnosis = diagnose([runs.simulated(tmp_path / "sat.parquet", "saturating-format")], ScanOptions.of(device="cpu"))
    errors = [f for f in diagnosis.findings if f.severity == Severity.ERROR]
    assert [(f.code, f.message) for f in errors] == [("CD301", "RuntimeError: synthetic failure")]
    assert "CD101" in {f.code for f in diagnosis.findings}  # the others still ran
    assert diagnosis.exit_code("critical") == 1


def test_algorithm_is_detected_from_logged_advantages(tmp_path: Path) -> None:
    path = runs.simulated(tmp_path / "h.parquet", "healthy", steps=30)
    assert diagnose([path], ScanOptions.of(device="cpu")).run.algorithm == "grpo"
    assert diagnose([path], ScanOptions.of(device="cpu", algo="gdpo")).run.algorithm == "gdpo"
    path = runs.binary_run(tmp_path / "b.parquet", pass_rates={"correct": 0.5}, steps=30)
    summary = diagnose([path], ScanOptions.of(device="cpu")).run
    assert (summary.algorithm, summary.algorithm_source) == ("unknown", "no logged advantage column")


def test_cd202_is_skipped_without_logged_advantages(tmp_path: Path) -> None:
    path = runs.binary_run(tmp_path / "b.parquet", pass_rates={"correct": 0.5}, steps=30)
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    rollout_codes = {
        code: reason for code, reason in diagnosis.skipped.items() if "scalars" not in REGISTRY[code].requires
    }
    assert rollout_codes.pop("CD105").endswith(
        "the rollouts carry no completion text (log completions to check for mode collapse)"
    )
    assert rollout_codes.pop("CD104").endswith(
        "--max-completion-length with a `completion_length` column"
    )  # no scalar log, no flag
    assert rollout_codes == {"CD202": "needs a logged 'advantage' column"}
