"""Text from the logs made safe to show: control characters escaped (no I/O, no state).

Channel names, run names, paths and messages that embed them come from files the user may not have written.
Shown raw, an ANSI escape could recolour or rewrite the terminal, a newline could forge a line of the report,
a bidi control (U+202E...) could reorder what is read. :func:`printable` shows each such character as its
Python escape (``\\x1b``, ``\\n``, ``\\u202e``) and leaves every other character, backslashes included, as is.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["printable"]

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_ASCII_SAFE = re.compile(r"[ -~]*")


def _unsafe(char: str) -> bool:
    return char in _BIDI or unicodedata.category(char) in _UNSAFE_CATEGORIES


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object) -> str:
    """``str(text)`` with control, format and bidi characters escaped; everything else unchanged.

    >>> printable("format")
    'format'
    >>> print(printable("evil\\x1b[31m\\nname\\u202e"))
    evil\\x1b[31m\\nname\\u202e
    >>> printable("naïve ✅")
    'naïve ✅'
    """
    text = str(text)
    if _ASCII_SAFE.fullmatch(text):
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)
