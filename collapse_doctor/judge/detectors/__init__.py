"""The detector registry: importing this package registers every detector family."""

from collapse_doctor.judge.detectors import channels, health, resolution, scalars, shape, signal, truncation
from collapse_doctor.judge.detectors.base import (
    REGISTRY,
    DetectionContext,
    Detector,
    Finding,
    Severity,
    explain_sections,
    register,
)

__all__ = [
    "REGISTRY",
    "DetectionContext",
    "Detector",
    "Finding",
    "Severity",
    "channels",
    "explain_sections",
    "health",
    "register",
    "resolution",
    "scalars",
    "shape",
    "signal",
    "truncation",
]
