"""Resolution of the rewards and advantages: tied pairs under each algorithm and distinct advantage values.

``differing_pairs`` counts the pairs of valid rows of a group whose reward vectors differ (quantised to
:data:`TIE_QUANTUM`). ``tied_pair_share`` is the share of those whose weighted totals are nevertheless equal
(quantised to :data:`TIE_QUANTUM`): GRPO cannot rank them. ``tied_pair_share_gdpo`` is the share of the same
differing pairs whose GDPO advantages are equal (quantised to :data:`ADV_TIE_QUANTUM`): GDPO cannot rank them.

Two complementary binaries (``B = 1 - A`` on every row of the group) with equal weights tie under both: the
totals are all equal, and ``z_B = -z_A`` makes every fused sum 0. With unequal weights they tie under
neither. Under GDPO the other vectors of the group matter: in ``(1,0) (0,1) (1,1) (1,0)`` with equal weights
the pair ``(1,0)``-``(0,1)`` ties under GRPO (totals 1 and 1) but not under GDPO (A is 1 on 3 of 4 rows, B on
2 of 4, so their z-scores differ); with 3+ channels equal totals need not mean equal fused sums.

``distinct_ratio_*`` is the mean, over groups that carry signal, of the number of distinct advantage values
among the group's valid rows (quantised to :data:`DISTINCT_QUANTUM`) per valid row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import bucket_sizes, hash_rows, quantize, ratio, segment_sum

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

TIE_QUANTUM = 1e-5
"""Totals closer than this count as tied (float32 sums of equal rewards differ by rounding only)."""
DISTINCT_QUANTUM = 1e-4
"""Advantages closer than this count as one value."""
ADV_TIE_QUANTUM = DISTINCT_QUANTUM
"""GDPO advantages closer than this count as tied: the advantages' own unit of equality, as for
``distinct_ratio_*``. They are batch z-scores (unit std over the step), so rounding leaves residues of
about 1e-7 where two fused sums cancel exactly, and a quantum of 1e-4 is wide enough that such residues
rarely straddle a bin edge (about 0.2% of truly tied pairs, against about 2% at 1e-5), while two advantages
closer than 1e-4 of a batch std do not rank a pair in any way the optimiser can use."""

NAMES = ("distinct_ratio_grpo", "distinct_ratio_gdpo", "differing_pairs", "tied_pair_share", "tied_pair_share_gdpo")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    gi, adv = c.group_index, c.input.advantages
    out: dict[str, Tensor] = {}
    signal_rows = c.signal_rows.double()
    signal_groups = c.signal_group.double()
    for name, x in (("grpo", adv.grpo), ("gdpo", adv.gdpo)):
        if not c.all_valid:
            x = torch.where(c.valid_row, x, torch.nan)  # rows without reward are not values of the group
        bins = quantize(x, DISTINCT_QUANTUM)
        same = bucket_sizes(hash_rows([gi, bins]))
        distinct = c.group_sum((1.0 / same).double() * signal_rows)
        per_row = ratio(distinct, c.group_rows)
        out[f"distinct_ratio_{name}"] = ratio(
            c.steps_of_groups(torch.nan_to_num(per_row) * signal_groups), c.steps_of_groups(signal_groups)
        )

    vq = [quantize(x, TIE_QUANTUM) for x in c.columns]
    vector = hash_rows([gi, *vq])
    _, bucket, bucket_rows = torch.unique(vector, return_inverse=True, return_counts=True)
    vector_rows = bucket_rows[bucket]
    same_vector = vector_rows.double()
    same_total = bucket_sizes(hash_rows([gi, quantize(c.total, TIE_QUANTUM)])).double()
    vr = c.valid_row.double()
    pairs_all = c.steps_sum(vr * (c.group_rows[gi] - 1) / 2)
    pairs_identical = c.steps_sum(vr * (same_vector - 1) / 2)
    pairs_equal_total = c.steps_sum(vr * (same_total - 1) / 2)
    differing = pairs_all - pairs_identical
    out["differing_pairs"] = differing
    out["tied_pair_share"] = ratio(pairs_equal_total - pairs_identical, differing)

    # GDPO: pairs with equal advantages minus those among them with equal vectors (the differing tied pairs).
    if ADV_TIE_QUANTUM != DISTINCT_QUANTUM:  # else the loop's last bins (and buckets) are GDPO's
        x = adv.gdpo if c.all_valid else torch.where(c.valid_row, adv.gdpo, torch.nan)
        bins = quantize(x, ADV_TIE_QUANTUM)
        same = bucket_sizes(hash_rows([gi, bins]))
    extra = (same - 1).double()  # per row: the GDPO pairs of equal advantages
    pairs_equal_adv = c.steps_sum(extra if c.all_valid else extra * vr) / 2
    pairs_equal_both = pairs_identical
    mixed = _mixed_rows(bucket, bucket_rows, vector_rows, bins)
    if mixed.numel():
        same_both = bucket_sizes(hash_rows([vector[mixed], bins[mixed]])).double()
        lost = vr[mixed] * (same_vector[mixed] - same_both) / 2
        pairs_equal_both = pairs_identical - segment_sum(lost, c.step_index[mixed], c.num_steps)
    out["tied_pair_share_gdpo"] = ratio(pairs_equal_adv - pairs_equal_both, differing)
    return out


def _mixed_rows(bucket: Tensor, bucket_rows: Tensor, rows: Tensor, second: Tensor) -> Tensor:
    """The rows of the buckets (row ``i`` in bucket ``bucket[i]`` of ``bucket_rows`` rows, from ``torch.unique``;
    ``rows`` is ``bucket_rows[bucket]``) in which ``second`` is not uniform.

    Rows with equal reward vectors nearly always have equal advantages, so this is nearly always empty and
    the pairs with equal vectors and equal advantages are the pairs with equal vectors. Only the rows that
    share their bucket are looked at.

    >>> bucket, bucket_rows = torch.tensor([0, 0, 1, 1, 1, 2]), torch.tensor([2, 3, 1])
    >>> _mixed_rows(bucket, bucket_rows, bucket_rows[bucket], torch.tensor([1, 1, 2, 3, 2, 7])).tolist()
    [2, 3, 4]
    """
    shared = torch.nonzero(rows > 1).squeeze(1)
    ids, values = bucket[shared], second[shared]
    size = bucket_rows.numel()
    high = torch.full((size,), torch.iinfo(torch.int64).min, dtype=torch.int64, device=bucket.device)
    low = torch.full((size,), torch.iinfo(torch.int64).max, dtype=torch.int64, device=bucket.device)
    mixed = high.scatter_reduce(0, ids, values, reduce="amax") != low.scatter_reduce(0, ids, values, reduce="amin")
    mixed &= bucket_rows > 1
    if not bool(mixed.any()):
        return torch.zeros(0, dtype=torch.int64, device=bucket.device)
    return shared[mixed[ids]]


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    g = c.g
    out: dict[str, np.ndarray] = {}
    for name, x in c.advantages.items():
        bins = dense_np.quantize(x, DISTINCT_QUANTUM)
        distinct = _distinct_counts(bins)
        out[f"distinct_ratio_{name}"] = dense_np.ratio(c.steps_sum(distinct * c.signal_float / g), c.num_signal)

    rewards = c.member_rewards
    vector = dense_np.hash_rows([dense_np.quantize(rewards[k], TIE_QUANTUM) for k in range(c.num_channels)])
    total = dense_np.quantize(c.total, TIE_QUANTUM)
    if ADV_TIE_QUANTUM != DISTINCT_QUANTUM:  # else the loop's last bins are GDPO's
        bins = dense_np.quantize(c.advantages["gdpo"], ADV_TIE_QUANTUM)
    identical, equal_total, tied_gdpo = _pair_counts(vector, total, bins)
    differing = g * (g - 1) / 2 * c.gps - c.steps_sum(identical)
    out["differing_pairs"] = differing
    out["tied_pair_share"] = dense_np.ratio(c.steps_sum(equal_total - identical), differing)
    out["tied_pair_share_gdpo"] = dense_np.ratio(c.steps_sum(tied_gdpo), differing)
    return out


def _pair_counts(vector: np.ndarray, total: np.ndarray, adv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group (columns of the ``[g, G]`` keys): the pairs of members with equal ``vector``, with equal
    ``total``, and with equal ``adv`` but different ``vector``.

    >>> [x.tolist() for x in _pair_counts(np.array([[1], [2], [1]]), np.array([[0], [0], [0]]),
    ...                                   np.array([[5], [5], [6]]))]
    [[1], [3], [1]]
    """
    g = vector.shape[0]
    identical = np.zeros(vector.shape[1], dtype=np.int64)
    equal_total, tied_adv = identical.copy(), identical.copy()
    for shift in range(1, g):
        same = vector[shift:] == vector[:-shift]
        identical += same.sum(axis=0)
        equal_total += (total[shift:] == total[:-shift]).sum(axis=0)
        tied_adv += ((adv[shift:] == adv[:-shift]) & ~same).sum(axis=0)
    return identical, equal_total, tied_adv


def _distinct_counts(keys: np.ndarray) -> np.ndarray:
    """Per group (column of ``keys``, ``[g, G]``): how many distinct keys it holds.

    >>> _distinct_counts(np.array([[1, 5], [2, 5], [1, 5], [3, 5]])).tolist()
    [3, 1]
    """
    g = keys.shape[0]
    repeated = np.zeros(keys.shape, dtype=bool)  # equals an earlier member
    for shift in range(1, g):
        repeated[shift:] |= keys[shift:] == keys[:-shift]
    return g - repeated.sum(axis=0)
