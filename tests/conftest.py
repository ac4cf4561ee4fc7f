"""Shared fixtures: tests build their own Parquet runs in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.tables import WriteTable


@pytest.fixture
def write_table(tmp_path: Path) -> WriteTable:
    def write(
        table: pa.Table,
        name: str = "run.parquet",
        *,
        weights: dict[str, float] | None = None,
        row_group_size: int | None = None,
    ) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if weights is not None:
            table = table.replace_schema_metadata({"collapse_doctor.weights": json.dumps(weights)})
        pq.write_table(table, path, row_group_size=row_group_size)
        return path

    return write
