"""Rollouts, valid rows, groups, eligible groups and group sizes against a loop over groups."""

from __future__ import annotations

import numpy as np

from tests.helpers.stats_cases import Case, assert_close


def reference(case: Case) -> dict[str, np.ndarray]:
    names = ("rollouts", "valid_rows", "groups", "eligible_groups", "group_size_min", "group_size_max")
    out: dict[str, list[float]] = {name: [] for name in names}
    for s in range(case.num_steps):
        sizes = [int(case.valid[rows].sum()) for rows in case.groups(s)]
        present = [n for n in sizes if n > 0]
        out["rollouts"].append(float((case.step == s).sum()))
        out["valid_rows"].append(float(sum(sizes)))
        out["groups"].append(float(len(present)))
        out["eligible_groups"].append(float(sum(n >= 2 for n in sizes)))
        out["group_size_min"].append(float(min(present)))
        out["group_size_max"].append(float(max(present)))
    return {name: np.array(values) for name, values in out.items()}


def test_sizes_match_the_loop(case: Case) -> None:
    assert_close(case, reference(case), rtol=0, atol=0)
