"""Text from the logs made safe to show: control characters escaped (no I/O, no state).

Channel names, run names, paths and messages that embed them come from files the user may not have written.
Shown raw, an ANSI escape could recolour or rewrite the terminal, a newline could forge a line of the report,
a bidi control (U+202E...) could reorder what is read. :func:`printable` shows each such character as its
Python escape (``\\x1b``, ``\\n``, ``\\u202e``) and leaves every other character, backslashes included, as is.

:func:`shortened` and :func:`describe_sources` keep a long name or a list of inputs to a phrase every renderer
(terminal, Markdown, HTML) shows alike.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from pathlib import PurePath

__all__ = ["describe_sources", "printable", "shortened"]

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
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte of a file name that is not UTF-8 (Python's surrogateescape)
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
    >>> print(printable(bytes([114, 0xFF]).decode("utf-8", "surrogateescape")))  # a file name's own bytes
    r\\xff
    """
    text = str(text)
    if _ASCII_SAFE.fullmatch(text):
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)


def shortened(text: str, width: int = 60) -> str:
    """``text`` cut in the middle to at most ``width`` characters (its start and its end kept: a long run name or
    path still reads as itself); shorter text unchanged.

    >>> shortened("sweeps/lr-1e-6/seed-0/" + "x" * 100 + "/final", 40)
    'sweeps/lr-1e-6/seed-0/xxxx…xxxxxxx/final'
    >>> shortened("demo", 40)
    'demo'
    """
    if len(text) <= width:
        return text
    tail = max(1, (width - 1) // 3)
    return text[: width - 1 - tail] + "…" + text[-tail:]


def describe_sources(sources: Sequence[str], shown: int = 3) -> str:
    """The input files in one short phrase: up to ``shown`` paths, else their directory and the file count.

    >>> describe_sources(["runs/a.parquet"])
    'runs/a.parquet'
    >>> describe_sources([f"out/rollouts/part-{i}.parquet" for i in range(12)])
    'out/rollouts/ (12 files)'
    >>> describe_sources([f"out/rollouts/p{i}.parquet" for i in range(4)] + ["out/runs/x/ev", "out/tb/ev"])
    'out/ (6 files in rollouts/, runs/x/, tb/)'
    >>> describe_sources([f"s3://bucket/run/part-{i}.parquet" for i in range(12)])
    's3://bucket/run/ (12 files)'
    """
    if len(sources) <= shown:
        return ", ".join(sources)
    scheme, _, _ = sources[0].partition("://")
    if "://" in sources[0] and all(s.startswith(scheme + "://") for s in sources):
        # Object storage: PurePath would fold "s3://b/k" into "s3:/b/k"; describe the keys, keep the scheme.
        inner = describe_sources([s[len(scheme) + 3 :] for s in sources], shown)
        return f"{scheme}://{inner}"
    paths = [PurePath(s) for s in sources]
    parents = list(dict.fromkeys(p.parent for p in paths))
    if len(parents) == 1:
        return f"{_dir(parents[0])} ({len(sources)} files)"
    try:
        common = PurePath(os.path.commonpath([str(p) for p in parents]))
    except ValueError:  # absolute and relative paths mixed, or different drives
        common = None
    if common is None or str(common) in (".", common.anchor):
        return ", ".join(sources[:shown]) + f" (+{len(sources) - shown} files)"
    places = [_dir(p.relative_to(common)) if p != common else "./" for p in parents]
    where = ", ".join(places) if len(places) <= shown else f"{len(places)} directories"
    return f"{_dir(common)} ({len(sources)} files in {where})"


def _dir(path: PurePath) -> str:
    text = str(path)
    return text if text.endswith(("/", "\\")) else text + "/"
