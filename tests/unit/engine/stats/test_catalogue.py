"""The series catalogue: every name the statistics produce is in it, with the shape it has there."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from collapse_doctor.core.series import SERIES, RunSeries, SeriesBuilder, channel_pairs, in_catalogue_order
from collapse_doctor.engine import stats
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from tests.helpers.stats_cases import LAYOUTS, make_case


def expected_names(channels: int, logged: bool) -> list[str]:
    """The catalogue's names that a chunk of ``channels`` channels, with or without a logged advantage, has."""
    return [
        name
        for name, spec in SERIES.items()
        if (channels >= 2 or spec.shape != "pair")
        and (logged or all(name not in f.NAMES for f in stats.LOGGED_FAMILIES))
    ]


def test_families_partition_the_catalogue() -> None:
    names = [name for family in stats.FAMILIES for name in family.NAMES]
    assert len(names) == len(set(names)), "a name is declared by two families"
    assert set(names) == set(SERIES)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("channels", [1, 2, 3])
@pytest.mark.parametrize("logged", [False, True])
def test_statistics_are_the_catalogue(layout: str, channels: int, logged: bool) -> None:
    case = make_case(layout, channels=channels, logged=logged)
    out = case.stats
    assert list(out) == expected_names(channels, logged)
    width = {"run": None, "channel": channels, "pair": len(list(combinations(range(channels), 2)))}
    for name, array in out.items():
        w = width[SERIES[name].shape]
        assert array.shape == ((case.num_steps,) if w is None else (case.num_steps, w)), name


@pytest.mark.parametrize("layout", ["dense", "messy"])
def test_each_family_produces_only_its_names(layout: str) -> None:
    case = make_case(layout, channels=3, logged=True)
    prepared = DenseChunk.from_input(case.chunk, 8) if layout == "dense" else GeneralChunk(case.chunk)
    for family in stats.FAMILIES:
        out = family.dense(prepared) if isinstance(prepared, DenseChunk) else family.general(prepared)
        assert set(out) == set(family.NAMES), family.__name__


def test_in_catalogue_order_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="not a per-step series"):
        in_catalogue_order({"rollouts": 1, "made_up": 2})


def test_series_json_follows_the_catalogue_shape() -> None:
    case = make_case("dense", channels=3)
    channels = ("a", "b", "c")
    builder = SeriesBuilder(channels, channel_pairs(channels))
    builder.add(np.arange(case.num_steps), case.stats)
    data = builder.build().to_json()
    assert set(data["within_corr"]) == {"a|b", "a|c", "b|c"}
    assert set(data["rel_gain"]) == set(channels)
    assert isinstance(data["rollouts"], list)
    # the counterfactual counts stay in memory: run.counterfactuals sums them
    assert list(data) == ["step", *(n for n in expected_names(3, logged=False) if not n.startswith("cf_"))]


def test_series_json_refuses_unknown_or_misshapen_series() -> None:
    steps = np.arange(2)
    with pytest.raises(KeyError, match="made_up"):
        RunSeries(steps, ("a",), [], {"made_up": np.zeros(2)}).to_json()
    with pytest.raises(ValueError, match="rel_gain"):
        RunSeries(steps, ("a",), [], {"rel_gain": np.zeros(2)}).to_json()


def test_logged_candidates_are_the_estimators() -> None:
    from collapse_doctor.core.estimators import ESTIMATORS
    from collapse_doctor.core.series import RECOMPUTATIONS
    from collapse_doctor.engine.stats.logged import CANDIDATES

    assert set(CANDIDATES) == {spec.key for spec in ESTIMATORS} >= set(RECOMPUTATIONS)
    assert {f"logged_mae_{spec.key}" for spec in ESTIMATORS} <= set(SERIES)
