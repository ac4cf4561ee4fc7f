"""Groups without signal (GRPO's and GDPO's) and each channel's share of the within-group signal.

``signal_share_grpo[c]`` is channel c's part of the within-group variance of the weighted total
(``sum w_c dev_c dev_t / sum dev_t^2``), ``signal_share_gdpo[c]`` the same for GDPO's fused sum of z-scores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import collapse_doctor.engine.stats.dense as dense_np
from collapse_doctor.engine.stats.chunk import GeneralChunk
from collapse_doctor.engine.stats.dense import DenseChunk
from collapse_doctor.engine.stats.kernels import ratio, segment_extreme

if TYPE_CHECKING:
    from torch import Tensor

NAMES = ("zero_var_share", "gdpo_zero_var_share", "signal_share_grpo", "signal_share_gdpo")


def general(c: GeneralChunk) -> dict[str, Tensor]:
    _, _, std_t = c.total_centred
    eligible = c.eligible
    n_eligible = c.steps_of_groups(eligible.double())
    z, w, dev_t = c.zscores, c.weights, c.dev_t
    all_flat = (z == 0).all(dim=1).double()  # no channel varies within the row's group
    group_flat = segment_extreme(all_flat, c.group_index, c.num_groups, "amin")
    var_t = c.total_ss
    var_s = c.steps_sum(c.fused**2)
    return {
        "zero_var_share": ratio(c.steps_of_groups((eligible & (std_t == 0)).double()), n_eligible),
        "gdpo_zero_var_share": ratio(c.steps_of_groups((eligible & (group_flat == 1)).double()), n_eligible),
        "signal_share_grpo": ratio(c.steps_sum(w * c.dev * dev_t[:, None]), var_t[:, None]),
        "signal_share_gdpo": ratio(c.steps_sum(w * z * c.fused[:, None]), var_s[:, None]),
    }


def dense(c: DenseChunk) -> dict[str, np.ndarray]:
    z, fused, dev_t, weight = c.zscores, c.fused, c.dev_t, c.weight_column
    var_t = c.total_ss
    var_s = c.steps_sum((fused * fused).sum(axis=0))
    return {
        "zero_var_share": c.steps_sum(c.std_t == 0) / c.gps,
        "gdpo_zero_var_share": c.steps_sum((z == 0).all(axis=0).all(axis=0)) / c.gps,
        "signal_share_grpo": dense_np.ratio(c.steps_sum((c.dev * dev_t).sum(axis=-2)) * weight, var_t[:, None]),
        "signal_share_gdpo": dense_np.ratio(c.steps_sum((z * fused).sum(axis=-2)) * weight, var_s[:, None]),
    }
