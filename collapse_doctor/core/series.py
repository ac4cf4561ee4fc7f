"""Per-step series of a run: the small, sorted summary that detectors and reports read.

:data:`SERIES` is the catalogue of every per-step series the statistics (:mod:`collapse_doctor.engine.stats`)
produce: its name, its shape (``run`` ``[S]``, ``channel`` ``[S, C]``, ``pair`` ``[S, P]``) and what it
holds. Its order is the order of the statistics, and so of a scan's JSON output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, Literal, TypeVar

import numpy as np

from collapse_doctor.core.estimators import COUNTERFACTUAL_KEYS, ESTIMATOR_OF, ESTIMATORS

PAIR_SEPARATOR = "|"
RECOMPUTATIONS: dict[str, str] = {
    "grpo": "GRPO (group std)",
    "grpo_batch": "GRPO (batch std)",
    "grpo_none": "GRPO (no std)",
    "gdpo": "GDPO",
}
"""The recomputations a logged advantage is compared with (series ``logged_mae_<name>``) and their labels, in the
order that wins when two match equally well."""

Shape = Literal["run", "channel", "pair"]
"""``run``: one value per step ``[S]``; ``channel``: per step and channel ``[S, C]``; ``pair``: per step
and channel pair ``[S, P]`` (pairs in :func:`channel_pairs` order)."""


CUT_BY_FLAG, CUT_AT_STEP_MAX, CUT_AT_CAP = 1.0, 0.0, 2.0
"""``cut_rule`` values: the rows' ``truncated`` flag said which completions were cut at the length cap; the rows'
``completion_length`` (tokens) reached the cap the user gave (``--max-completion-length``); or, with neither, the rows
of the step's largest completion length stand for the cut ones (a guess the judge keeps only where it matches the
truncated share the trainer logged)."""


@dataclass(frozen=True)
class SeriesSpec:
    """One per-step series: its name, shape and meaning."""

    name: str
    shape: Shape
    doc: str


COUNTERFACTUAL_PREFIX = "cf_"
"""The counterfactual counts' prefix: kept in memory for any stretch, not written to the JSON's series."""


def _cf_label(key: str) -> str:
    return ESTIMATOR_OF[key].label


_ROWS = "over the valid rows of groups whose totals differ"
_GRPO, _GDPO = "GRPO (sum, then normalise)", "GDPO (normalise, then sum)"

_CATALOGUE = (
    # sizes
    SeriesSpec("rollouts", "run", "Rows in the step."),
    SeriesSpec("valid_rows", "run", "Rows with at least one reward that is not NaN (valid rows)."),
    SeriesSpec("groups", "run", "Groups with at least one valid row (not all rewards NaN)."),
    SeriesSpec("eligible_groups", "run", "Groups with 2+ valid rows (the support of the shares over groups)."),
    SeriesSpec("group_size_min", "run", "Fewest valid rows in a group."),
    SeriesSpec("group_size_max", "run", "Most valid rows in a group."),
    # channels
    SeriesSpec("rel_gain", "channel", "Mean over groups (2+ values of the channel) of its within-group max - min."),
    SeriesSpec("reward_std", "channel", "Mean over groups (2+ values) of the channel's within-group std (ddof=1)."),
    SeriesSpec("channel_zero_var_share", "channel", "Share of groups (2+ values) where the channel is constant."),
    SeriesSpec("reward_mean", "channel", "Mean of the channel's rewards (NaN skipped)."),
    SeriesSpec("reward_max", "channel", "Largest reward of the channel over the step's non-NaN rows (NaN if none)."),
    SeriesSpec("reward_min", "channel", "Smallest reward of the channel over the step's non-NaN rows (NaN if none)."),
    SeriesSpec("channel_rows", "channel", "Rows where the channel is not NaN (the support of reward_mean)."),
    SeriesSpec(
        "channel_groups", "channel", "Groups with 2+ values of the channel (support of rel_gain, std, zero-var)."
    ),
    SeriesSpec(
        "channel_at_max_groups", "channel", "Of channel_groups: the channel constant there, at the step's reward_max."
    ),
    SeriesSpec(
        "channel_at_min_groups", "channel", "Of channel_groups: the channel constant there, at the step's reward_min."
    ),
    # signal
    SeriesSpec("zero_var_share", "run", "Share of groups (2+ valid rows) whose weighted totals are all equal."),
    SeriesSpec("gdpo_zero_var_share", "run", "Share of groups (2+ valid rows) where no channel varies (GDPO: 0)."),
    SeriesSpec("signal_share_grpo", "channel", "The channel's share of the within-group variance of the total."),
    SeriesSpec("signal_share_gdpo", "channel", "The channel's share of the variance of GDPO's fused z-score sum."),
    # silence (from the advantages)
    *(
        spec
        for name, label in (("grpo", _GRPO), ("gdpo", _GDPO))
        for spec in (
            SeriesSpec(f"silent_groups_{name}", "run", f"Groups (2+ valid rows) whose {label} advantages span < 1e-4."),
            SeriesSpec(
                f"zero_adv_rows_{name}",
                "run",
                f"Valid rows without a {label} advantage: those of silent groups and of groups of one valid row,"
                " and elsewhere those with |advantage| < 1e-4.",
            ),
            SeriesSpec(
                f"all_pass_groups_{name}", "run", f"Silent ({label}) groups with every channel at its step reward_max."
            ),
            SeriesSpec(
                f"all_fail_groups_{name}", "run", f"Silent ({label}) groups with every channel at its step reward_min."
            ),
            SeriesSpec(
                f"silent_identical_groups_{name}",
                "run",
                f"Silent ({label}) groups whose valid rows all have the same completion (NaN without text).",
            ),
            SeriesSpec(
                f"identical_pass_groups_{name}",
                "run",
                f"Of silent_identical_groups_{name}: also all-pass (every channel at its step reward_max).",
            ),
            SeriesSpec(
                f"identical_fail_groups_{name}",
                "run",
                f"Of silent_identical_groups_{name}: also all-fail (every channel at its step reward_min).",
            ),
            SeriesSpec(
                f"silent_cancel_groups_{name}",
                "run",
                f"Silent ({label}) groups where some channel varies (reward vectors differ: the channels cancel).",
            ),
        )
    ),
    # completions
    SeriesSpec(
        "length_reward_sxy",
        "channel",
        "Within-group sum of (length - group mean) x (reward - group mean), rows with both known (groups of 2+).",
    ),
    SeriesSpec(
        "length_sxx", "channel", "Within-group sum of squared length deviations (rows where the channel is known)."
    ),
    SeriesSpec("length_reward_syy", "channel", "Within-group sum of squared reward deviations (rows with a length)."),
    SeriesSpec(
        "length_groups", "channel", "Groups whose completion lengths vary (the support of the length correlation)."
    ),
    SeriesSpec(
        "completion_groups", "run", "Groups (2+ valid rows) with completion text (the support; NaN without text)."
    ),
    SeriesSpec("identical_completion_groups", "run", "Of completion_groups: all valid rows have the same completion."),
    SeriesSpec(
        "distinct_completion_share", "run", "Distinct completions among the valid rows / valid rows (1: all differ)."
    ),
    SeriesSpec(
        "equal_reward_groups",
        "run",
        "Groups (2+ valid rows) whose reward vectors are all equal (each channel constant, same NaN pattern).",
    ),
    SeriesSpec(
        "equal_reward_distinct_groups", "run", "Of equal_reward_groups: 2+ distinct completions (NaN without text)."
    ),
    SeriesSpec("completion_length_mean", "run", "Mean completion length (tokens, else characters) over valid rows."),
    SeriesSpec("completion_length_max", "run", "Largest completion length (tokens, else characters) of a valid row."),
    SeriesSpec("cut_rows", "run", "Valid rows cut at the length cap (see cut_rule; NaN where unknown)."),
    SeriesSpec("cut_known_rows", "run", "Valid rows whose cut is known (the support of the cut share)."),
    SeriesSpec(
        "cut_rule",
        "run",
        "How the cut rows were told: 1 from the rows' truncated flag, 0 the rows of the step's largest length (a "
        "guess, kept only where it matches the logged truncated share); NaN: unknown.",
    ),
    SeriesSpec(
        "cut_reward_diff_sum",
        "channel",
        "Sum over groups with cut and finished rows of (mean reward of the cut rows - mean of the finished ones).",
    ),
    SeriesSpec("cut_reward_diff_sq", "channel", "Sum of the squares of those within-group differences."),
    SeriesSpec("cut_mixed_groups", "channel", "Groups holding both cut and finished rows (the difference's support)."),
    # dominance
    SeriesSpec("dominance_grpo", "channel", f"Share of rows with signal whose {_GRPO} advantage sign it decides."),
    SeriesSpec("dominance_gdpo", "channel", f"Share of rows with signal whose {_GDPO} advantage sign it decides."),
    # shape (and ties: distinct_ratio_*)
    SeriesSpec("adv_std_grpo", "run", f"Std (ddof=1) of the {_GRPO} advantages {_ROWS}."),
    SeriesSpec("adv_skew_grpo", "run", f"Skewness of the {_GRPO} advantages {_ROWS}."),
    SeriesSpec("adv_kurtosis_grpo", "run", f"Excess kurtosis of the {_GRPO} advantages {_ROWS}."),
    SeriesSpec("adv_bimodality_grpo", "run", f"Sarle's bimodality coefficient of the {_GRPO} advantages {_ROWS}."),
    SeriesSpec("adv_abs_max_grpo", "run", f"Largest |advantage| under {_GRPO} {_ROWS}."),
    SeriesSpec("distinct_ratio_grpo", "run", f"Mean over groups with signal of distinct {_GRPO} advantages per row."),
    SeriesSpec("adv_std_gdpo", "run", f"Std (ddof=1) of the {_GDPO} advantages {_ROWS}."),
    SeriesSpec("adv_skew_gdpo", "run", f"Skewness of the {_GDPO} advantages {_ROWS}."),
    SeriesSpec("adv_kurtosis_gdpo", "run", f"Excess kurtosis of the {_GDPO} advantages {_ROWS}."),
    SeriesSpec("adv_bimodality_gdpo", "run", f"Sarle's bimodality coefficient of the {_GDPO} advantages {_ROWS}."),
    SeriesSpec("adv_abs_max_gdpo", "run", f"Largest |advantage| under {_GDPO} {_ROWS}."),
    SeriesSpec("distinct_ratio_gdpo", "run", f"Mean over groups with signal of distinct {_GDPO} advantages per row."),
    # outliers
    SeriesSpec(
        "outlier_group_share",
        "run",
        "Share of groups (4+ rows, totals differ) with one extreme total (> 8 stds of the rest, > 3 pooled stds)"
        " on a channel that varies among the rest too (heavy tails).",
    ),
    SeriesSpec(
        "outlier_lone_share",
        "run",
        "Share of groups (4+ rows, totals differ) with one extreme total whose deciding channel is constant on"
        " the rest (a lone success or failure).",
    ),
    SeriesSpec(
        "outlier_rest_std_grpo", "run", f"Mean std of the other rows' {_GRPO} advantages in the heavy-tail groups."
    ),
    SeriesSpec(
        "outlier_rest_std_gdpo", "run", f"Mean std of the other rows' {_GDPO} advantages in the heavy-tail groups."
    ),
    # ties
    SeriesSpec("differing_pairs", "run", "Pairs of valid rows of a group with different reward vectors."),
    SeriesSpec("tied_pair_share", "run", "Share of the differing pairs whose weighted totals are equal."),
    SeriesSpec("tied_pair_share_gdpo", "run", f"Share of the differing pairs whose {_GDPO} advantages are equal."),
    # correlation
    SeriesSpec("corr_sxy", "pair", "Sum over rows with both rewards of dev_i * dev_j (group-demeaned)."),
    SeriesSpec("corr_sxx", "pair", "Sum over rows with both rewards of dev_i^2."),
    SeriesSpec("corr_syy", "pair", "Sum over rows with both rewards of dev_j^2."),
    SeriesSpec("within_corr", "pair", "Within-group correlation of the pair: sxy / sqrt(sxx * syy)."),
    SeriesSpec("corr_rows", "pair", "Rows with both rewards, in groups with 2+ such rows (within_corr's support)."),
    SeriesSpec("corr_groups", "pair", "Groups with 2+ rows that have both rewards."),
    # logged
    SeriesSpec("logged_rows", "run", "Valid rows with a logged advantage."),
    SeriesSpec("logged_abs_max", "run", "Largest |logged advantage|."),
    SeriesSpec("logged_beyond_bound_share", "run", "Share of logged advantages beyond (n-1)/sqrt(n) + 1e-3."),
    SeriesSpec("logged_bound", "run", "Largest group z-score bound (n-1)/sqrt(n) over the logged rows."),
    SeriesSpec("logged_mae_grpo", "run", f"Mean |logged - recomputed {_GRPO} advantage|."),
    SeriesSpec("logged_mae_gdpo", "run", f"Mean |logged - recomputed {_GDPO} advantage|."),
    SeriesSpec("logged_mae_grpo_batch", "run", "Mean |logged - GRPO advantage scaled by the step's std|."),
    SeriesSpec("logged_mae_grpo_none", "run", "Mean |logged - GRPO advantage without scaling (total - group mean)|."),
    *(
        SeriesSpec(f"logged_mae_{spec.key}", "run", f"Mean |logged - {spec.label} advantage| ({spec.source}).")
        for spec in ESTIMATORS
        if spec.key not in RECOMPUTATIONS
    ),
    *(
        SeriesSpec(
            f"logged_shape_mae_{spec.key}",
            "run",
            f"Without {', '.join(spec.needs)}: mean |logged - best fit of the {spec.label} advantage up to what the "
            "missing column decides| (NaN where it is recomputed exactly).",
        )
        for spec in ESTIMATORS
        if spec.needs
    ),
    # weight fit (logged advantage)
    SeriesSpec("wfit_grpo_diag", "channel", "Diagonal of sum over groups of D^T (I - P_A) D (D: centred rewards)."),
    SeriesSpec("wfit_grpo_off", "pair", "Off-diagonal entries of that GRPO weight-fit matrix."),
    SeriesSpec("wfit_grpo_norm", "run", "Trace of D^T D over the same groups and rows (the GRPO fit's scale)."),
    SeriesSpec("wfit_gdpo_diag", "channel", "Diagonal of Z^T Z - Z^T A A^T Z / |A|^2 over the step (Z: z-scores)."),
    SeriesSpec("wfit_gdpo_off", "pair", "Off-diagonal entries of that GDPO weight-fit matrix."),
    SeriesSpec("wfit_gdpo_norm", "run", "Trace of Z^T Z over the same rows (the GDPO fit's scale)."),
    # counterfactuals across estimators (on the sampled groups of each step)
    SeriesSpec("cf_groups", "run", "Groups sampled for the counterfactuals (all of a step with up to 64, else 64)."),
    SeriesSpec("cf_rows", "run", "Valid rows of the sampled groups."),
    SeriesSpec("cf_differing_pairs", "run", "Pairs of sampled rows of one group whose reward vectors differ."),
    SeriesSpec("cf_uniform", "run", "1 where the rows carry no completion lengths (REINFORCE++ weights rows once)."),
    *(
        spec
        for key in COUNTERFACTUAL_KEYS
        for spec in (
            SeriesSpec(
                f"cf_zero_rows_{key}", "run", f"Sampled rows whose {_cf_label(key)} advantage is within 1e-4 of 0."
            ),
            SeriesSpec(
                f"cf_signal_rows_{key}", "run", f"Sampled rows whose {_cf_label(key)} advantage is beyond 1e-6."
            ),
            SeriesSpec(
                f"cf_tied_pairs_{key}", "run", f"Of cf_differing_pairs: equal {_cf_label(key)} advantages (tied)."
            ),
            SeriesSpec(
                f"cf_decided_{key}",
                "channel",
                f"Sampled rows whose {_cf_label(key)} advantage sign the channel decides.",
            ),
        )
    ),
)

SERIES: dict[str, SeriesSpec] = {spec.name: spec for spec in _CATALOGUE}
"""Every per-step series, in output order (details in the :mod:`collapse_doctor.engine.stats` family modules)."""

V = TypeVar("V")


def series_spec(name: str) -> SeriesSpec:
    """The catalogue entry of ``name``; an unknown name is a programming error.

    >>> series_spec("within_corr").shape
    'pair'
    """
    try:
        return SERIES[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a per-step series: add it to collapse_doctor.core.series.SERIES") from None


def in_catalogue_order(values: Mapping[str, V]) -> dict[str, V]:
    """``values`` reordered as :data:`SERIES`; raises on a name the catalogue does not hold.

    >>> list(in_catalogue_order({"groups": 2, "rollouts": 16}))
    ['rollouts', 'groups']
    """
    for name in values:
        series_spec(name)
    return {name: values[name] for name in SERIES if name in values}


MAX_PAIRED_CHANNELS = 64
"""The most channels whose pairwise statistics are computed (2,016 pairs): the within-group correlations (CD401)
and the weight fit cost the square of the channel count in time, memory and JSON. A run with more channels has
none (CD401 and weight inference say so); every per-channel statistic is still computed."""

PAIRS_CAPPED = (
    f"pairwise statistics are computed for at most {MAX_PAIRED_CHANNELS} channels (their cost grows with the square "
    "of the channel count)"
)
"""Why a run with more channels has no pairwise statistics (a skip reason and a run warning)."""


def pair_indices(num_channels: int) -> list[tuple[int, int]]:
    """The channel index pairs of the ``[S, P]`` statistics (``itertools.combinations``; none beyond
    :data:`MAX_PAIRED_CHANNELS` channels).

    >>> pair_indices(3), pair_indices(MAX_PAIRED_CHANNELS + 1)
    ([(0, 1), (0, 2), (1, 2)], [])
    """
    return [] if num_channels > MAX_PAIRED_CHANNELS else list(combinations(range(num_channels), 2))


def channel_pairs(channels: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """Channel pairs in the order the ``[S, P]`` statistics use (:func:`pair_indices`).

    >>> channel_pairs(["a", "b", "c"])
    [('a', 'b'), ('a', 'c'), ('b', 'c')]
    """
    return [(channels[i], channels[j]) for i, j in pair_indices(len(channels))]


CALLBACK_SCALARS = "callback scalars"
""":attr:`RunSeries.derived_from` of the per-channel series rebuilt from the TRL callback's ``collapse_doctor/*``
scalars."""


@dataclass
class RunSeries:
    """Statistics per training step, sorted by step.

    ``values[name]`` is ``[S]`` (run-level), ``[S, C]`` (per channel, in ``channels`` order) or
    ``[S, P]`` (per channel pair, in ``pairs`` order), as its :data:`SERIES` entry says.
    """

    steps: np.ndarray
    channels: tuple[str, ...]
    pairs: list[tuple[str, str]]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    derived_from: str = "rollouts"
    """What the values were computed from: ``"rollouts"`` (the engine's reduction), or :data:`CALLBACK_SCALARS`
    (the per-channel series the TRL callback logged, rebuilt for a run read from its scalar log only)."""

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def between(self, first: int, last: int) -> RunSeries:
        """The steps ``first..last`` (inclusive) of every series."""
        keep = (self.steps >= first) & (self.steps <= last)
        values = {name: array[keep] for name, array in self.values.items()}
        return replace(self, steps=self.steps[keep], values=values)

    @property
    def from_callback_scalars(self) -> bool:
        """Whether these series were rebuilt from the TRL callback's logged scalars (no rollouts were read)."""
        return self.derived_from == CALLBACK_SCALARS

    def to_json(self) -> dict[str, Any]:
        """``{"step": [...], name: [...] | {channel: [...]} | {"a|b": [...]}}`` with NaN as null; the counterfactual
        counts (``cf_*``) are left out: ``run.counterfactuals`` sums them."""
        out: dict[str, Any] = {"step": [int(s) for s in self.steps]}
        for name, array in self.values.items():
            if name.startswith(COUNTERFACTUAL_PREFIX):
                continue
            shape = series_spec(name).shape
            if array.ndim != (1 if shape == "run" else 2):
                raise ValueError(f"series {name!r} is {shape}-shaped but has {array.ndim} dimensions")
            if shape == "run":
                out[name] = _floats(array)
            elif shape == "pair":
                out[name] = {f"{a}{PAIR_SEPARATOR}{b}": _floats(array[:, k]) for k, (a, b) in enumerate(self.pairs)}
            else:
                out[name] = {c: _floats(array[:, k]) for k, c in enumerate(self.channels)}
        return out


def _floats(array: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(f"{v:.6g}") for v in array.tolist()]


class SeriesBuilder:
    """Collects per-chunk statistics in arrival order and sorts them by step at the end."""

    def __init__(self, channels: tuple[str, ...], pairs: list[tuple[str, str]]) -> None:
        self.channels = channels
        self.pairs = pairs
        self._steps: list[np.ndarray] = []
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, steps: np.ndarray, stats: dict[str, np.ndarray]) -> None:
        self._steps.append(np.asarray(steps, dtype=np.int64))
        for name, value in stats.items():
            self._parts.setdefault(name, []).append(np.asarray(value, dtype=np.float64))

    def build(self) -> RunSeries:
        steps = np.concatenate(self._steps) if self._steps else np.zeros(0, dtype=np.int64)
        order = np.argsort(steps, kind="stable")
        values = {name: np.concatenate(parts)[order] for name, parts in self._parts.items()}
        return RunSeries(steps=steps[order], channels=self.channels, pairs=self.pairs, values=values)
