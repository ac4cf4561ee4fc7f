"""json_text.dumps: the same value as json.dumps, lists of plain values on one line, nothing mistaken for them."""

from __future__ import annotations

import json

import pytest

from collapse_doctor.core.json_text import dumps


@pytest.mark.parametrize(
    "document",
    [
        {"series": {"step": list(range(50)), "value": [0.5, None, 1e-300, -2.0]}, "name": "run"},
        {"hostile": ["\x000\x00", '"\\u0000', "\u2028"], "key\x00": "\x000\x00", "nested": [[1, 2], [], [{"a": [1]}]]},
        {"tuple": (1, "a", True, None), "empty": [], "deep": {"x": {"y": [[[]]]}}},
        [1, 2, 3],
        "just a string",
    ],
)
def test_parses_to_the_same_value(document: object) -> None:
    text = dumps(document)
    assert json.loads(text) == json.loads(json.dumps(document))
    assert dumps(document, indent=None) == json.dumps(document, allow_nan=False)


def test_plain_lists_are_on_one_line() -> None:
    text = dumps({"run": {"steps": [1, 2, 3]}, "findings": [{"code": "CD101", "channels": ["a", "b"]}]})
    assert '"steps": [1, 2, 3]' in text and '"channels": ["a", "b"]' in text
    assert text.count("\n") == 10  # the dicts are indented as before


def test_nan_is_refused_as_before() -> None:
    with pytest.raises(ValueError, match="Out of range float values"):
        dumps({"values": [float("nan")]})
