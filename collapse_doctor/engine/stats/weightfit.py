"""Sufficient statistics to infer, from a logged advantage, the channel weights the trainer used.

GRPO with group scaling logs ``A = dev_t / (std_t + eps)`` with ``dev_t = D w``, where ``D = [dev_1 .. dev_C]``
holds the group-centred channel rewards (NaN read as 0 before centring over the group's valid rows, as TRL's
``nansum`` of the weighted total does, so that ``dev_t = D w`` holds exactly). In every group ``D w`` is
parallel to the group's logged advantages: ``(I - P_A) D w = 0`` with ``P_A = A A^T / |A|^2``. Per step

    ``M_grpo = sum over groups (2+ valid rows, |A| > 0) of D^T (I - P_A) D``,

a symmetric positive semi-definite ``C x C`` matrix with ``M w = 0`` at the weights used (up to their
scale); batch scaling and no scaling keep ``A`` parallel to ``dev_t`` in each group, so they fit too.
GDPO logs ``A = s / (std + eps)`` over the step, ``s = Z w`` with ``Z = [z_1 .. z_C]`` the per-channel group
z-scores (as :mod:`collapse_doctor.engine.advantages` computes them, with its eps; NaN as 0); ``s`` has group mean 0,
so the step mean is 0 and the projection is taken over the whole step:

    ``M_gdpo = Z^T Z - (Z^T A)(A^T Z) / |A|^2`` over the step's rows (none when ``|A| = 0``).

Only valid rows with a logged value enter (the relations hold row by row). The series store ``M``'s
diagonal (``wfit_*_diag`` ``[channel]``), its off-diagonal entries (``wfit_*_off`` ``[pair]``, in
:func:`collapse_doctor.core.series.channel_pairs` order) and ``wfit_*_norm``, the trace of ``D^T D`` (``Z^T Z``)
over the same groups and rows (none beyond :data:`~collapse_doctor.core.series.MAX_PAIRED_CHANNELS` channels: a
``C x C`` matrix per step). A solver sums them over steps and minimises ``w^T M w`` with ``w_1 = 1``
(``w_rest = -M_rest,rest^-1 M_rest,1``); ``w^T M w / (|w|^2 norm)`` is the fit's relative residual, below
about 1e-8 (float32 rounding) for the weights used and orders of magnitude larger for others (about 1e-3 for
the other algorithm's advantages, 1e-2 and more for wrong weights). Groups whose logged advantages are all 0
are left out although ``A = 0`` would mean ``D w = 0``: trainers also zero the advantages of groups they filter
out (dynamic sampling, truncated completions), and those would pull the fit anywhere. Nothing without a
logged advantage.

The general path sums exact float64 products over rows and subtracts the projection per group or step; the
dense path, whose sums over a group's members run in float32, first takes each column's residual off the
logged advantages (``R = (I - P_A) D``, so ``M = R^T R``): its rounding then scales with the residual, which
is small exactly where the subtraction would cancel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from collapse_doctor.core.series import MAX_PAIRED_CHANNELS
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import to_host

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

ALGORITHMS = ("grpo", "gdpo")
NAMES = tuple(f"wfit_{name}_{part}" for name in ALGORITHMS for part in ("diag", "off", "norm"))


def general(c: GeneralChunk) -> dict[str, np.ndarray]:
    if c.input.logged is None or c.num_channels > MAX_PAIRED_CHANNELS:
        return {}
    logged = c.input.logged.to(c.rewards.dtype)
    has = ~torch.isnan(logged) & c.valid_row
    a = torch.where(has, logged, 0.0).double()
    deviations = c.trl_deviations()
    zscores = [c.zscores[:, k].double() for k in range(c.num_channels)]
    if not bool(has.all()):
        hasd = has.double()
        deviations, zscores = [d * hasd for d in deviations], [z * hasd for z in zscores]
    buffer = torch.empty_like(a)

    def dot(x: Tensor, y: Tensor) -> Tensor:
        """Per group over its rows; products of float32 values are exact in float64 (written to one buffer)."""
        return c.group_sum(torch.mul(x, y, out=buffer))

    entries = _entries(c.num_channels)
    aa = dot(a, a)
    keep = (c.eligible & (aa > 0)).double()
    inverse = keep / aa.clamp_min(1e-300)
    # GRPO: per group, D^T D - (D^T A)(A^T D) / |A|^2
    dd = [dot(deviations[i], deviations[j]) for i, j in entries]
    da = [dot(d, a) for d in deviations]
    grpo = [c.steps_of_groups((dd[k] - da[i] * da[j] * inverse) * keep) for k, (i, j) in enumerate(entries)]
    grpo_norm = c.steps_of_groups(_trace(dd, entries) * keep)
    # GDPO: the same over the step
    zz = [c.steps_of_groups(dot(zscores[i], zscores[j])) for i, j in entries]
    za = [c.steps_of_groups(dot(z, a)) for z in zscores]
    aa_s = c.steps_of_groups(aa)
    keep_s = (aa_s > 0).double()
    inverse_s = keep_s / aa_s.clamp_min(1e-300)
    gdpo = [(zz[k] - za[i] * za[j] * inverse_s) * keep_s for k, (i, j) in enumerate(entries)]
    host = [[to_host(x) for x in part] for part in (grpo, gdpo)]
    return _pack(entries, host[0], to_host(grpo_norm), host[1], to_host(_trace(zz, entries) * keep_s))


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    if c.logged is None or c.num_channels > MAX_PAIRED_CHANNELS:
        return {}
    logged = c.members(c.logged)
    has = ~np.isnan(logged)
    a = np.nan_to_num(logged, nan=0.0)
    deviations, zscores = list(c.dev), list(c.zscores)
    if not bool(has.all()):
        mask = has.astype(a.dtype)
        deviations, zscores = [d * mask for d in deviations], [z * mask for z in zscores]

    def dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per group over its members (``[g, G]`` -> ``[G]``), float64."""
        return (x * y).sum(axis=0).astype(np.float64)

    entries = _entries(c.num_channels)
    aa = dot(a, a)
    keep = (aa > 0).astype(np.float64)
    inverse = keep / np.maximum(aa, 1e-300)
    # GRPO: each group's deviations off its logged advantages, R = D - A (A^T D) / |A|^2, and M = R^T R;
    # |D_k|^2 = |R_k|^2 + (A^T D_k)^2 / |A|^2 gives the norm.
    along = [dot(d, a) for d in deviations]
    residuals = [d - a * (u * inverse).astype(np.float32) for d, u in zip(deviations, along, strict=True)]
    gram = [dot(residuals[i], residuals[j]) for i, j in entries]
    grpo = [c.steps_sum(x * keep) for x in gram]
    squares = [gram[k] for k, (i, j) in enumerate(entries) if i == j]
    grpo_norm = c.steps_sum(sum((r + u * u * inverse for r, u in zip(squares, along, strict=True)), aa * 0) * keep)
    # GDPO: the same over the step
    aa_s = c.steps_sum(aa)
    keep_s = (aa_s > 0).astype(np.float64)
    inverse_s = keep_s / np.maximum(aa_s, 1e-300)
    along_s = [c.steps_sum(dot(z, a)) for z in zscores]
    residuals = [
        z - a * (u * inverse_s)[c.group_step].astype(np.float32) for z, u in zip(zscores, along_s, strict=True)
    ]
    gdpo = [c.steps_sum(dot(residuals[i], residuals[j])) * keep_s for i, j in entries]
    squares = [gdpo[k] for k, (i, j) in enumerate(entries) if i == j]
    gdpo_norm = sum((r + u * u * inverse_s for r, u in zip(squares, along_s, strict=True)), aa_s * 0) * keep_s
    return _pack(entries, grpo, grpo_norm, gdpo, gdpo_norm)


def _entries(C: int) -> list[tuple[int, int]]:
    """The upper triangle of a ``C x C`` matrix row by row: the diagonal and the pairs in combinations order."""
    return [(i, j) for i in range(C) for j in range(i, C)]


def _trace(entries_values: list[Tensor], entries: list[tuple[int, int]]) -> Tensor:
    diagonal = [x for x, (i, j) in zip(entries_values, entries, strict=True) if i == j]
    return sum(diagonal[1:], diagonal[0])


def _pack(
    entries: list[tuple[int, int]],
    grpo: list[np.ndarray],
    grpo_norm: np.ndarray,
    gdpo: list[np.ndarray],
    gdpo_norm: np.ndarray,
) -> dict[str, np.ndarray]:
    """The six series from the per-step matrix entries (``[S]`` each on the host, :func:`_entries` order) and
    norms."""
    out: dict[str, np.ndarray] = {}
    for name, m, norm in (("grpo", grpo, grpo_norm), ("gdpo", gdpo, gdpo_norm)):
        out[f"wfit_{name}_diag"] = np.stack([x for x, (i, j) in zip(m, entries, strict=True) if i == j], axis=1)
        off = [x for x, (i, j) in zip(m, entries, strict=True) if i != j]
        if off:
            out[f"wfit_{name}_off"] = np.stack(off, axis=1)
        out[f"wfit_{name}_norm"] = norm
    return out
