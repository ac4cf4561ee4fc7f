"""Resolution of the rewards and advantages: tied totals and distinct advantage values.

``differing_pairs`` counts the pairs of valid rows of a group whose reward vectors differ (quantised to
:data:`TIE_QUANTUM`), ``tied_pair_share`` the share of those whose weighted totals are nevertheless equal
(GRPO cannot rank them). ``distinct_ratio_*`` is the mean, over groups that carry signal, of the number of
distinct advantage values (quantised to :data:`DISTINCT_QUANTUM`) per valid row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from collapse_doctor.stats.chunk import DenseChunk, GeneralChunk
from collapse_doctor.stats.kernels import bucket_sizes, hash_rows, quantize, ratio

TIE_QUANTUM = 1e-5
"""Totals closer than this count as tied (float32 sums of equal rewards differ by rounding only)."""
DISTINCT_QUANTUM = 1e-4
"""Advantages closer than this count as one value."""

NAMES = ("distinct_ratio_grpo", "distinct_ratio_gdpo", "differing_pairs", "tied_pair_share")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    gi, adv = c.group_index, c.input.advantages
    out: dict[str, Tensor] = {}
    signal_rows = c.signal_rows.double()
    signal_groups = c.signal_group.double()
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        keys = hash_rows([gi, quantize(x, DISTINCT_QUANTUM)])
        distinct = c.group_sum((1.0 / bucket_sizes(keys)).double() * signal_rows)
        per_row = ratio(distinct, c.group_rows)
        out[f"distinct_ratio_{name}"] = ratio(
            c.steps_of_groups(torch.nan_to_num(per_row) * signal_groups), c.steps_of_groups(signal_groups)
        )

    vq = [quantize(x, TIE_QUANTUM) for x in c.columns]
    same_vector = bucket_sizes(hash_rows([gi, *vq])).double()
    same_total = bucket_sizes(hash_rows([gi, quantize(c.total, TIE_QUANTUM)])).double()
    vr = c.valid_row.double()
    pairs_all = c.steps_sum(vr * (c.group_rows[gi] - 1) / 2)
    pairs_identical = c.steps_sum(vr * (same_vector - 1) / 2)
    pairs_equal_total = c.steps_sum(vr * (same_total - 1) / 2)
    differing = pairs_all - pairs_identical
    out["differing_pairs"] = differing
    out["tied_pair_share"] = ratio(pairs_equal_total - pairs_identical, differing)
    return out


def dense(c: DenseChunk) -> dict[str, Tensor]:
    g = c.g
    out: dict[str, Tensor] = {}
    for name, x in c.advantages.items():
        distinct = _distinct_counts(torch.round(x.double() / DISTINCT_QUANTUM))
        out[f"distinct_ratio_{name}"] = ratio(c.steps_sum(distinct * c.signal_float / g), c.num_signal)

    rewards = c.member_rewards
    vector = hash_rows([quantize(rewards[k], TIE_QUANTUM, nan_free=True) for k in range(c.num_channels)])
    identical = _equal_pairs(vector)
    equal_total = _equal_pairs(quantize(c.total, TIE_QUANTUM, nan_free=True))
    differing = g * (g - 1) / 2 * c.gps - c.steps_sum(identical)
    out["differing_pairs"] = differing
    out["tied_pair_share"] = ratio(c.steps_sum(equal_total - identical), differing)
    return out


def _distinct_counts(keys: Tensor) -> Tensor:
    """Per group (column of ``keys``, ``[g, G]``): how many distinct keys it holds.

    >>> _distinct_counts(torch.tensor([[1, 5], [2, 5], [1, 5], [3, 5]])).tolist()
    [3, 1]
    """
    g = keys.shape[0]
    repeated = torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)  # equals an earlier member
    for shift in range(1, g):
        repeated[shift:] |= keys[shift:] == keys[:-shift]
    return g - repeated.sum(dim=0)


def _equal_pairs(keys: Tensor) -> Tensor:
    """Per group (column of ``keys``, ``[g, G]``): how many pairs of its members have equal keys.

    >>> _equal_pairs(torch.tensor([[1, 5], [2, 5], [1, 5], [3, 5]])).tolist()
    [1, 6]
    """
    g = keys.shape[0]
    count = torch.zeros(keys.shape[1], dtype=torch.int64, device=keys.device)
    for shift in range(1, g):
        count += (keys[shift:] == keys[:-shift]).sum(dim=0)
    return count
