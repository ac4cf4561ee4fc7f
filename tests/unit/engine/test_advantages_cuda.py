"""The advantage engine gives the same numbers on CUDA as on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapse_doctor.engine.advantages import compute_advantages

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def ragged_shuffled(seed: int, n_steps: int = 4):
    """Ragged groups (1..12 rows) over several steps, shuffled, with partial and all-NaN rows."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 13, size=n_steps * 40)
    group = np.repeat(np.arange(sizes.size), sizes)
    step = np.repeat(np.arange(sizes.size) // 40, sizes)
    n = group.size
    rewards = np.stack(
        [
            rng.integers(0, 2, n).astype(float),  # format
            rng.integers(0, 2, n).astype(float),  # correct
            rng.normal(0.5, 1.0, n),
            np.round(rng.random(n) * 4) / 4,
        ],
        axis=1,
    ).astype(np.float32)
    rewards[rng.random(rewards.shape) < 0.1] = np.nan
    rewards[rng.random(n) < 0.05] = np.nan
    perm = rng.permutation(n)
    return (
        torch.from_numpy(rewards[perm]),
        torch.from_numpy(group[perm]),
        torch.from_numpy(step[perm]),
    )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("convention", ["trl", "verl", "paper"])
def test_cuda_matches_cpu(convention, scale, seed):
    rewards, group, step = ragged_shuffled(seed)
    weights = torch.tensor([1.0, 0.5, 2.0, 0.25])
    cpu = compute_advantages(rewards, group, weights=weights, step_index=step, scale=scale, convention=convention)
    gpu = compute_advantages(
        rewards.cuda(),
        group.cuda(),
        weights=weights.cuda(),
        step_index=step.cuda(),
        scale=scale,
        convention=convention,
    )
    for name in ("grpo", "gdpo", "zscores"):
        got = getattr(gpu, name)
        assert got.device.type == "cuda", name
        torch.testing.assert_close(got.cpu(), getattr(cpu, name), rtol=0, atol=1e-5, equal_nan=True, msg=name)
