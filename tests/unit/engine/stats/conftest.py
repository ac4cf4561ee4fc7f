"""The chunk layouts every statistics reference test runs on."""

from __future__ import annotations

import pytest

from tests.helpers.stats_cases import LAYOUTS, Case, make_case


@pytest.fixture(params=LAYOUTS)
def case(request: pytest.FixtureRequest) -> Case:
    """A three-channel chunk with a logged advantage, in each layout."""
    return make_case(request.param, logged=True)
