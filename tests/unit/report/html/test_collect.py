"""The report's run collector on its own: bounded histograms and sample, finish() without the run's files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor.report.html import collect
from collapse_doctor.report.html.collect import ReportCollector


def _feed(collector: ReportCollector, chunks: int = 12) -> None:
    """``chunks`` chunks of 5 steps, 2 groups of 4 per step, a logged advantage of 0."""
    import torch

    from collapse_doctor.engine.advantages import compute_advantages
    from collapse_doctor.engine.stats import ChunkInput

    rng = np.random.default_rng(0)
    for start in range(0, 5 * chunks, 5):
        rewards = torch.from_numpy(rng.random((40, 2)).astype(np.float32))
        group_index = torch.arange(40) // 4
        step_index = torch.arange(40) // 8
        weights = torch.ones(2)
        adv = compute_advantages(rewards, group_index, weights=weights, step_index=step_index)
        chunk = ChunkInput(rewards, group_index, step_index, weights, adv, 10, 5, torch.zeros(40))
        collector.collect(np.arange(start, start + 5), chunk)


def test_collector_keeps_a_bounded_number_of_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect, "MAX_HISTOGRAM_STEPS", 8)
    monkeypatch.setattr(collect, "MAX_LOGGED_SAMPLE", 64)
    collector = ReportCollector()
    _feed(collector)
    hist = collector.histograms()
    assert hist is not None
    assert len(hist.steps) <= 8
    assert hist.stride == 8
    assert np.all(hist.steps % hist.stride == 0)
    assert np.all(hist.grpo.sum(axis=1) == 8)
    sample = collector.logged_sample()
    assert sample is not None and len(sample.logged) == 60  # every 8th of 480 rows
    np.testing.assert_array_equal(np.bincount(sample.steps, minlength=60), np.ones(60))  # one row per step
    np.testing.assert_array_equal(sample.logged, 0.0)


def test_finish_without_the_runs_inputs_has_no_examples(tmp_path: Path) -> None:
    """A collector built without the run's inputs (a Python caller) still finishes; no example groups."""
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose
    from collapse_doctor.pipeline.simulate import write_simulation

    path = write_simulation(tmp_path / "run.parquet", "healthy", steps=20, groups=4, group_size=4).path
    diagnosis = diagnose([path], ScanOptions.of(device="cpu"))
    collector = ReportCollector()
    _feed(collector, chunks=2)
    extras = collector.finish(diagnosis)
    assert extras.examples == () and extras.notes == ()
    assert extras.histograms is not None and len(extras.histograms.steps) == 10
