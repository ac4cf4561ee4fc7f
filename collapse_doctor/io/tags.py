"""Which trainer wrote a scalar log, and what its tags mean.

Every framework names the same quantities differently. A tag map turns a framework's tags into the
canonical scalar names that the CD5xx detectors read (docs/input-formats.md lists them with the
framework versions they were checked against). The framework is recognised by which map explains the most
tags; per-channel reward tags become channels (``channel_mean/<name>``, ``channel_std/<name>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Canonical scalar names.
REWARD = "reward"
REWARD_STD = "reward_std"
ZERO_STD_SHARE = "frac_reward_zero_std"
KL = "kl"
ENTROPY = "entropy"
ADVANTAGE_MEAN = "advantage_mean"
ADVANTAGE_STD = "advantage_std"
ADVANTAGE_MAX = "advantage_max"
ADVANTAGE_MIN = "advantage_min"
CLIP_RATIO = "clip_ratio"
LOSS = "loss"
GRAD_NORM = "grad_norm"
COMPLETION_LENGTH = "completion_length"
PCT_ALL_FAIL = "pct_all_fail"
"""NeMo-RL's share (in percent) of prompts whose baseline reward is 0: every completion failed."""
PCT_ALL_PASS = "pct_all_pass"
PASS_RATE = "dynamic_filtering_pass_rate"
CHANNEL_MEAN = "channel_mean/"
CHANNEL_STD = "channel_std/"
CHANNEL_REL_GAIN = "channel_rel_gain/"
"""Per-channel rel_gain (mean within-group max - min), as ``collapse-doctor retrain`` logs it."""
CHANNEL_SIGNAL_SHARE = "channel_signal_share/"
"""Per-channel share of the within-group advantage variance under the retrain's algorithm."""
CHANNEL_WEIGHT = "channel_weight/"
CHANNEL_ZERO_VAR_SHARE = "channel_zero_var_share/"
"""Per-channel share of groups in which the channel is constant."""
CHANNEL_PREFIXES = (
    CHANNEL_MEAN,
    CHANNEL_STD,
    CHANNEL_REL_GAIN,
    CHANNEL_SIGNAL_SHARE,
    CHANNEL_WEIGHT,
    CHANNEL_ZERO_VAR_SHARE,
)
"""Canonical per-channel series: ``<prefix><channel>``."""

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
            (r"train/completions/mean_length", COMPLETION_LENGTH),
            (r"train/completion_length", COMPLETION_LENGTH),
            (r"train/loss", LOSS),
            (r"train/grad_norm", GRAD_NORM),
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
            (r"actor/pg_loss", LOSS),
            (r"actor/grad_norm", GRAD_NORM),
            (r"response_length/mean", COMPLETION_LENGTH),
        ]
    ),
    # OpenRLHF PPO/GRPO trainer logs (train/ prefix in TensorBoard).
    "openrlhf": _rules(
        [
            (r"train/reward", REWARD),
            (r"train/group_reward_std", REWARD_STD),
            (r"rollout/reward_std", REWARD_STD),
            (r"train/kl", KL),
            (r"train/policy_loss", LOSS),
            (r"train/ppo_clip_ratio", CLIP_RATIO),
            (r"train/response_length", COMPLETION_LENGTH),
            (r"train/dynamic_filtering_pass_rate", PASS_RATE),
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
        ]
    ),
}

MONITOR = "collapse_doctor"
"""Tags that collapse-doctor's own training monitor (``retrain``) logs beside the trainer's; mapped in any run.

A log with only these tags (``OUTPUT/tensorboard`` of a retrain) is recognised as framework ``collapse_doctor``.
"""
MONITOR_RULES = _rules(
    [
        (r"collapse_doctor/advantage_std", ADVANTAGE_STD),
        (r"collapse_doctor/zero_variance_share", ZERO_STD_SHARE),
        (r"collapse_doctor/rel_gain/(?P<ch>[^/]+)", CHANNEL_REL_GAIN + "{ch}"),
        (r"collapse_doctor/signal_share/(?P<ch>[^/]+)", CHANNEL_SIGNAL_SHARE + "{ch}"),
        (r"collapse_doctor/weight/(?P<ch>[^/]+)", CHANNEL_WEIGHT + "{ch}"),
        (r"collapse_doctor/zero_variance_share/(?P<ch>[^/]+)", CHANNEL_ZERO_VAR_SHARE + "{ch}"),
    ]
)

_DISTINCTIVE: Mapping[str, re.Pattern[str]] = {
    "trl": re.compile(r"train/(frac_reward_zero_std|reward_std|rewards/.+|completions/.+|clip_ratio/.+)"),
    "verl": re.compile(r"(critic|actor|gdpo|response_length)/.+"),
    "openrlhf": re.compile(r"train/(group_reward_std|policy_loss|ppo_clip_ratio|dynamic_filtering_pass_rate)"),
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
