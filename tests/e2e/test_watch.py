"""`watch`: follows a growing log, reads only what is new, reports each finding once, stops on --fail-on."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.watch import WatchState, watch, withdrawn_line
from tests.helpers.scalar_runs import after, flat, record, scalar_event, trl_series

EVENTS = "events.out.tfevents.1700000000.host"

CPU = ScanOptions(device="cpu")


def _records(series: dict, steps: range) -> bytes:
    out = []
    for step in steps:
        for tag, values in series.items():
            out.append(record(scalar_event(tag, float(values[step]), step, 1.7e9 + step)))
    return b"".join(out)


def test_watch_appends_read_incrementally_and_stops_at_fail_on(tmp_path: Path) -> None:
    series = trl_series(train__entropy=after(120, 0.8, 0.05), train__reward=flat(0.5))
    log = tmp_path / "runs" / EVENTS
    log.parent.mkdir(parents=True)
    log.write_bytes(_records(series, range(100)))
    seen: list[str] = []
    appended: list[int] = []

    def grow(state: WatchState) -> None:
        if state.polls == 1:
            with log.open("ab") as handle:  # the trainer writes on
                handle.write(_records(series, range(100, 200)))
            appended.append(state.polls)

    state = watch(
        [tmp_path],
        CPU,
        interval=0,
        fail_on="warning",
        max_polls=5,
        on_finding=lambda d, f: seen.append(f.code),
        on_poll=grow,
    )
    assert appended == [1]
    assert state.failing is not None and state.failing.code == "CD503"
    assert state.polls == 2 and state.scans == 2
    assert sorted(seen) == ["CD503", "CD507"]  # the flat reward is also a plateau (info)
    assert state.scalar_points == 200 * 11


def test_each_finding_is_reported_once(tmp_path: Path) -> None:
    series = trl_series(train__entropy=after(60, 0.8, 0.05), train__reward=flat(0.5))
    log = tmp_path / EVENTS
    log.write_bytes(_records(series, range(150)))
    seen: list[str] = []

    def grow(state: WatchState) -> None:
        with log.open("ab") as handle:
            start = 150 + 10 * (state.polls - 1)
            handle.write(_records(series, range(start, start + 10)))

    state = watch([tmp_path], CPU, interval=0, max_polls=4, on_finding=lambda d, f: seen.append(f.code), on_poll=grow)
    assert state.failing is None and state.scans == 4
    assert sorted(seen) == ["CD503", "CD507"]  # each once
    assert state.last_step == 179


def test_a_finding_the_run_grows_out_of_is_withdrawn(tmp_path: Path) -> None:
    # Expected from CD503's rule: entropy at 0.05 of its early 0.8 with a flat reward is a collapse (printed at the
    # first poll); entropy falling while the reward rises is convergence, not reported. The steps appended later
    # carry a reward of 0.9 against 0.5 before, so once the current window holds them the finding no longer holds:
    # it is withdrawn, once, with its code, and the summary counts it. The flat reward of the first 150 steps is a
    # plateau (CD507) that the rise to 0.9 ends as well: a reward that gained 0.4 did not stall, so it goes too.
    early = trl_series(train__entropy=after(60, 0.8, 0.05), train__reward=flat(0.5))
    later = trl_series(train__entropy=flat(0.05, noise=0.005), train__reward=flat(0.9))
    log = tmp_path / EVENTS
    log.write_bytes(_records(early, range(150)))
    printed: list[str] = []
    gone: list[str] = []
    lines: list[str] = []

    def grow(state: WatchState) -> None:
        with log.open("ab") as handle:
            start = 150 + 10 * (state.polls - 1)
            handle.write(_records(later, range(start, min(start + 10, 200))))

    state = watch(
        [tmp_path],
        CPU,
        interval=0,
        max_polls=5,
        on_finding=lambda d, f: printed.append(f.code),
        on_withdrawn=lambda d, f: gone.append(f.code) or lines.append(withdrawn_line(d, f)),
        on_poll=grow,
    )
    assert sorted(printed) == ["CD503", "CD507"] and sorted(gone) == ["CD503", "CD507"]
    assert state.reported == {} and "no findings (2 withdrawn)" in state.summary()
    # at the second poll (steps 0-159) the current window is the last 16 steps, 10 of them at 0.9: its median
    # reward is 0.9, above the early 0.5, so the collapse came with a gain from then on
    assert any(" WITHDRAWN CD503 " in line and line.endswith(": no longer found at step 159") for line in lines)
    assert not any(f.code in ("CD503", "CD507") for f in state.diagnoses[""].findings)


def test_a_glob_is_polled_for_new_matches(tmp_path: Path) -> None:
    # A quoted glob may match files later: each poll lists what it matches now, so a new file is a change.
    pattern = str(tmp_path / "run" / "*" / EVENTS)
    (tmp_path / "run" / "a").mkdir(parents=True)
    series = trl_series()
    (tmp_path / "run" / "a" / EVENTS).write_bytes(_records(series, range(50)))

    def grow(state: WatchState) -> None:
        (tmp_path / "run" / f"b{state.polls}").mkdir()
        (tmp_path / "run" / f"b{state.polls}" / EVENTS).write_bytes(_records(series, range(50)))

    state = watch([pattern], CPU, interval=0, max_polls=3, on_poll=grow)
    assert state.scans == 3 and {"a", "b1", "b2"} <= set(state.diagnoses)  # the first poll saw one run, unnamed


def test_waits_for_inputs_that_do_not_exist_yet(tmp_path: Path) -> None:
    notes: list[str] = []
    series = trl_series()

    def create(state: WatchState) -> None:
        if state.polls == 2:
            (tmp_path / EVENTS).write_bytes(_records(series, range(50)))

    state = watch([tmp_path], CPU, interval=0, max_polls=3, on_note=notes.append, on_poll=create)
    assert len(notes) == 1 and notes[0].startswith("waiting: ") and "no run found" in notes[0]
    assert state.scans == 1 and state.last_step == 49 and state.reported == {}


def test_watch_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / EVENTS).write_bytes(
        _records(trl_series(train__entropy=after(60, 0.8, 0.05), train__reward=flat(0.5)), range(150))
    )
    runner = CliRunner()
    args = ["watch", str(tmp_path), "--interval", "0", "--max-polls", "2", "--device", "cpu"]
    failing = runner.invoke(app, [*args, "--fail-on", "warning"])
    assert failing.exit_code == 1, failing.output
    assert failing.stdout.count("WARNING CD503 ") == 1 and "stopping: CD503" in failing.stdout
    quiet = runner.invoke(app, args)
    assert quiet.exit_code == 0 and "watched 2 poll(s), 1 scan(s), last step 149: 1 warning" in quiet.stdout
    bad = runner.invoke(app, [*args, "--fail-on", "sometimes"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("collapse_doctor.pipeline.watch.watch", interrupted)
    stopped = runner.invoke(app, args)
    assert stopped.exit_code == 0 and "stopped (Ctrl-C)" in stopped.stdout


def test_per_step_rollout_files_are_read_once_and_match_a_full_scan(tmp_path: Path) -> None:
    import numpy as np

    from collapse_doctor.pipeline.incremental import IncrementalScan
    from collapse_doctor.pipeline.scan import diagnose
    from tests.helpers.trl import trl_output_dir

    out = trl_output_dir(tmp_path / "out", saturate_at=10)
    held = tmp_path / "held"
    held.mkdir()
    for f in sorted((out / "completions").glob("*.parquet"))[15:]:
        f.rename(held / f.name)

    def trainer_writes_on(state: WatchState) -> None:
        if state.polls == 1:
            for f in sorted(held.iterdir()):
                f.rename(out / "completions" / f.name)

    seen: list[str] = []
    state = watch(
        [out],
        CPU,
        interval=0,
        max_polls=3,
        on_poll=trainer_writes_on,
        on_finding=lambda d, f: seen.append(f.code),
    )
    assert state.scans == 2 and state.files_reduced == 30  # each completions file reduced once
    assert "CD101" in seen

    scanner = IncrementalScan()
    merged = scanner.diagnose_runs([out], CPU)[0]
    full = diagnose([out], CPU)
    assert scanner.files_reduced == 30
    assert merged.series.steps.tolist() == full.series.steps.tolist()
    for name, values in full.series.values.items():
        np.testing.assert_allclose(merged.series.values[name], values, rtol=1e-5, atol=1e-6, err_msg=name)
    assert [(f.code, f.channels, f.onset_step) for f in merged.findings] == [
        (f.code, f.channels, f.onset_step) for f in full.findings
    ]
    assert (merged.run.rollouts, merged.run.groups, merged.run.scalar_points) == (
        full.run.rollouts,
        full.run.groups,
        full.run.scalar_points,
    )
    assert merged.run.algorithm == full.run.algorithm


def test_a_second_run_appearing_does_not_reprint_the_first_runs_findings(tmp_path: Path) -> None:
    # Alone, a run is unnamed; once a second run dir appears beside it, both are named. The first run's findings
    # are the same findings: they are not printed again under its new name (the second run's are new).
    series = trl_series(train__entropy=after(60, 0.8, 0.05), train__reward=flat(0.5))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / EVENTS).write_bytes(_records(series, range(150)))
    printed: list[tuple[str, str]] = []

    def grow(state: WatchState) -> None:
        if state.polls == 1:
            (tmp_path / "b").mkdir()
            (tmp_path / "b" / EVENTS).write_bytes(_records(series, range(150)))

    watch(
        [tmp_path],
        CPU,
        interval=0,
        max_polls=2,
        on_finding=lambda d, f: printed.append((d.run.name or "", f.code)),
        on_poll=grow,
    )
    first = [code for name, code in printed if name == ""]
    assert sorted(first) == ["CD503", "CD507"]
    assert sorted(code for name, code in printed if name == "b") == ["CD503", "CD507"]
    assert not [code for name, code in printed if name == "a"]  # the first run, renamed: nothing printed twice
