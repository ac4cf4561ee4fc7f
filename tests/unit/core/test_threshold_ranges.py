"""Every threshold has a stated range; a config value outside it is one error naming the key, never a detector
silently switched off (a share of 80 meant as a percent, NaN, a negative ratio, a fractional count)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collapse_doctor.judge.detectors  # noqa: F401  (registers every detector)
from collapse_doctor.core.config import Config, parse_config
from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.judge.detectors.base import threshold_defaults, threshold_ranges
from collapse_doctor.pipeline.scan import resolve_config

BASE = Config(defaults=threshold_defaults(), ranges=threshold_ranges())


def _set(code: str, name: str, value: object) -> Config:
    return parse_config({"thresholds": {code: {name: value}}}, source="t.toml", base=BASE)


@pytest.mark.parametrize(
    ("code", "name", "value", "range_text"),
    [
        ("CD402", "share", 80, "a number from 0 to 1"),  # a percent for a share
        ("CD402", "share", math.nan, "a number from 0 to 1"),
        ("CD101", "warn_ratio", -5, "a number from 0 to 1"),
        ("CD501", "spike_ratio", math.inf, "a finite number >= 0"),
        ("CD102", "min_groups", 2.5, "a whole number >= 1"),
        ("CD102", "min_groups", 0, "a whole number >= 1"),
        ("CD506", "group_size", 1, "a whole number >= 2"),
        ("CD510", "max_tau", 1.5, "a number from -1 to 1"),
    ],
)
def test_a_value_outside_its_range_is_an_error_naming_the_key(
    code: str, name: str, value: float, range_text: str
) -> None:
    with pytest.raises(UsageError) as caught:
        _set(code, name, value)
    message = caught.value.one_line()
    assert message.startswith(f"t.toml: 'thresholds.{code}.{name}' must be {range_text}, got {value!r}")
    assert "its default is" in message


def test_a_config_built_in_code_is_checked_as_a_file_is(tmp_path: Path) -> None:
    """The TRL callback's config= takes a Config: its thresholds go through the same check."""
    options = ScanOptions(config=Config(thresholds={"CD402": {"share": 80.0}}))
    with pytest.raises(UsageError, match=r"'thresholds\.CD402\.share' must be a number from 0 to 1"):
        resolve_config([tmp_path], options)


def test_every_default_is_in_its_range_and_every_threshold_has_one() -> None:
    defaults, ranges = threshold_defaults(), threshold_ranges()
    assert set(defaults) == set(ranges)
    for code, values in defaults.items():
        assert set(values) == set(ranges[code])
        for name, value in values.items():
            assert ranges[code][name].check(float(value)), (code, name, value)


PAIRS = [(code, name) for code, values in threshold_defaults().items() for name in values]


@settings(max_examples=200, deadline=None)
@given(
    pair=st.sampled_from(PAIRS),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-1000, 1000)),
)
def test_any_value_is_accepted_exactly_when_it_is_in_range(pair: tuple[str, str], value: float) -> None:
    code, name = pair
    allowed = threshold_ranges()[code][name]
    if allowed.check(float(value)):
        assert _set(code, name, value).threshold(code, name) == float(value)
    else:
        with pytest.raises(UsageError, match=rf"thresholds\.{code}\.{name}"):
            _set(code, name, value)
