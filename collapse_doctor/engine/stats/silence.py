"""Silence read from the advantages each algorithm produces: groups that teach nothing, and why.

For algorithm ``a`` (``grpo``, ``gdpo``), a group with 2+ valid rows is silent when its advantages under
``a`` span less than :data:`SILENT_SPAN` (max - min over its valid rows). ``silent_groups_{a}`` counts them
among ``eligible_groups`` (sizes); ``zero_adv_rows_{a}`` counts the valid rows that get no gradient: those of
silent groups, those of groups with a single valid row (TRL gives those 0), and, in the other groups, the rows
whose own advantage is within :data:`SILENT_SPAN` of 0 (a completion whose total equals its group's mean, as
the middle member of a group of binary rewards often does).

A silent group is all-pass (``all_pass_groups_{a}``) when every channel that has a value in the group is
constant there and equal to that channel's ``reward_max`` over the step's valid rows (channels), all-fail
(``all_fail_groups_{a}``) when every such channel sits at its ``reward_min``. The other silent groups are
silent for another reason: constant at some middle value, or (GDPO) channel z-scores that cancel.

Two causes of silence are told apart: ``silent_identical_groups_{a}`` counts the silent groups whose valid rows
all have the same completion (a policy collapsed to one answer; NaN without completion text; of them,
``identical_pass_groups_{a}`` and ``identical_fail_groups_{a}`` are also all-pass / all-fail, so the causes can be
made exclusive: :class:`~collapse_doctor.judge.budget.SignalBudget`), and
``silent_cancel_groups_{a}`` those whose reward vectors are not all equal (some channel varies within the group,
so the channels cancel in the advantage: complementary channels under GRPO's sum, z-scores under GDPO).

Run-level all-pass, "every channel at its run-wide maximum", is exact from these series: a step's
``all_pass_groups_{a}`` counts towards it only when the step's ``reward_max`` equals the run's maximum
for every channel (a step whose maximum of some channel falls short has no group at that channel's run
ceiling). A channel without any value in the step (``reward_max`` NaN) places no condition; when a channel
is missing from whole groups of a step (NaN in every row) this is a lower bound, as such a group may sit at
the run ceiling of the channels it has. The same holds for all-fail with ``reward_min``.

Caveat: GDPO re-normalises the fused sum over the step. When every group of a step cancels, the residues
of about 1e-7 are divided by ``std + eps`` with a std of about 1e-7: the advantages become about 1e-3 (TRL's
eps 1e-4) or of order 1 (no eps) and the step does not count as silent, although its advantages carry no
reward information.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from collapse_doctor.engine.lazy_torch import torch

SILENT_SPAN = 1e-4
"""A group whose advantages span less than this is silent. Exactly cancelling z-scores do not give exactly
0 in float32: with two complementary binaries (``B = 1 - A`` within the group, equal weights) GDPO's
``z_B = -z_A`` holds up to about 1e-7 (the shift and the mean are rounded), and so does their weighted
sum; 1e-4 is a thousand times that. Advantages are in units of a std (GRPO: the group's, where z-scores of
totals that vary by more than the eps span at least ``2 sqrt((n-1)/n) >= 1.41``; GDPO: the step's std of the
fused sum), so a spread below 1e-4 of a std ranks nothing the optimiser can use."""

ALGORITHMS = ("grpo", "gdpo")
NAMES = tuple(
    f"{key}_{name}"
    for name in ALGORITHMS
    for key in (
        "silent_groups",
        "zero_adv_rows",
        "all_pass_groups",
        "all_fail_groups",
        "silent_identical_groups",
        "identical_pass_groups",
        "identical_fail_groups",
        "silent_cancel_groups",
    )
)


def general(c: GeneralChunk) -> dict[str, Tensor]:
    gi, G, rows = c.group_index, c.num_groups, c.group_rows
    has_value = [count > 0 for _, count, _ in c.channel_centred]
    top, bottom = c.constant_at
    all_top = torch.ones(G, dtype=torch.bool, device=c.device)
    all_bottom = all_top.clone()
    for k in range(c.num_channels):
        all_top &= top[k] | ~has_value[k]
        all_bottom &= bottom[k] | ~has_value[k]
    single = rows == 1
    varied = ~c.equal_rewards
    identical = c.identical_completions
    same_text = None if identical is None else torch.from_numpy(identical).to(c.device)
    unknown = torch.full((c.num_steps,), float("nan"), dtype=torch.float64, device=c.device)
    out: dict[str, Tensor] = {}
    for name in ALGORITHMS:
        adv = getattr(c.input.advantages, name)  # never NaN (0 on rows without reward, left out here)
        high, low = adv, adv
        if not c.all_valid:
            high = torch.where(c.valid_row, adv, float("-inf"))
            low = torch.where(c.valid_row, adv, float("inf"))
        group_max = torch.full((G,), float("-inf"), dtype=adv.dtype, device=c.device)
        group_min = torch.full((G,), float("inf"), dtype=adv.dtype, device=c.device)
        span = group_max.scatter_reduce_(0, gi, high, "amax") - group_min.scatter_reduce_(0, gi, low, "amin")
        silent = c.eligible & (span < SILENT_SPAN)
        near_zero = c.group_sum((c.valid_row & (adv.abs() < SILENT_SPAN)).double())
        out.update(_counts(name, silent, single, rows, near_zero, all_top, all_bottom, c.steps_of_groups))
        for key, mask in (("silent_identical", silent), ("identical_pass", silent & all_top)):
            out[f"{key}_groups_{name}"] = (
                unknown if same_text is None else c.steps_of_groups((mask & same_text).double())
            )
        out[f"identical_fail_groups_{name}"] = (
            unknown if same_text is None else c.steps_of_groups((silent & all_bottom & same_text).double())
        )
        cancel = silent & varied if same_text is None else silent & varied & ~same_text
        out[f"silent_cancel_groups_{name}"] = c.steps_of_groups(cancel.double())
    return out


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    top, bottom = c.constant_at
    all_top, all_bottom = top.all(axis=0), bottom.all(axis=0)
    varied, same_text = ~c.equal_rewards, c.identical_completions
    out: dict[str, np.ndarray] = {}
    for name, adv in c.advantages.items():
        silent = (adv.max(axis=0) - adv.min(axis=0)) < SILENT_SPAN
        near_zero = (np.abs(adv) < SILENT_SPAN).sum(axis=0)
        out[f"silent_groups_{name}"] = c.steps_sum(silent)
        out[f"zero_adv_rows_{name}"] = c.steps_sum(np.where(silent, c.g, near_zero))  # no group of one here
        out[f"all_pass_groups_{name}"] = c.steps_sum(silent & all_top)
        out[f"all_fail_groups_{name}"] = c.steps_sum(silent & all_bottom)
        for key, mask in (("silent_identical", silent), ("identical_pass", silent & all_top)):
            out[f"{key}_groups_{name}"] = (
                np.full(c.num_steps, np.nan) if same_text is None else c.steps_sum(mask & same_text)
            )
        out[f"identical_fail_groups_{name}"] = (
            np.full(c.num_steps, np.nan) if same_text is None else c.steps_sum(silent & all_bottom & same_text)
        )
        cancel = silent & varied if same_text is None else silent & varied & ~same_text
        out[f"silent_cancel_groups_{name}"] = c.steps_sum(cancel)
    return out


def _counts(
    name: str,
    silent: Tensor,
    single: Tensor,
    rows: Tensor,
    near_zero: Tensor,
    all_top: Tensor,
    all_bottom: Tensor,
    per_step: Callable[[Tensor], Tensor],
) -> dict[str, Tensor]:
    """The four counts of one algorithm from ``[G]`` masks, summed per step with ``per_step``."""
    return {
        f"silent_groups_{name}": per_step(silent.double()),
        f"zero_adv_rows_{name}": per_step(torch.where(silent | single, rows, near_zero)),
        f"all_pass_groups_{name}": per_step((silent & all_top).double()),
        f"all_fail_groups_{name}": per_step((silent & all_bottom).double()),
    }
