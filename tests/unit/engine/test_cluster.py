"""``--ray`` without Ray running: the optional address, the missing extra, the errors a task returns."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError, SchemaError
from collapse_doctor.engine.cluster import normalise_ray_flag
from tests.helpers.tables import make_table


def test_bare_ray_before_an_option_or_at_the_end(tmp_path: Path) -> None:
    assert normalise_ray_flag(["scan", "r", "--ray"]) == ["scan", "r", "--ray=local"]
    assert normalise_ray_flag(["scan", "--ray", "--json", "x"]) == ["scan", "--ray=local", "--json", "x"]
    assert normalise_ray_flag(["scan", "--ray", "ray://head:10001", "r"]) == ["scan", "--ray=ray://head:10001", "r"]
    assert normalise_ray_flag(["scan", "--", "--ray"]) == ["scan", "--", "--ray"]
    local = tmp_path / "auto"
    local.mkdir()  # a directory named like an address is the path it is
    assert normalise_ray_flag(["scan", "--ray", str(local)]) == ["scan", "--ray=local", str(local)]


def test_missing_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.parquet"
    pq.write_table(make_table(steps=12, groups=8), path)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    result = CliRunner().invoke(app, ["scan", str(path), "--ray", "local"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --ray needs Ray, which is not installed. Hint: pip install 'collapse-doctor[ray]'"
    )


def test_errors_travel_with_their_hint() -> None:
    error = pickle.loads(pickle.dumps(SchemaError("x.parquet: bad column", hint="fix it")))
    assert isinstance(error, SchemaError) and isinstance(error, InputError)
    assert (error.message, error.hint) == ("x.parquet: bad column", "fix it")
