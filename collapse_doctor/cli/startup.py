"""What the ``collapse-doctor`` process does before a read command, to start faster.

pyarrow imports pandas the first time it builds or reads an array (its Python layer asks whether pandas is there,
and its C++ layer fetches pandas' NA and NaT markers), whether or not pandas objects are ever converted. That import
costs about 0.15 s, a fifth of a one-step scan's start-up (docs/benchmarks.md, "Start-up"), and the read commands
never hand pyarrow a pandas object: pandas is used only for long rolling medians (core.smoothing), on NumPy arrays.
So in the executable's own process, for the read commands only, pyarrow's first probe is answered with "pandas is
not installed"; pyarrow remembers that, imports pandas later only where a pandas conversion asks for it (and then
works), and pandas itself stays importable for whoever needs it.

This never runs in another program's process (the Python API, the TRL callback, the tests' in-process CLI runner):
there pandas objects may well reach pyarrow, and pyarrow must know pandas. Nor for ``retrain`` (TRL and datasets
convert pandas objects). Where pyarrow changes how it probes, the worst outcome is the import it makes today.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from typing import Any

__all__ = ["READ_COMMANDS", "before_command"]

READ_COMMANDS = frozenset({"scan", "report", "compare", "watch", "advantages"})
"""Commands whose process hands pyarrow no pandas object: pyarrow's pandas probe is skipped for them."""


class _NoPandas:
    """A meta path finder under which ``import pandas`` fails as if pandas were not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (deferred by collapse-doctor)", name=name)
        return None


def skip_pyarrow_pandas_probe() -> bool:
    """Let pyarrow make its pandas probes now, while pandas cannot be imported; True when they were made so.

    Nothing is done when pandas is loaded already (the probes found it), or pyarrow is missing."""
    if "pandas" in sys.modules:
        return False
    try:
        import pyarrow as pa
    except ImportError:
        return False
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:  # pyarrow probes once per process: made here, they are made for good
        with contextlib.suppress(Exception):  # another pyarrow may probe otherwise: then it imports pandas later
            _ = pa.lib._pandas_api.have_pandas  # the Python layer's probe: remembered as "not installed"
            pa.array([0.0, None])  # the C++ layer's: its pandas markers, looked up once
    finally:
        sys.meta_path.remove(blocker)
        for name in [n for n in sys.modules if n == "pandas" or n.startswith("pandas.")]:
            del sys.modules[name]  # nothing half-imported is left behind
    return True


def before_command(args: Sequence[str]) -> None:
    """What the executable does before it parses ``args`` (its command line without the program name)."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command in READ_COMMANDS:
        skip_pyarrow_pandas_probe()
