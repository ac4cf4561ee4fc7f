"""Hand-built per-step series of a healthy run, for detector unit tests: change what a test is about.

Every series of the catalogue (collapse_doctor.core.series.SERIES) gets a neutral value of its shape: channels
that vary in every group and share the variance evenly, no silent groups, no ties, no correlation, well-shaped
advantages. ``logged_*`` and ``wfit_*`` are left out (no logged advantage), as a reader without one leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from collapse_doctor.core.config import Config
from collapse_doctor.core.result import Diagnosis, RunSummary
from collapse_doctor.core.series import SERIES, RunSeries, channel_pairs
from collapse_doctor.judge.detectors.base import threshold_defaults
from collapse_doctor.pipeline.scan import detect

GROUPS, SIZE = 16, 8


UNKNOWN = (
    "silent_identical_groups_",
    "identical_pass_groups_",
    "identical_fail_groups_",
    "silent_cancel_groups_",
    "completion_groups",
    "identical_completion_groups",
    "distinct_completion_share",
    "equal_reward_distinct_groups",
    "completion_length_",
    "length_",
)
"""Series a hand-built run leaves unknown (NaN), as a reduction of rollouts without completion text and lengths
does, unless a test sets them: then the detectors fall back to what the other series say."""


def _neutral(name: str, channels: int) -> float:
    if name.startswith(UNKNOWN):
        return float("nan")
    rows, groups = GROUPS * SIZE, GROUPS
    table: dict[str, float] = {
        "rollouts": rows,
        "valid_rows": rows,
        "groups": groups,
        "eligible_groups": groups,
        "group_size_min": SIZE,
        "group_size_max": SIZE,
        "rel_gain": 0.6,
        "reward_std": 0.2,
        "reward_mean": 0.5,
        "reward_max": 1.0,
        "reward_min": 0.0,
        "channel_rows": rows,
        "channel_groups": groups,
        "signal_share_grpo": 1.0 / channels,
        "signal_share_gdpo": 1.0 / channels,
        "dominance_grpo": 1.0 / channels,
        "dominance_gdpo": 1.0 / channels,
        "adv_std_grpo": 0.93,
        "adv_std_gdpo": 1.0,
        "adv_kurtosis_grpo": -0.6,
        "adv_kurtosis_gdpo": -0.6,
        "adv_bimodality_grpo": 0.4,
        "adv_bimodality_gdpo": 0.4,
        "adv_abs_max_grpo": 2.0,
        "adv_abs_max_gdpo": 2.5,
        "distinct_ratio_grpo": 1.0,
        "distinct_ratio_gdpo": 1.0,
        "outlier_rest_std_grpo": np.nan,
        "outlier_rest_std_gdpo": np.nan,
        "differing_pairs": groups * SIZE * (SIZE - 1) / 2,
        "corr_sxx": 10.0,
        "corr_syy": 10.0,
        "corr_rows": rows,
        "corr_groups": groups,
    }
    return table.get(name, 0.0)


def make_series(steps: int = 100, channels: tuple[str, ...] = ("format", "correct"), **values: Any) -> RunSeries:
    """A RunSeries of ``steps`` steps; ``values`` replace whole series (arrays of the series' shape, or scalars)."""
    pairs = channel_pairs(channels)
    widths = {"run": None, "channel": len(channels), "pair": len(pairs)}
    out: dict[str, np.ndarray] = {}
    for name, spec in SERIES.items():
        if name.startswith(("logged_", "wfit_")) or (spec.shape == "pair" and not pairs):
            continue
        width = widths[spec.shape]
        shape = (steps,) if width is None else (steps, width)
        out[name] = np.full(shape, _neutral(name, len(channels)), dtype=np.float64)
    for name, value in values.items():
        assert name in SERIES, f"{name} is not in the catalogue"
        target = out.get(name)
        array = np.asarray(value, dtype=np.float64)
        out[name] = np.broadcast_to(array, target.shape).copy() if target is not None else array
    return RunSeries(steps=np.arange(steps), channels=channels, pairs=pairs, values=out)


def diagnose_series(
    series: RunSeries,
    *,
    algorithm: str = "grpo",
    weights: Mapping[str, float] | None = None,
    codes: tuple[str, ...] | None = None,
) -> Diagnosis:
    """Run the detectors (all, or ``codes``) on a hand-built series of a rollout run."""
    summary = RunSummary(
        sources=("built.parquet",),
        steps=series.num_steps,
        rollouts=int(np.nansum(series["rollouts"])),
        groups=int(np.nansum(series["groups"])),
        group_size_min=SIZE,
        group_size_max=SIZE,
        first_step=0,
        last_step=series.num_steps - 1,
        channels=series.channels,
        weights=dict(weights or dict.fromkeys(series.channels, 1.0)),
        algorithm=algorithm,
        algorithm_source="--algo",
        logged_advantage=False,
        device="cpu",
    )
    config = Config(defaults=threshold_defaults())
    selected = codes or tuple(c for c in sorted(threshold_defaults()) if not c.startswith("CD5"))
    return detect(summary, series, None, config, selected)
