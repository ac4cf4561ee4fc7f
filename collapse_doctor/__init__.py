"""collapse-doctor: find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.

Importing the package is cheap: torch and pyarrow load only when a function that needs them runs.

>>> import collapse_doctor
>>> callable(collapse_doctor.diagnose), callable(collapse_doctor.diagnose_runs)
(True, True)
"""

from __future__ import annotations

from typing import Any

from collapse_doctor.core.version import __version__ as __version__

__all__ = ["Diagnosis", "ScanOptions", "diagnose", "diagnose_runs"]


def __getattr__(name: str) -> Any:
    if name in ("diagnose", "diagnose_runs"):
        from collapse_doctor.pipeline import scan as pipeline

        return getattr(pipeline, name)
    if name in ("Diagnosis", "ScanOptions"):
        from collapse_doctor.core import options, result

        return getattr(result if name == "Diagnosis" else options, name)
    raise AttributeError(f"module 'collapse_doctor' has no attribute {name!r}")
