"""Which trainer wrote a scalar log, what its tags mean, and the log in canonical names.

Every framework names the same quantities differently. A tag map turns a framework's tags into the
canonical scalar names (:mod:`collapse_doctor.core.scalars`) that the CD5xx detectors read (docs/input-formats.md
lists them with the framework versions they were checked against). The framework is recognised by which map
explains the most tags; per-channel reward tags become channels (``channel_mean/<name>``,
``channel_std/<name>``). :func:`scalar_series` applies the map to a run's raw tags and derives the share of
zero-variance groups where a framework logs it another way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collapse_doctor.core.scalars import (
    ADVANTAGE_MAX,
    ADVANTAGE_MEAN,
    ADVANTAGE_MIN,
    ADVANTAGE_STD,
    AGGREGATION_GDPO,
    CHANNEL_CEILING_SHARE,
    CHANNEL_DOMINANCE,
    CHANNEL_FLOOR_SHARE,
    CHANNEL_GROUP_STD,
    CHANNEL_GROUPS,
    CHANNEL_MAX,
    CHANNEL_MEAN,
    CHANNEL_MIN,
    CHANNEL_REL_GAIN,
    CHANNEL_SCORED_SHARE,
    CHANNEL_SIGNAL_SHARE,
    CHANNEL_STD,
    CHANNEL_WEIGHT,
    CHANNEL_ZERO_VAR_SHARE,
    CLIP_RATIO,
    CLIP_RATIO_DUAL,
    CLIP_RATIO_HIGH,
    CLIP_RATIO_LOW,
    COMPLETION_LENGTH,
    ENTROPY,
    EVAL_SCORE,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LOSS,
    PASS_RATE,
    PCT_ALL_FAIL,
    PCT_ALL_PASS,
    REWARD,
    REWARD_STD,
    TRUNCATED_SHARE,
    ZERO_STD_SHARE,
    ScalarSeries,
    TagPoints,
)

FRAMEWORKS = ("trl", "verl", "openrlhf", "nemo_rl")


@dataclass(frozen=True)
class TagRule:
    """A raw tag pattern and the canonical name it becomes (``{ch}`` is the channel group)."""

    pattern: re.Pattern[str]
    name: str

    def match(self, tag: str) -> str | None:
        found = self.pattern.fullmatch(tag)
        if found is None:
            return None
        return self.name.format(ch=found.group("ch")) if "{ch}" in self.name else self.name


def _rules(pairs: Iterable[tuple[str, str]]) -> tuple[TagRule, ...]:
    return tuple(TagRule(re.compile(pattern), name) for pattern, name in pairs)


# Rule order is priority: when two tags map to one name, the earlier rule's tag wins.
TAG_MAPS: Mapping[str, tuple[TagRule, ...]] = {
    # TRL GRPOTrainer metrics, prefixed by transformers' TensorBoard callback (train/, eval/).
    "trl": _rules(
        [
            (r"train/rewards/(?P<ch>[^/]+)/mean", CHANNEL_MEAN + "{ch}"),
            (r"train/rewards/(?P<ch>[^/]+)/std", CHANNEL_STD + "{ch}"),
            (r"train/rewards/(?P<ch>[^/]+)", CHANNEL_MEAN + "{ch}"),  # TRL before 0.15: no /mean
            (r"train/reward", REWARD),
            (r"train/reward_std", REWARD_STD),
            (r"train/frac_reward_zero_std", ZERO_STD_SHARE),
            (r"train/kl", KL),
            (r"train/entropy", ENTROPY),
            (r"train/clip_ratio/region_mean", CLIP_RATIO),
            (r"train/clip_ratio", CLIP_RATIO),
            (r"train/clip_ratio/low_mean", CLIP_RATIO_LOW),
            (r"train/clip_ratio/high_mean", CLIP_RATIO_HIGH),
            (r"train/completions/mean_length", COMPLETION_LENGTH),
            (r"train/completion_length", COMPLETION_LENGTH),
            (r"train/completions/clipped_ratio", TRUNCATED_SHARE),  # share of completions without EOS
            (r"train/loss", LOSS),
            (r"train/grad_norm", GRAD_NORM),
            (r"train/learning_rate", LEARNING_RATE),
            (r"eval/reward", EVAL_SCORE),  # GRPOTrainer's eval_reward, on the eval cadence
        ]
    ),
    # verl's trainer metrics (compute_data_metrics, actor update), same names in TensorBoard and file logger.
    "verl": _rules(
        [
            (r"gdpo/(?P<ch>[^/]+)/mean", CHANNEL_MEAN + "{ch}"),
            (r"gdpo/(?P<ch>[^/]+)/std", CHANNEL_STD + "{ch}"),
            (r"critic/score/mean", REWARD),
            (r"critic/rewards/mean", REWARD),
            (r"critic/advantages/mean", ADVANTAGE_MEAN),
            (r"critic/advantages/max", ADVANTAGE_MAX),
            (r"critic/advantages/min", ADVANTAGE_MIN),
            (r"actor/entropy", ENTROPY),
            (r"actor/kl_loss", KL),
            (r"critic/kl", KL),
            (r"actor/pg_clipfrac", CLIP_RATIO),
            (r"actor/pg_clipfrac_lower", CLIP_RATIO_DUAL),
            (r"actor/pg_loss", LOSS),
            (r"actor/grad_norm", GRAD_NORM),
            (r"actor/lr", LEARNING_RATE),
            (r"val-core/.+/(acc|reward)/mean@\d+", EVAL_SCORE),  # the validation set's core score
            (r"val/test_score/.+", EVAL_SCORE),  # verl before val-core
            (r"response_length/mean", COMPLETION_LENGTH),
            (r"response_length/clip_ratio", TRUNCATED_SHARE),  # share of responses at max_response_length
        ]
    ),
    # OpenRLHF PPO/GRPO trainer logs (train/ prefix in TensorBoard).
    "openrlhf": _rules(
        [
            (r"train/reward", REWARD),
            (r"train/group_reward_std", REWARD_STD),
            (r"(train/)?rollout/reward_std", REWARD_STD),
            (r"train/kl", KL),
            (r"train/policy_loss", LOSS),
            (r"train/ppo_clip_ratio", CLIP_RATIO),
            (r"train/response_length", COMPLETION_LENGTH),
            (r"train/dynamic_filtering_pass_rate", PASS_RATE),
            (r"(train/)?rollout/truncated_rate", TRUNCATED_SHARE),  # finish_reason == "length"
        ]
    ),
    # NeMo-RL GRPO (train/ prefix).
    "nemo_rl": _rules(
        [
            (r"train/reward", REWARD),
            (r"train/advantages/mean", ADVANTAGE_MEAN),
            (r"train/advantages/max", ADVANTAGE_MAX),
            (r"train/advantages/min", ADVANTAGE_MIN),
            (r"train/baseline_reward/pct_0", PCT_ALL_FAIL),
            (r"train/baseline_reward/pct_1", PCT_ALL_PASS),
            (r"train/approx_entropy", ENTROPY),
            (r"train/kl_penalty", KL),
            (r"train/loss", LOSS),
            (r"train/grad_norm", GRAD_NORM),
            (r"train/mean_gen_tokens_per_sample", COMPLETION_LENGTH),
            (r"train/truncation_rate", TRUNCATED_SHARE),  # rollout metrics: samples cut at the token budget
        ]
    ),
}

MONITOR = "collapse_doctor"
"""Tags that collapse-doctor's own training monitor (``retrain``) logs beside the trainer's; mapped in any run.

A log with only these tags (``OUTPUT/tensorboard`` of a retrain) is recognised as framework ``collapse_doctor``.
"""
_OWN = r"(?:train/)?collapse_doctor/"
"""The monitor's own events say ``collapse_doctor/...``; through the trainer's ``log`` they reach TensorBoard, W&B
and Trackio as ``train/collapse_doctor/...`` (transformers' prefix) and MLflow as they are."""
MONITOR_RULES = _rules(
    [
        (_OWN + r"advantage_std", ADVANTAGE_STD),
        (_OWN + r"zero_variance_group_share", ZERO_STD_SHARE),
        (_OWN + r"zero_variance_share", ZERO_STD_SHARE),  # written before: a path prefix of the next
        (_OWN + r"rel_gain/(?P<ch>[^/]+)", CHANNEL_REL_GAIN + "{ch}"),
        (_OWN + r"signal_share/(?P<ch>[^/]+)", CHANNEL_SIGNAL_SHARE + "{ch}"),
        (_OWN + r"weight/(?P<ch>[^/]+)", CHANNEL_WEIGHT + "{ch}"),
        (_OWN + r"zero_variance_share/(?P<ch>[^/]+)", CHANNEL_ZERO_VAR_SHARE + "{ch}"),
        (_OWN + r"dominance/(?P<ch>[^/]+)", CHANNEL_DOMINANCE + "{ch}"),
        (_OWN + r"ceiling_share/(?P<ch>[^/]+)", CHANNEL_CEILING_SHARE + "{ch}"),
        (_OWN + r"floor_share/(?P<ch>[^/]+)", CHANNEL_FLOOR_SHARE + "{ch}"),
        (_OWN + r"groups/(?P<ch>[^/]+)", CHANNEL_GROUPS + "{ch}"),
        (_OWN + r"scored_share/(?P<ch>[^/]+)", CHANNEL_SCORED_SHARE + "{ch}"),
        (_OWN + r"reward_min/(?P<ch>[^/]+)", CHANNEL_MIN + "{ch}"),
        (_OWN + r"reward_max/(?P<ch>[^/]+)", CHANNEL_MAX + "{ch}"),
        (_OWN + r"group_std/(?P<ch>[^/]+)", CHANNEL_GROUP_STD + "{ch}"),
        (_OWN + r"aggregation_gdpo", AGGREGATION_GDPO),
    ]
)

_DISTINCTIVE: Mapping[str, re.Pattern[str]] = {
    "trl": re.compile(r"train/(frac_reward_zero_std|reward_std|rewards/.+|completions/.+|clip_ratio/.+)"),
    "verl": re.compile(r"(critic|actor|gdpo|response_length)/.+"),
    "openrlhf": re.compile(
        r"train/(group_reward_std|policy_loss|ppo_clip_ratio|dynamic_filtering_pass_rate|rollout/.+)"
    ),
    "nemo_rl": re.compile(r"train/(baseline_reward/.+|advantages/.+|approx_entropy|kl_penalty)"),
}


def map_tags(tags: Iterable[str], framework: str) -> dict[str, str]:
    """``{canonical name: raw tag}`` for one framework's map (the first matching rule wins per name).

    >>> map_tags(["train/kl", "train/rewards/format/mean", "train/epoch"], "trl")
    {'channel_mean/format': 'train/rewards/format/mean', 'kl': 'train/kl'}
    """
    tags = list(tags)
    out: dict[str, tuple[int, str]] = {}
    rules = MONITOR_RULES if framework == MONITOR else TAG_MAPS[framework]
    for tag in tags:
        for rank, rule in enumerate(rules):
            name = rule.match(tag)
            if name is None:
                continue
            if name not in out or rank < out[name][0]:
                out[name] = (rank, tag)
            break
    return {name: tag for name, (_, tag) in sorted(out.items())}


def detect_framework(tags: Iterable[str]) -> str | None:
    """The framework whose map explains the tags best (distinctive tags first), or ``None``.

    collapse-doctor's own monitor tags count only when no trainer's map explains any tag.

    >>> detect_framework(["critic/score/mean", "actor/entropy"])
    'verl'
    >>> detect_framework(["collapse_doctor/rel_gain/format", "collapse_doctor/advantage_std"])
    'collapse_doctor'
    >>> detect_framework(["train/reward", "train/baseline_reward/pct_0"])
    'nemo_rl'
    >>> detect_framework(["accuracy"]) is None
    True
    """
    tags = list(tags)
    best: tuple[int, int, int] | None = None
    choice = None
    for position, framework in enumerate(FRAMEWORKS):
        distinctive = sum(1 for t in tags if _DISTINCTIVE[framework].fullmatch(t))
        mapped = len(map_tags(tags, framework))
        if not mapped:
            continue
        score = (distinctive, mapped, -position)
        if best is None or score > best:
            best, choice = score, framework
    if choice is None and map_tags(tags, MONITOR):
        return MONITOR
    return choice


def _aligned(a: TagPoints, b: TagPoints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    return steps, a.values[ia], b.values[ib]


def scalar_series(
    raw: Mapping[str, TagPoints],
    *,
    points: int,
    sources: Sequence[Path] = (),
    notes: Sequence[str] = (),
    framework: str | None = None,
) -> ScalarSeries:
    """Map raw tags to canonical series (framework auto-detected unless given) and add derived ones.

    The share of zero-variance groups is derived from NeMo-RL's ``pct_0 + pct_1`` (percentages) or from
    OpenRLHF's dynamic-filtering pass rate when the run does not log it directly.
    """
    framework = framework or detect_framework(raw)
    mapping = map_tags(raw, framework) if framework else {}
    for name, tag in map_tags(raw, MONITOR).items():
        mapping.setdefault(name, tag)  # collapse-doctor's own monitor, when the trainer does not log it
    series = {name: raw[tag] for name, tag in mapping.items()}
    tags = dict(mapping)
    if ZERO_STD_SHARE not in series:
        fail, ok = series.get(PCT_ALL_FAIL), series.get(PCT_ALL_PASS)
        if fail is not None and ok is not None:
            steps, a, b = _aligned(fail, ok)
            series[ZERO_STD_SHARE] = TagPoints(steps, (a + b) / 100.0)
            tags[ZERO_STD_SHARE] = f"({mapping[PCT_ALL_FAIL]} + {mapping[PCT_ALL_PASS]}) / 100"
        elif PASS_RATE in series:
            rate = series[PASS_RATE]
            series[ZERO_STD_SHARE] = TagPoints(rate.steps, 1.0 - rate.values)
            tags[ZERO_STD_SHARE] = f"1 - {mapping[PASS_RATE]}"
    return ScalarSeries(
        framework=framework,
        series=dict(sorted(series.items())),
        tags=tags,
        points=points,
        sources=tuple(sources),
        notes=list(notes),
        raw_tags=tuple(sorted(raw)),
    )
