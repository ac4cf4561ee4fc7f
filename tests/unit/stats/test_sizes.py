"""Rollouts, groups and group sizes against a loop over groups."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close


def reference(case: Case) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {name: [] for name in ("rollouts", "groups", "group_size_min", "group_size_max")}
    for s in range(case.num_steps):
        sizes = [int(case.valid[rows].sum()) for rows in case.groups(s)]
        present = [n for n in sizes if n > 0]
        out["rollouts"].append(float((case.step == s).sum()))
        out["groups"].append(float(len(present)))
        out["group_size_min"].append(float(min(present)))
        out["group_size_max"].append(float(max(present)))
    return {name: np.array(values) for name, values in out.items()}


def test_sizes_match_the_loop(case: Case) -> None:
    assert_close(case, reference(case), rtol=0, atol=0)
