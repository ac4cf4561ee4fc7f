"""CD5xx beyond the registry cases: quiet on healthy noisy logs, sensible on short ones, thresholds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.detectors import Severity
from collapse_doctor.options import ScanOptions
from tests.helpers.scalar_runs import after, trl_series, write_events


def test_healthy_trl_logs_stay_quiet_over_seeds(tmp_path: Path) -> None:
    noisy = {}
    for seed in range(8):
        write_events(tmp_path / str(seed), trl_series(seed=seed))
        diagnosis = diagnose([tmp_path / str(seed)], ScanOptions.of(device="cpu"))
        if diagnosis.findings:
            noisy[seed] = [f.code for f in diagnosis.findings]
    assert noisy == {}


def test_short_logs_say_nothing(tmp_path: Path) -> None:
    series = {tag: values[:6] for tag, values in trl_series(train__entropy=after(3, 0.8, 0.01)).items()}
    write_events(tmp_path / "short", series)
    assert diagnose([tmp_path], ScanOptions.of(device="cpu")).findings == ()


def test_onset_and_severity_of_an_entropy_collapse(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__entropy=after(120, 0.8, 0.2)))
    diagnosis = diagnose([tmp_path], ScanOptions.of(device="cpu"))
    found = [f for f in diagnosis.findings if f.code == "CD503"]
    assert len(found) == 1 and found[0].severity == Severity.WARNING
    assert abs(found[0].onset_step - 120) <= 10


@pytest.mark.parametrize("spike", [True, False], ids=["spike", "collapse"])
def test_advantage_std_shift_both_ways(spike: bool, tmp_path: Path) -> None:
    later = 4.0 if spike else 0.02
    write_events(tmp_path / "run", trl_series(train__reward_std=after(100, 0.6, later)))
    found = [f for f in diagnose([tmp_path], ScanOptions.of(device="cpu")).findings if f.code == "CD501"]
    assert len(found) == 1
    assert ("spikes" in found[0].title) == spike


def test_thresholds_come_from_the_config(tmp_path: Path) -> None:
    write_events(tmp_path / "run", trl_series(train__frac_reward_zero_std=after(100, 0.1, 0.4, noise=0.02)))
    assert not [f for f in diagnose([tmp_path], ScanOptions.of(device="cpu")).findings if f.code == "CD504"]
    config = tmp_path / "collapse-doctor.toml"
    config.write_text("[thresholds.CD504]\nwarn_share = 0.3\n")
    found = [f for f in diagnose([tmp_path], ScanOptions.of(device="cpu", config=config)).findings if f.code == "CD504"]
    assert len(found) == 1 and np.isclose(found[0].evidence["share"], 0.4, atol=0.03)
