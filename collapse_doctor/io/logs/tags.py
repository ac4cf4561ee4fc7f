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

from collapse_doctor.core.numbers import pct
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
    FILTER_ON_REWARD,
    FILTERED_GROUPS,
    GEN_BATCHES,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LOSS,
    PASS_RATE,
    PCT_ALL_FAIL,
    PCT_ALL_PASS,
    REWARD,
    REWARD_STD,
    SURPLUS_GROUPS,
    TRAINED_GROUPS,
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
            # The only per-reward training series verl logs (ray_trainer.py, adv_estimator=gdpo with
            # algorithm.gdpo_reward_keys): np.mean / np.std (ddof 0) / max / min of each key over the batch.
            (r"gdpo/(?P<ch>[^/]+)/mean", CHANNEL_MEAN + "{ch}"),
            (r"gdpo/(?P<ch>[^/]+)/std", CHANNEL_STD + "{ch}"),
            (r"gdpo/(?P<ch>[^/]+)/max", CHANNEL_MAX + "{ch}"),
            (r"gdpo/(?P<ch>[^/]+)/min", CHANNEL_MIN + "{ch}"),
            # Dynamic sampling (algorithm.filter_groups, v1 ReplayBuffer): counts of prompt groups per step,
            # logged only at steps where some were dropped.
            (r"training/filter_groups/evicted_samples", FILTERED_GROUPS),
            (r"training/filter_groups/discarded_surplus_samples", SURPLUS_GROUPS),
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
            (r"train/dynamic_sampling_num_gen_batches", GEN_BATCHES),  # grpo.use_dynamic_sampling
            # Per-component rewards are `reward/<name>` batch columns (GDPO); logged, they read as channels.
            (r"train/reward/(?P<ch>[^/]+)", CHANNEL_MEAN + "{ch}"),
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
        (_OWN + r"trained_groups", TRAINED_GROUPS),  # the verl hook: data.train_batch_size under filter_groups
        (_OWN + r"filter_on_reward", FILTER_ON_REWARD),  # the verl hook: algorithm.filter_groups.metric == reward
    ]
)

_DISTINCTIVE: Mapping[str, re.Pattern[str]] = {
    "trl": re.compile(r"train/(frac_reward_zero_std|reward_std|rewards/.+|completions/.+|clip_ratio/.+)"),
    "verl": re.compile(r"(critic|actor|gdpo|response_length|training/filter_groups)/.+"),
    "openrlhf": re.compile(
        r"train/(group_reward_std|policy_loss|ppo_clip_ratio|dynamic_filtering_pass_rate|rollout/.+)"
    ),
    "nemo_rl": re.compile(
        r"train/(baseline_reward/.+|advantages/.+|approx_entropy|kl_penalty|dynamic_sampling_num_gen_batches)"
    ),
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
    _fill_filter_counts(series)
    if ZERO_STD_SHARE not in series:
        fail, ok = series.get(PCT_ALL_FAIL), series.get(PCT_ALL_PASS)
        if fail is not None and ok is not None:
            steps, a, b = _aligned(fail, ok)
            series[ZERO_STD_SHARE] = TagPoints(steps, (a + b) / 100.0)
            tags[ZERO_STD_SHARE] = f"({mapping[PCT_ALL_FAIL]} + {mapping[PCT_ALL_PASS]}) / 100"
        elif PASS_RATE in series:
            rate = series[PASS_RATE]
            percent = _in_percent(rate.values)
            series[ZERO_STD_SHARE] = TagPoints(rate.steps, 1.0 - rate.values / (100.0 if percent else 1.0))
            tags[ZERO_STD_SHARE] = f"1 - {mapping[PASS_RATE]}" + (" / 100" if percent else "")
        elif FILTERED_GROUPS in series and TRAINED_GROUPS in series:
            steps, dropped, surplus, trained = _generated(series)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = dropped / (dropped + surplus + trained)
            series[ZERO_STD_SHARE] = TagPoints(steps, share)
            parts = [tags[n] for n in (FILTERED_GROUPS, SURPLUS_GROUPS, TRAINED_GROUPS) if n in tags]
            tags[ZERO_STD_SHARE] = f"{tags[FILTERED_GROUPS]} / ({' + '.join(parts)})"
    return ScalarSeries(
        framework=framework,
        series=dict(sorted(series.items())),
        tags=tags,
        points=points,
        sources=tuple(sources),
        notes=list(notes) + dynamic_sampling_notes(series, tags),
        raw_tags=tuple(sorted(raw)),
    )


def _in_percent(values: np.ndarray) -> bool:
    """OpenRLHF logs its pass rate in percent (``valid_groups / total_groups * 100``, filter_hooks.py); a series
    that never exceeds 1 is read as a fraction (older or patched loggers)."""
    finite = values[np.isfinite(values)]
    return bool(len(finite)) and float(finite.max()) > 1.0


def _fill_filter_counts(series: dict[str, TagPoints]) -> None:
    """verl logs ``filter_groups/*`` counts only at steps where some group was dropped: 0 at the run's other
    training steps (those with a reward point)."""
    reward = series.get(REWARD)
    if reward is None:
        return
    for name in (FILTERED_GROUPS, SURPLUS_GROUPS):
        points = series.get(name)
        if points is None:
            continue
        steps = np.union1d(reward.steps, points.steps)
        values = np.zeros(len(steps))
        values[np.searchsorted(steps, points.steps)] = points.values
        series[name] = TagPoints(steps, values)


def _generated(series: Mapping[str, TagPoints]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps with a trained-batch size, and per step the groups dropped as constant, dropped as surplus, trained."""
    trained = series[TRAINED_GROUPS]
    steps = trained.steps
    out = []
    for name in (FILTERED_GROUPS, SURPLUS_GROUPS):
        points = series.get(name)
        values = np.zeros(len(steps))
        if points is not None:
            _, at, theirs = np.intersect1d(steps, points.steps, return_indices=True)
            values[at] = points.values[theirs]
        out.append(values)
    return steps, out[0], out[1], trained.values.astype(np.float64)


def dynamic_sampling_notes(series: Mapping[str, TagPoints], tags: Mapping[str, str]) -> list[str]:
    """One line on the generation a run with dynamic sampling spent on groups it never trained (none without).

    >>> from collapse_doctor.core.scalars import TagPoints
    >>> s = {FILTERED_GROUPS: TagPoints(np.arange(1, 3), np.array([8.0, 24.0])),
    ...      TRAINED_GROUPS: TagPoints(np.arange(1, 3), np.array([32.0, 32.0]))}
    >>> dynamic_sampling_notes(s, {FILTERED_GROUPS: "training/filter_groups/evicted_samples"})[0][:96]
    'dynamic sampling (`training/filter_groups/evicted_samples`): 32 groups dropped as constant over '
    """
    lead = "the trained batch holds groups with signal only, so the cost is generation spent on groups that never train"
    notes = []
    on_reward = series.get(FILTER_ON_REWARD)
    if on_reward is not None and bool((on_reward.values == 0).any()):
        notes.append(
            "dynamic sampling filters groups on a metric other than the trained reward (verl "
            "algorithm.filter_groups.metric is not 'reward'): a group it keeps can still hold equal trained rewards "
            "and give no gradient, and a group it drops may have ranked its completions"
        )
        lead = "the cost is generation spent on groups that never train"
    if FILTERED_GROUPS in series:
        dropped = series[FILTERED_GROUPS]
        total, count = float(np.nansum(dropped.values)), len(dropped.steps)
        line = (
            f"dynamic sampling (`{tags.get(FILTERED_GROUPS, FILTERED_GROUPS)}`): {total:,.0f} groups dropped as "
            f"constant over {count} steps ({total / max(count, 1):.1f} per step)"
        )
        surplus = series.get(SURPLUS_GROUPS)
        if surplus is not None:
            line += f", {float(np.nansum(surplus.values)):,.0f} more generated beyond the batch and discarded"
        if TRAINED_GROUPS in series:
            _, filtered, extra, trained = _generated(series)
            generated = float(np.nansum(filtered + extra + trained))
            if generated > 0:
                line += f"; {pct(float(np.nansum(filtered + extra)) / generated)} of the generated groups never trained"
        return [f"{line}: {lead}", *notes]
    if GEN_BATCHES in series:
        batches = series[GEN_BATCHES].values
        finite = batches[np.isfinite(batches) & (batches >= 1)]
        if len(finite):
            never = float(np.mean(1.0 - 1.0 / finite))
            return [
                f"dynamic sampling (`{tags.get(GEN_BATCHES, GEN_BATCHES)}`): {float(finite.mean()):.2f} generation "
                f"batches per trained batch, {pct(never)} of the generated groups never trained: {lead}",
                *notes,
            ]
    if PASS_RATE in series:
        rate = series[PASS_RATE].values
        finite = rate[np.isfinite(rate)]
        if len(finite):
            passed = float(finite.mean()) / (100.0 if _in_percent(rate) else 1.0)
            return [
                f"dynamic filtering (`{tags.get(PASS_RATE, PASS_RATE)}`): {pct(1.0 - passed)} of the generated "
                f"groups were dropped by the filter: {lead}",
                *notes,
            ]
    return notes
