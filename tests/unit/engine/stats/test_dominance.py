"""dominance_grpo / dominance_gdpo against a loop over the rows of each group."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close, deviation


def decider(parts: np.ndarray, adv: float) -> int | None:
    """The channel deciding a row's advantage sign; -1 when the largest part disagrees; None without signal."""
    if abs(adv) <= 1e-6:
        return None
    k = int(np.argmax(np.abs(parts)))  # the first on ties
    return k if np.sign(parts[k]) == np.sign(adv) else -1


def reference(case: Case) -> dict[str, np.ndarray]:
    S, C = case.num_steps, case.num_channels
    w = case.weights
    z = np.nan_to_num(case.zscores)
    out = {"dominance_grpo": np.full((S, C), np.nan), "dominance_gdpo": np.full((S, C), np.nan)}
    for s in range(S):
        counts = {name: np.zeros(C) for name in out}
        signal = dict.fromkeys(out, 0)
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            if len(valid) == 0:
                continue
            dev_t = deviation(case.total[valid])
            dev = np.nan_to_num(np.stack([deviation(case.rewards[valid, c]) for c in range(C)], axis=1))
            for k, row in enumerate(valid):
                for name, parts, adv in (
                    ("dominance_grpo", w * dev[k], dev_t[k]),
                    ("dominance_gdpo", w * z[row], float(np.sum(w * z[row]))),
                ):
                    who = decider(parts, adv)
                    if who is None:
                        continue
                    signal[name] += 1
                    if who >= 0:
                        counts[name][who] += 1
        for name in out:
            if signal[name]:
                out[name][s] = counts[name] / signal[name]
    return out


def test_dominance_matches_the_loop(case: Case) -> None:
    assert_close(case, reference(case), rtol=0, atol=1e-12)
