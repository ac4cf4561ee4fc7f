"""torch, imported on first use: modules that only sometimes need it bind this instead of importing torch.

A scan of a run in the dense layout on CPU (consecutive equal-size groups, no NaN: what TRL and most dumps
write) runs on NumPy alone (:mod:`collapse_doctor.engine.stats.dense`) and never pays torch's import (more than a
second); the general layouts, CUDA, ``advantages`` and ``retrain`` use torch. Modules shared by both write::

    if TYPE_CHECKING:
        import torch
    else:
        from collapse_doctor.engine.lazy_torch import torch

so type checkers see torch itself, and torch is imported the first time an attribute of it is read.
"""

from __future__ import annotations

import sys
from typing import Any


class _LazyTorch:
    """Stands for the ``torch`` module; the first attribute read imports it."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    def __repr__(self) -> str:
        return "<torch, imported on first use>" if "torch" not in sys.modules else repr(sys.modules["torch"])


torch: Any = _LazyTorch()


def imported() -> bool:
    """Whether torch has been imported in this process (by anyone)."""
    return "torch" in sys.modules
