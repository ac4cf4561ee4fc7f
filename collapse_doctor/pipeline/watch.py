"""``collapse-doctor watch``: follow a run while it trains and report each finding once, as it appears.

Every ``interval`` seconds the inputs are listed again (new event files, new rollout files, growing logs).
When something changed, the run is diagnosed again, reading only what is new
(:mod:`collapse_doctor.pipeline.incremental`): the records appended to event files and verl file logs, and the
per-step rollout files (TRL, verl, NeMo-RL) that appeared; canonical Parquet runs are read again whole.
A finding is printed the first time it appears and again only if its severity rises; one that a later check no
longer finds (the run grew out of it) is withdrawn with a line saying so, and printed again if it comes back. With
``fail_on``
the watch ends with exit code 1 at the first finding at or above that level (a sidecar that stops a bad
run); Ctrl-C ends it with exit code 0 and a summary. Inputs that are not readable yet (an empty
directory, a Parquet file still being written) are waited for.
"""

from __future__ import annotations

import glob
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collapse_doctor.core.errors import InputError
from collapse_doctor.core.findings import (
    Finding,
    FindingKey,
    Severity,
    check_fail_on,
    news,
    severity_counts,
    withdrawn,
)
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.core.text_safety import printable

if TYPE_CHECKING:
    from collapse_doctor.core.result import Diagnosis

GIVE_UP_SECONDS = 120.0
"""How long files that are there, unchanged and unreadable are waited for before watch gives up (exit 2)."""
MIN_INTERVAL = 0.1
"""The shortest poll interval in seconds: below it, polling would keep a core busy."""


@dataclass
class WatchState:
    """What the watch has seen so far."""

    polls: int = 0
    scans: int = 0
    reported: dict[FindingKey, Severity] = field(default_factory=dict)
    withdrawn: int = 0
    """Findings printed earlier that a later check no longer found (each said with a line)."""
    failing: Finding | None = None
    last_error: str | None = None
    last_step: int | None = None
    scalar_points: int = 0
    files_reduced: int = 0
    """Per-step rollout files read so far (each once unless it changed)."""
    stuck_polls: int = 0
    """Polls in a row on which files were there, had not changed, and still could not be read."""
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    """The latest diagnosis of each run (by name; "" for a lone run): what ``scan`` of the same files says."""
    latest: dict[str, Diagnosis] = field(default_factory=dict)
    """The same, by the run's first input (what its findings are known by, whatever it is named)."""

    def summary(self) -> str:
        found = severity_counts(self.reported.values()) or "no findings"
        if self.withdrawn:
            found += f" ({self.withdrawn} withdrawn)"
        step = f", last step {self.last_step}" if self.last_step is not None else ""
        return f"watched {self.polls} poll(s), {self.scans} scan(s){step}: {found}"


def snapshot(paths: Sequence[str | Path]) -> dict[str, tuple[int, int] | tuple[int, int, str]]:
    """Size and modification time of every file under the inputs (a glob: under what it matches now), which is what
    a change is judged by; objects in storage also by their ETag, from one listing per URL (bounded work per
    poll)."""
    from collapse_doctor.io.storage.remote import is_url, snapshot_url

    out: dict[str, tuple[int, int] | tuple[int, int, str]] = {}
    for raw in paths:
        if is_url(raw):
            out.update(snapshot_url(str(raw)))
            continue
        text = str(raw)
        named = [Path(text)] if Path(text).exists() or not glob.has_magic(text) else map(Path, glob.glob(text))
        files = [f for path in named for f in (sorted(path.rglob("*")) if path.is_dir() else [path]) if f.is_file()]
        for f in files:
            try:
                stat = f.stat()
            except OSError:
                continue
            out[str(f)] = (stat.st_size, stat.st_mtime_ns)
    return out


def watch(
    paths: Sequence[str | Path],
    options: ScanOptions | None = None,
    *,
    interval: float = 30.0,
    fail_on: str = "never",
    max_polls: int | None = None,
    on_finding: Callable[[Diagnosis, Finding], None] | None = None,
    on_withdrawn: Callable[[Diagnosis, Finding], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    on_poll: Callable[[WatchState], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    state: WatchState | None = None,
) -> WatchState:
    """Poll ``paths`` until a finding reaches ``fail_on``, ``max_polls`` polls were made, or Ctrl-C.

    ``options`` are the scan's (their ``fail_on`` is ignored: ``fail_on`` here decides). Returns the state
    (``state``, when given, is updated in place, so a caller interrupted by a signal still has it); its
    ``failing`` finding is set when the watch stopped because of ``fail_on``.

    A path that does not exist is an InputError at once (a typo must not wait forever; a glob may match files
    later). Inputs that cannot be read yet are waited for: an empty directory, or files that keep changing. Files
    that stay unchanged and unreadable for :data:`GIVE_UP_SECONDS` (at least 3 polls) are an InputError.
    """
    from collapse_doctor.io.storage.list_files import expand_list_files
    from collapse_doctor.io.storage.remote import is_url
    from collapse_doctor.pipeline.incremental import IncrementalScan

    scan_options = options or ScanOptions()
    level = check_fail_on(fail_on)
    threshold = None if level == "never" else Severity[level.upper()]
    paths = expand_list_files(paths)
    for raw in paths:
        if not is_url(raw) and not glob.has_magic(str(raw)) and not Path(raw).exists():
            raise InputError(
                f"{raw}: no such file or directory",
                hint="watch follows an existing run: check the path, or create the output directory first",
            )
    patience = max(3, math.ceil(GIVE_UP_SECONDS / interval)) if interval > 0 else 3
    scanner = IncrementalScan()
    state = state if state is not None else WatchState()
    previous: dict[str, tuple[int, int] | tuple[int, int, str]] | None = None
    while max_polls is None or state.polls < max_polls:
        if state.polls:
            sleep(interval)
        state.polls += 1
        current = snapshot(paths)
        if current == previous and state.last_error is not None and current:
            state.stuck_polls += 1
            if state.stuck_polls >= patience:
                raise InputError(
                    f"{state.last_error} (unchanged for {state.stuck_polls} polls)",
                    hint="the files are there but cannot be read; point watch at the run's output directory",
                )
        if current != previous:
            previous = current
            state.stuck_polls = 0
            try:
                diagnoses = scanner.diagnose_runs(paths, scan_options.with_(fail_on="never"))
            except InputError as exc:
                message = exc.one_line()
                if message != state.last_error and on_note is not None:
                    on_note(f"waiting: {message}")
                state.last_error = message
                diagnoses = []
            else:
                state.last_error = None
                state.scans += 1
                state.files_reduced = scanner.files_reduced
            for diagnosis in diagnoses:
                run = diagnosis.run.name or ""
                # What a finding is known by: the run's first input, which stays when a second run appears beside it
                # (the lone run, unnamed, then gets its name: its findings must not be printed again under it)
                identity = diagnosis.run.sources[0] if diagnosis.run.sources else run
                earlier = state.latest.get(identity)
                state.diagnoses[run] = state.latest[identity] = diagnosis
                state.last_step = diagnosis.run.last_step
                state.scalar_points = diagnosis.run.scalar_points
                gone = withdrawn(state.reported, earlier.findings if earlier else (), diagnosis.findings, identity)
                for finding in gone:
                    state.withdrawn += 1
                    if on_withdrawn is not None:
                        on_withdrawn(diagnosis, finding)
                for finding in news(state.reported, diagnosis.findings, identity):
                    if on_finding is not None:
                        on_finding(diagnosis, finding)
                    if threshold is not None and finding.severity >= threshold and state.failing is None:
                        state.failing = finding
            if state.failing is not None:
                return state
        if on_poll is not None:
            on_poll(state)
    return state


def withdrawn_line(diagnosis: Diagnosis, finding: Finding) -> str:
    """A finding printed earlier that the latest check no longer has, as the watch says so."""
    stamp = time.strftime("%H:%M:%S")
    run = f" [{diagnosis.run.name}]" if diagnosis.run.name else ""
    step = f" at step {diagnosis.run.last_step}" if diagnosis.run.last_step is not None else ""
    return printable(f"{stamp} WITHDRAWN {finding.code}{run} {finding.title}: no longer found{step}")


def finding_line(diagnosis: Diagnosis, finding: Finding) -> str:
    """One finding as the watch prints it: time, severity, code, run, title, where, message."""
    stamp = time.strftime("%H:%M:%S")
    run = f" [{diagnosis.run.name}]" if diagnosis.run.name else ""
    where = f" (onset step {finding.onset_step})" if finding.onset_step is not None else ""
    text = f"{stamp} {finding.severity.label.upper()} {finding.code}{run} {finding.title}{where}: {finding.message}"
    line = " ".join(text.split()) + (f" Remedy: {finding.remedy}" if finding.remedy else "")
    return printable(line)  # run and channel names come from the logs: never raw escapes on a terminal
