"""collapse-doctor's own retrain TensorBoard tags are recognised; long source lists are summarised."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from collapse_doctor import diagnose
from collapse_doctor.core import scalars as S
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.text_safety import describe_sources
from collapse_doctor.io.logs import tags as T
from collapse_doctor.report.ci import markdown_summary
from collapse_doctor.report.text import render_text
from tests.helpers.scalar_runs import trl_series, write_events

N = 40


@pytest.fixture(autouse=True)
def _default_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text off a terminal is laid out at COLUMNS, else 110 columns: the default here, whatever the shell says."""
    monkeypatch.delenv("COLUMNS", raising=False)


def _monitor_series() -> dict[str, np.ndarray]:
    decay = np.linspace(0.9, 0.05, N)
    series = {"collapse_doctor/advantage_std": np.full(N, 0.8), "collapse_doctor/zero_variance_share": decay / 2}
    for channel, rel in (("format", decay), ("correct", np.full(N, 0.6))):
        series[f"collapse_doctor/rel_gain/{channel}"] = rel
        series[f"collapse_doctor/signal_share/{channel}"] = np.full(N, 0.5)
        series[f"collapse_doctor/weight/{channel}"] = np.full(N, 1.0)
        series[f"collapse_doctor/zero_variance_share/{channel}"] = 1 - rel
    return series


def test_monitor_tags_map_to_channel_series() -> None:
    mapped = T.map_tags(_monitor_series(), T.MONITOR)
    assert mapped[S.CHANNEL_REL_GAIN + "format"] == "collapse_doctor/rel_gain/format"
    assert mapped[S.CHANNEL_SIGNAL_SHARE + "correct"] == "collapse_doctor/signal_share/correct"
    assert mapped[S.CHANNEL_WEIGHT + "format"] == "collapse_doctor/weight/format"
    assert mapped[S.CHANNEL_ZERO_VAR_SHARE + "format"] == "collapse_doctor/zero_variance_share/format"
    assert mapped[S.ZERO_STD_SHARE] == "collapse_doctor/zero_variance_share"  # a log written before the rename
    assert T.detect_framework(_monitor_series()) == T.MONITOR
    assert T.detect_framework([*_monitor_series(), *trl_series()]) == "trl"  # a trainer's map still wins


def test_a_retrain_tensorboard_dir_is_recognised(tmp_path: Path) -> None:
    write_events(tmp_path / "tensorboard", _monitor_series())
    diagnosis = diagnose([tmp_path / "tensorboard"], ScanOptions.of(device="cpu"))
    assert diagnosis.run.scalar_framework == T.MONITOR
    assert not any("tags recognised" in w for w in diagnosis.run.warnings)
    assert diagnosis.run.channels == ("correct", "format")
    rows = {row["channel"]: row for row in diagnosis.channel_table()}
    assert rows["format"]["rel_gain_peak"] == pytest.approx(0.9) and rows["format"]["rel_gain_now"] < 0.1
    assert rows["format"]["rel_gain_peak_step"] == 0
    assert rows["correct"]["zero_variance_share"] == pytest.approx(0.4)
    assert "rel_gain peak -> now" in _text(diagnosis)
    # At 80 columns the short layout: the peak's step as @N under the short header, each channel one line.
    table = _text(diagnosis, width=80).split("Channels, from the scalar log", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[1].split() == ["channel", "w", "rel_gain", "const", "reward", "std", "mean"]
    assert [row.split()[:7] for row in table[3:]] == [
        ["correct", "1", "0.60", "@0", "->", "0.60", "40%"],
        ["format", "1", "0.90", "@0", "->", "0.08", "92%"],
    ]


def test_many_sources_in_one_directory_are_summarised(tmp_path: Path) -> None:
    sources = [f"{tmp_path}/rollouts/part-{i:06d}.parquet" for i in range(12)]
    assert describe_sources(sources) == f"{tmp_path}/rollouts/ (12 files)"
    assert describe_sources(sources[:3]) == ", ".join(sources[:3])
    mixed = [*sources[:10], f"{tmp_path}/runs/x/events.a", f"{tmp_path}/tensorboard/events.b"]
    assert describe_sources(mixed) == f"{tmp_path}/ (12 files in rollouts/, runs/x/, tensorboard/)"


def test_text_and_markdown_name_the_directory(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tests.helpers import runs

    table = pq.read_table(runs.binary_run(tmp_path / "all.parquet", pass_rates={"correct": 0.5}, steps=10))
    (tmp_path / "rollouts").mkdir()
    for i in range(5):  # two steps per part, like collapse-doctor retrain's part files
        pq.write_table(table.slice(i * 2 * 16 * 8, 2 * 16 * 8), tmp_path / "rollouts" / f"part-{i}.parquet")
    diagnosis = diagnose([tmp_path / "rollouts"], ScanOptions.of(device="cpu"))
    assert diagnosis.run.steps == 10
    first, where = _text(diagnosis).splitlines()[:2]
    assert first.startswith("HEALTHY (rollouts only: 7 of 21 checks ran; 11 need a scalar log; 1 needs logged ")
    assert "of rollouts gave no gradient" in first
    assert where.endswith(f"{tmp_path}/rollouts/ (5 files)"), where
    assert f"`{tmp_path}/rollouts/ (5 files)`" in markdown_summary(diagnosis)


def _text(diagnosis, width: int | None = None) -> str:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    render_text(diagnosis, out, color=False, width=width)
    return out.getvalue()
