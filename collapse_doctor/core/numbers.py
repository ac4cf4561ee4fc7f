"""Small numeric helpers and display formats shared by detectors and renderers (no I/O, no state)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np


def nanmedian(values: np.ndarray) -> float:
    """Median ignoring NaN; NaN when nothing is left (no warning).

    >>> nanmedian(np.array([1.0, np.nan, 3.0])), bool(np.isnan(nanmedian(np.array([np.nan]))))
    (2.0, True)
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(np.isnan(values)):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(values))


def share_pct(value: float | None) -> str:
    """A variance share as a percentage for messages and tables, clipped to [0%, 100%]; ``-`` for none.

    Shares are covariance shares (``w_c * Cov(r_c, total) / Var(total)``): they sum to 1 over the channels, but
    a channel that moves against the total has a slightly negative share and the others then a little over 1.
    The exact values stay in the evidence and the JSON series.

    >>> share_pct(1.013), share_pct(-0.03), share_pct(0.456), share_pct(None)
    ('100%', '0%', '46%', '-')
    """
    if value is None or not np.isfinite(value):
        return "-"
    return f"{min(max(float(value), 0.0), 1.0):.0%}"


def pct(value: Any) -> str:
    """A share as a whole percentage; ``-`` for none or not finite.

    >>> pct(0.314), pct(None), pct(float("nan"))
    ('31%', '-', '-')
    """
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.0%}"


def fixed(value: float, digits: int = 2) -> str:
    """A reward-scale number for a table cell, never wider than about 10 characters: ``digits`` decimals, small
    magnitudes in ``g`` form, and magnitudes of a million or more in scientific form.

    >>> fixed(0.5), fixed(0.004), fixed(123456.789), fixed(5.07e9), fixed(float("nan"))
    ('0.50', '0.004', '123456.79', '5.07e+09', '-')
    """
    if not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.{digits}e}"
    if magnitude < 1e-2 and value != 0:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"
