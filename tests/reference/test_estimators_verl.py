"""The estimators of collapse_doctor.engine.estimators against the trainers' own code.

verl 0.9.1's ``verl.trainer.ppo.core_algos`` runs on CPU (scripts/bootstrap.sh installs it without its GPU
dependencies): each estimator is called as verl's trainer calls it, on token-level rewards (the score on the last
response token, a response mask of each row's length), and the advantage of every row (the same on each of its
tokens) must equal ours. Estimators no installable trainer provides (NeMo-RL's leave-one-out GRPO, TRL's
asynchronous GRPO) are checked against their formulas written out loop by loop.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapse_doctor.core.estimators import ESTIMATOR_OF, ESTIMATORS
from collapse_doctor.engine.estimators import RECOMPUTE, EstimatorRows, recompute

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is installed by scripts/bootstrap.sh")
from omegaconf import OmegaConf  # noqa: E402  (a verl dependency)

VERL_FUNCTION = {
    "grpo": "compute_grpo_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
    "rloo_vectorized": "compute_rloo_vectorized_outcome_advantage",
    "opo": "compute_opo_outcome_advantage",
    "gpg": "compute_gpg_outcome_advantage",
    "grpo_passk": "compute_grpo_passk_outcome_advantage",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "reinforce_plus_plus_baseline": "compute_reinforce_plus_plus_baseline_outcome_advantage",
}


def batch(seed: int, *, channels: int = 1, sizes: tuple[int, ...] = (8, 8, 5, 1, 8, 3), binary: bool = False):
    """One training step: groups of the given sizes, rewards (some groups all equal), lengths 1..12 tokens."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(sizes)), sizes)
    n = len(group)
    if binary:
        rewards = rng.integers(0, 2, size=(n, channels)).astype(np.float32)
    else:
        rewards = rng.choice([0.0, 0.25, 0.5, 1.0, 1.5], size=(n, channels)).astype(np.float32)
    rewards[group == 1] = 1.0  # a group whose rewards are all equal
    lengths = rng.integers(1, 13, size=n)
    return rewards, group, lengths


def token_level(scores: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: the score on each row's last response token, and the response mask."""
    width = int(lengths.max()) + 2
    mask = (torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(scores), width)
    rewards[torch.arange(len(scores)), torch.as_tensor(lengths) - 1] = torch.as_tensor(scores, dtype=torch.float32)
    return rewards, mask


def per_row(advantages: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """The row's advantage: equal on each of its tokens (checked), read on its first."""
    adv = advantages.double().numpy()
    m = mask.bool().numpy()
    first = adv[:, 0]
    spread = np.where(m, np.abs(adv - first[:, None]), 0.0).max(axis=1)
    assert spread.max() < 1e-5, "an outcome reward's advantage is the same on every token of a response"
    return first


def verl_advantages(key: str, scores: np.ndarray, group: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    rewards, mask = token_level(scores, lengths)
    config = OmegaConf.create({"gamma": 1.0, "norm_adv_by_std_in_grpo": True})
    advantages, _ = getattr(core_algos, VERL_FUNCTION[key])(
        token_level_rewards=rewards, response_mask=mask, index=np.array([f"p{g}" for g in group]), config=config
    )
    return per_row(advantages, mask)


@pytest.mark.parametrize("key", sorted(VERL_FUNCTION))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_estimator_equals_verls_own_function(key: str, seed: int) -> None:
    rewards, group, lengths = batch(seed, sizes=(8, 8, 5, 8, 3, 8) if key == "grpo_passk" else (8, 8, 5, 1, 8, 3))
    expected = verl_advantages(key, rewards[:, 0].astype(np.float64), group, lengths)
    rows = EstimatorRows(rewards, np.ones(1), group, np.zeros(len(group)), lengths)
    if key == "grpo":
        # verl's GRPO (eps 1e-6, a group of one keeps its score) is recognised as the engine's GRPO; written out here
        dev = rows.centred
        std = np.nan_to_num(rows.group_std(dev, ddof=1), nan=0.0)
        ours = np.where(rows.single, rows.total / (1 + 1e-6), dev / (std + 1e-6))
    else:
        ours = RECOMPUTE[key](rows)
    assert ours is not None
    np.testing.assert_allclose(ours, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_equals_verls_token_weighted_gdpo(seed: int) -> None:
    rewards, group, lengths = batch(seed, channels=3)
    weights = np.array([1.0, 0.5, 2.0])
    rm, mask = token_level(np.zeros(len(group)), lengths)
    prompt = torch.zeros(len(group), 4, dtype=torch.long)
    attention = torch.cat([torch.ones(len(group), 4), mask], dim=1).long()  # prompt tokens, then the response
    keys = [f"r{c}" for c in range(3)]
    config = OmegaConf.create({"gdpo_reward_keys": keys, "gdpo_reward_weights": weights.tolist()})
    advantages, _ = core_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=rm,
        response_mask=mask,
        index=np.array([f"p{g}" for g in group]),
        config=config,
        non_tensor_batch={k: rewards[:, c] for c, k in enumerate(keys)},
        batch={"prompts": prompt, "attention_mask": attention},
    )
    ours = RECOMPUTE["gdpo_verl"](EstimatorRows(rewards, weights, group, np.zeros(len(group)), lengths))
    assert ours is not None
    np.testing.assert_allclose(ours, per_row(advantages, mask), atol=2e-5, rtol=1e-5)


def test_token_weighted_estimators_need_lengths() -> None:
    rewards, group, _ = batch(0)
    missing = recompute(EstimatorRows(rewards, np.ones(1), group, np.zeros(len(group))))
    needing = {key for key, adv in missing.items() if adv is None}
    assert needing == {spec.key for spec in ESTIMATORS if spec.needs and spec.key in RECOMPUTE}
    assert needing == {"opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo_verl"}


def test_steps_are_separate_batches() -> None:
    """Batch-level statistics (GPG's alpha, whitening) are per step: two steps computed at once equal each apart."""
    a, ga, la = batch(0)
    b, gb, lb = batch(1, binary=True)
    together = EstimatorRows(
        np.vstack([a, b]), np.ones(1), np.r_[ga, gb + 100], np.r_[np.zeros(len(ga)), np.ones(len(gb))], np.r_[la, lb]
    )
    apart = [EstimatorRows(x, np.ones(1), g, np.zeros(len(g)), n) for x, g, n in ((a, ga, la), (b, gb, lb))]
    for key, fn in RECOMPUTE.items():
        joint = fn(together)
        assert joint is not None, key
        np.testing.assert_allclose(joint, np.concatenate([fn(x) for x in apart]), atol=1e-9, err_msg=key)  # type: ignore[arg-type]


def loo_reference(t: list[float]) -> list[float]:
    """NeMo-RL's leave-one-out GRPO for one group, loop by loop (calculate_baseline_and_std_per_prompt with
    leave_one_out_baseline=True: the others' mean and the others' E[r^2] - E[r]^2; then the advantage divided by
    std + 1e-6 where std > 0)."""
    n = len(t)
    if n <= 1:
        return [0.0] * n
    out = []
    for i in range(n):
        others = [t[j] for j in range(n) if j != i]
        mean = sum(others) / len(others)
        std = max(sum(v * v for v in others) / len(others) - mean * mean, 0.0) ** 0.5
        out.append((t[i] - mean) / (std + 1e-6) if std > 1e-9 else t[i] - mean)
    return out


def population_reference(t: list[float]) -> list[float]:
    """TRL's asynchronous GRPO for one group: (t - mean) / (population std + 1e-8); a group of one: 0."""
    n = len(t)
    if n <= 1:
        return [0.0] * n
    mean = sum(t) / n
    std = (sum((v - mean) ** 2 for v in t) / n) ** 0.5
    return [(v - mean) / (std + 1e-8) for v in t]


@pytest.mark.parametrize(("key", "reference"), [("grpo_loo", loo_reference), ("grpo_population", population_reference)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_formula_estimators_equal_their_loops(key: str, reference, seed: int) -> None:  # type: ignore[no-untyped-def]
    rewards, group, _ = batch(seed)
    ours = RECOMPUTE[key](EstimatorRows(rewards, np.ones(1), group, np.zeros(len(group))))
    expected = np.concatenate([reference(rewards[group == g, 0].astype(np.float64).tolist()) for g in np.unique(group)])
    np.testing.assert_allclose(ours, expected, atol=1e-9)


def test_nemo_gdpo_equals_its_loop() -> None:
    """NeMo-RL's GDPOAdvantageEstimator, loop by loop: each reward's leave-one-out advantage (divided by the others'
    std + 1e-6 where it is > 0), summed with the weights, then (A - mean) / std over the batch (torch std, ddof 1)."""
    rewards, group, _ = batch(3, channels=2)
    weights = np.array([1.0, 2.0])
    parts = np.zeros(len(group))
    for c in range(2):
        column = np.concatenate(
            [loo_reference(rewards[group == g, c].astype(np.float64).tolist()) for g in np.unique(group)]
        )
        parts += weights[c] * column
    std = parts.std(ddof=1)
    expected = (parts - parts.mean()) / std
    ours = RECOMPUTE["gdpo_nemo"](EstimatorRows(rewards, weights, group, np.zeros(len(group))))
    np.testing.assert_allclose(ours, expected, atol=1e-9)


def test_the_catalogue_covers_every_function() -> None:
    assert set(RECOMPUTE) <= set(ESTIMATOR_OF)
    assert {spec.key for spec in ESTIMATORS} - set(RECOMPUTE) == {"grpo", "grpo_batch", "grpo_none", "gdpo"}


def trl_rloo_reference(rewards: np.ndarray, weights: np.ndarray, n: int, *, normalize: bool) -> np.ndarray:
    """TRL 1.16 ``RLOOTrainer._generate_and_score_completions`` with beta 0, its lines as they are (torch, TRL's
    own ``nanstd``): the weighted nansum, unscorable rows NaN, the leave-one-out baseline over the scorable siblings,
    ``normalize_advantages``' batch z-score over the scorable rows, NaN advantages 0."""
    from trl.trainer.utils import nanstd

    rewards_per_func = torch.as_tensor(rewards, dtype=torch.float32)
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    total = (rewards_per_func * torch.as_tensor(weights, dtype=torch.float32).unsqueeze(0)).nansum(dim=1)
    total[unscorable_mask] = torch.nan
    grouped_rewards = total.view(-1, n)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    baselines = ((grouped_sum - grouped_rewards) / (scorable_counts - 1)).view(-1)
    advantages = total - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0).double().numpy()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_equals_trls_rloo_trainer(normalize: bool, seed: int) -> None:
    """TRL's RLOO (beta 0) is ``rloo_vectorized``'s formula, and ``normalize_advantages=True`` is
    ``rloo_normalized``; with rows every reward function skipped (unscorable: left out, as the engine leaves out
    rows whose rewards are all NaN) and a group with one scorable row (advantage 0, outside the batch statistics)."""
    pytest.importorskip("trl")
    n, groups = 4, 6
    rng = np.random.default_rng(seed)
    rewards = rng.choice([0.0, 0.5, 1.0, 2.0], size=(n * groups, 2)).astype(np.float32)
    rewards[rng.random(rewards.shape) < 0.2] = np.nan  # a function returned None
    rewards[[1, 9, 10, 11]] = np.nan  # unscorable rows; group 2 keeps one scorable row
    rewards[4:8] = 1.0  # a group whose rewards are all equal
    weights = np.array([1.0, 0.5])
    expected = trl_rloo_reference(rewards, weights, n, normalize=normalize)
    scorable = ~np.isnan(rewards).all(axis=1)
    group = np.arange(n * groups) // n
    rows = EstimatorRows(rewards[scorable], weights, group[scorable], np.zeros(int(scorable.sum())))
    ours = RECOMPUTE["rloo_normalized" if normalize else "rloo_vectorized"](rows)
    assert ours is not None
    np.testing.assert_allclose(ours, expected[scorable], atol=2e-5, rtol=1e-5)
    assert not expected[~scorable].any(), "TRL gives unscorable rows advantage 0"
    if not normalize:
        # groups of two or more scorable rows: verl's loop RLOO is the same
        full = ~rows.single
        np.testing.assert_allclose(RECOMPUTE["rloo"](rows)[full], expected[scorable][full], atol=2e-5, rtol=1e-5)
