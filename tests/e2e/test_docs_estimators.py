"""docs/input-formats.md carries the estimator catalogue as generated from collapse_doctor.core.estimators."""

from __future__ import annotations

import os

import pytest

from collapse_doctor.core.estimators import estimator_table
from tests.helpers.paths import ROOT

START, END = "<!-- estimators:start -->\n", "<!-- estimators:end -->"


def test_the_estimator_table_in_the_docs_is_the_catalogue() -> None:
    path = ROOT / "docs" / "input-formats.md"
    text = path.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(head + START + estimator_table() + END + tail)
        pytest.skip("UPDATE_GOLDEN=1: the estimator table in docs/input-formats.md rewritten")
    assert rest.split(END)[0] == estimator_table(), "rerun with UPDATE_GOLDEN=1"
