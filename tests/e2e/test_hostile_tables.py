"""Generated hostile tables through every command (issue 14): random column types, NaN / inf / huge values,
duplicate, empty and control-character names, tiny and degenerate groups; since issue 26 also repeated step, group
and prompt columns, long completion text, many channels, and hostile config files.

Whatever the table, each command ends with exit code 0, 1 or 2, prints no traceback and no internal error, and
leaves nothing in the directory but the input and the outputs it was asked for (no temp file, no half-written
output after an error).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from collapse_doctor.cli.app import app

runner = CliRunner()

# Most draws are valid in each dimension, so most tables reach the statistics; the rest are hostile.
NAMES = st.sampled_from(
    ["format", "correct", "length"] * 3 + ["", " ", "step", "group_id", "a\x1b[31mb", "x\ny", "\u202eevil", "é"]
)
VALUES = st.sampled_from(
    ["normal", "binary"] * 4 + ["nan", "inf", "huge", "tiny", "constant", "ints", "bools", "strings"]
)


def _rewards(kind: str, n: int, rng: np.random.Generator) -> pa.Array:
    if kind == "binary":
        return pa.array((rng.random(n) < 0.5).astype(np.float64))
    if kind == "nan":
        values = rng.random(n)
        values[rng.random(n) < 0.7] = np.nan
        return pa.array(values)
    if kind == "inf":
        values = rng.random(n)
        values[0] = np.inf
        return pa.array(values)
    if kind == "huge":
        return pa.array(rng.random(n) * 1e300)
    if kind == "tiny":
        return pa.array(rng.random(n) * 1e-300)
    if kind == "constant":
        return pa.array(np.ones(n))
    if kind == "ints":
        return pa.array(rng.integers(-5, 5, n))
    if kind == "bools":
        return pa.array(rng.random(n) < 0.5)
    if kind == "strings":
        return pa.array([f"r{i}" for i in range(n)])
    return pa.array(rng.normal(size=n))


@st.composite
def hostile_tables(draw: st.DrawFn) -> pa.Table:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    steps = draw(st.integers(1, 8))
    n = steps * draw(st.integers(1, 24))
    names: list[str] = []
    arrays: list[pa.Array] = []
    step_kind = draw(st.sampled_from(["int"] * 6 + ["float", "fractional", "string", "missing", "null"]))
    step = np.sort(rng.integers(0, steps, n))
    if step_kind == "int":
        arrays.append(pa.array(step))
    elif step_kind == "float":
        arrays.append(pa.array(step.astype(np.float64)))
    elif step_kind == "fractional":
        arrays.append(pa.array(step + 0.5))
    elif step_kind == "string":
        arrays.append(pa.array([str(s) for s in step]))
    elif step_kind == "null":
        arrays.append(pa.array([None if i == 0 else int(s) for i, s in enumerate(step)], pa.int64()))
    if step_kind != "missing":
        names.append("step")
    group_kind = draw(st.sampled_from(["int"] * 4 + ["string", "null", "missing", "one"]))
    groups = rng.integers(0, draw(st.integers(1, 6)), n)
    if group_kind == "int":
        arrays.append(pa.array(groups))
    elif group_kind == "string":
        arrays.append(pa.array([f"g{g}" for g in groups]))
    elif group_kind == "null":
        arrays.append(pa.array([None if g == 0 else int(g) for g in groups], pa.int64()))
    elif group_kind == "one":
        arrays.append(pa.array(np.arange(n)))  # every group of size 1
    if group_kind != "missing":
        names.append("group_id")
    count = min(draw(st.integers(0, 12)), 1 + draw(st.integers(0, 2)))  # no reward column 1 time in 13
    unique = draw(st.sampled_from([True, True, True, False]))  # duplicate names now and then
    channels = draw(st.lists(NAMES, min_size=count, max_size=count, unique=unique))
    if draw(st.integers(0, 9)) == 0:
        channels = [f"c{k}" for k in range(draw(st.integers(20, 60)))]  # many channels
        event("many channels")
    for channel in channels:
        names.append("reward/" + channel)
        arrays.append(_rewards(draw(VALUES), n, rng))
    if draw(st.booleans()):
        names.append("prompt")
        arrays.append(pa.array([f"p{g}" for g in groups]))
    if draw(st.booleans()):
        names.append("advantage")
        arrays.append(_rewards(draw(VALUES), n, rng))
    if draw(st.integers(0, 5)) == 0:
        names.append("completion")  # long text that no detector of these tables needs
        event("completion text")
        arrays.append(pa.array(["x" * draw(st.sampled_from([0, 1, 20_000])) + str(i) for i in range(n)]))
    repeated = draw(st.sampled_from([None] * 6 + ["step", "group_id", "prompt"]))
    if repeated in names:
        names.append(repeated)  # the same name twice (a join that kept both sides)
        event(f"repeated {repeated}")
        arrays.append(arrays[names.index(repeated)])
    return pa.Table.from_arrays(arrays, names=names) if arrays else pa.table({"x": pa.array([], pa.int64())})


CONFIGS: list[bytes | None] = [
    None,
    None,
    b"persistence = 0.1\n",
    b"[thresholds.CD402]\nshare = 80\n",
    b"[thresholds.CD402]\nshare = nan\n",
    b"[thresholds.CD101]\nwarn_ratio = -5\n",
    b'min_persistence = "three"\n',
    b"[thresholds.CD999]\nx = 1\n",
    b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    b"\x00\xff\xfe binary",
]
"""Config files the commands that judge are given: valid, out of range, unknown, nested, binary."""

COMMANDS = {
    "scan": lambda src, out: ["scan", src, "--json", f"{out}/s.json", "--junit", f"{out}/j.xml"],
    "report": lambda src, out: ["report", src, "--html", f"{out}/r.html"],
    "advantages": lambda src, out: ["advantages", src, "-o", f"{out}/a.parquet"],
    "watch": lambda src, out: ["watch", src, "--interval", "0", "--max-polls", "1"],
}
OUTPUTS = {"s.json", "j.xml", "r.html", "r-*.html", "a.parquet"}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    table=hostile_tables(),
    command=st.sampled_from(sorted(COMMANDS)),
    group_size=st.sampled_from([None, 1, 3]),
    config=st.sampled_from(CONFIGS),
)
def test_hostile_tables_never_crash_a_command(
    table: pa.Table, command: str, group_size: int | None, config: bytes | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out = folder / "out"
        out.mkdir()
        source = folder / "run.parquet"
        pq.write_table(table, source)
        args = [*COMMANDS[command](str(source), str(out)), "--device", "cpu"]
        if group_size is not None:
            args += ["--group-size", str(group_size)]
        if config is not None and command != "advantages":
            (folder / "cd.toml").write_bytes(config)
            event(f"config {CONFIGS.index(config)}")
            args += ["--config", str(folder / "cd.toml")]
        result = runner.invoke(app, args)
        text = result.output
        assert result.exit_code in (0, 1, 2), (result.exit_code, text, repr(result.exception))
        assert "Traceback" not in text and "internal error" not in text, text
        if result.exit_code == 2:
            assert text.count("\n") >= 1 and "error: " in text
        left = {p.name for p in out.iterdir()}
        assert all(name in OUTPUTS or (name.startswith("r-") and name.endswith(".html")) for name in left), left
        if result.exit_code == 2 and command != "watch":
            assert left == set(), left
        assert sorted(p.name for p in folder.iterdir() if p.name != "cd.toml") == ["out", "run.parquet"]
