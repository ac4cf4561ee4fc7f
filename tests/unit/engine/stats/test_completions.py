"""Completion-level statistics: identical completions, equal reward vectors, silence split by cause, lengths.

Every series against a loop over steps and groups, on the statistics cases with completions attached (identical
completions in groups whose rewards differ, completions shared by two groups of a step, null texts, NaN
lengths) and on hand-built chunks (NaN rewards, groups of one, a chunk without text); the dense and general
paths agree exactly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from collapse_doctor.core.series import SeriesBuilder
from collapse_doctor.engine.advantages import compute_advantages
from collapse_doctor.engine.stats import SILENT_SPAN, ChunkInput, CompletionRows, dense_group_size, step_statistics
from tests.helpers.stats_cases import LAYOUTS, Case, make_case

ALGORITHMS = ("grpo", "gdpo")
TEXT = (
    "completion_groups",
    "identical_completion_groups",
    "distinct_completion_share",
    "equal_reward_distinct_groups",
    *(
        f"{key}_{a}"
        for a in ALGORITHMS
        for key in ("silent_identical_groups", "identical_pass_groups", "identical_fail_groups")
    ),
)
"""The series that need completion text (NaN without)."""
LENGTHS = ("completion_length_mean", "completion_length_max")
LENGTH_MOMENTS = ("length_reward_sxy", "length_sxx", "length_reward_syy", "length_groups")
"""Per channel ``[S, C]``: the within-group co-movement of each reward with the completion length."""
NAMES = (*TEXT, *LENGTHS, "equal_reward_groups", *(f"silent_cancel_groups_{a}" for a in ALGORITHMS))


def reference(case: Case, codes: np.ndarray | None, lengths: np.ndarray | None) -> dict[str, np.ndarray]:
    """The loop: per step, per group, over the valid rows."""
    S = case.num_steps
    out = {name: np.zeros(S) for name in NAMES}
    out |= {name: np.zeros((S, case.num_channels)) for name in LENGTH_MOMENTS}
    for s in range(S):
        valid_rows = np.flatnonzero((case.step == s) & case.valid)
        with np.errstate(all="ignore"):
            step_max = np.nanmax(case.rewards[valid_rows], axis=0) if len(valid_rows) else None
            step_min = np.nanmin(case.rewards[valid_rows], axis=0) if len(valid_rows) else None
        for rows in case.groups(s):
            valid = rows[case.valid[rows]]
            if len(valid) < 2:
                continue
            r = case.rewards[valid]
            nan = np.isnan(r)
            equal = all(
                nan[:, k].all() or (not nan[:, k].any() and len(set(r[:, k].tolist())) == 1)
                for k in range(case.num_channels)
            )
            known = codes is not None and bool((codes[valid] >= 0).all())  # a null text (-1) is not logged
            identical = known and len(set(codes[valid].tolist())) == 1
            out["completion_groups"][s] += known
            out["identical_completion_groups"][s] += identical
            out["equal_reward_groups"][s] += equal
            out["equal_reward_distinct_groups"][s] += equal and known and not identical
            present = [k for k in range(case.num_channels) if not nan[:, k].all()]
            at_top = all(not nan[:, k].any() and (r[:, k] == step_max[k]).all() for k in present)
            at_bottom = all(not nan[:, k].any() and (r[:, k] == step_min[k]).all() for k in present)
            for a in ALGORITHMS:
                adv = getattr(case, a)[valid]
                if np.ptp(adv) < SILENT_SPAN:
                    out[f"silent_identical_groups_{a}"][s] += identical
                    out[f"identical_pass_groups_{a}"][s] += identical and at_top
                    out[f"identical_fail_groups_{a}"][s] += identical and at_bottom
                    out[f"silent_cancel_groups_{a}"][s] += not equal and not identical
        if codes is not None:
            logged = [c for c in codes[valid_rows].tolist() if c >= 0]
            out["distinct_completion_share"][s] = len(set(logged)) / len(logged) if logged else np.nan
        for rows in case.groups(s):
            for k in range(case.num_channels):
                if lengths is None:
                    continue
                both = [
                    i for i in rows if case.valid[i] and np.isfinite(case.rewards[i, k]) and np.isfinite(lengths[i])
                ]
                if len(both) < 2:
                    continue
                x = np.array([lengths[i] for i in both], dtype=np.float64)
                y = np.array([case.rewards[i, k] for i in both], dtype=np.float64)
                out["length_reward_sxy"][s, k] += float(((x - x.mean()) * (y - y.mean())).sum())
                out["length_sxx"][s, k] += float(((x - x.mean()) ** 2).sum())
                out["length_reward_syy"][s, k] += float(((y - y.mean()) ** 2).sum())
                out["length_groups"][s, k] += float(((x - x.mean()) ** 2).sum() > 0)
        known = [] if lengths is None else [x for x in lengths[valid_rows].tolist() if not np.isnan(x)]
        out["completion_length_mean"][s] = np.mean(known) if known else np.nan
        out["completion_length_max"][s] = max(known) if known else np.nan
    if codes is None:
        for name in TEXT:
            out[name][:] = np.nan
    if lengths is None:
        for name in LENGTH_MOMENTS:
            out[name][:] = np.nan
    return out


def with_completions(case: Case, codes: np.ndarray | None, lengths: np.ndarray | None) -> Case:
    return Case(dataclasses.replace(case.chunk, completions=CompletionRows.of(codes, lengths)), case.allow_dense)


def with_cancelling_group(case: Case, group: int = 4) -> Case:
    """The case with channels that cancel under GRPO in ``group``: ``b = 2 - 2a`` (weights 1 and 0.5), the third
    channel constant, so the totals are equal while two channels vary."""
    rewards = case.rewards.copy()
    rows = np.flatnonzero(case.group == group)
    rewards[rows, 0] = np.arange(len(rows)) % 2
    rewards[rows, 1] = 2 - 2 * rewards[rows, 0]
    rewards[rows, 2] = 0.25
    c = case.chunk
    r = torch.from_numpy(rewards.astype(np.float32))
    adv = compute_advantages(r, c.group_index, weights=c.weights, step_index=c.step_index)
    return Case(dataclasses.replace(c, rewards=r, advantages=adv), case.allow_dense)


def made_up_completions(case: Case, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Codes with every case of interest: groups with one completion (some of them with rewards that differ),
    groups with equal rewards but different completions, a completion shared by two groups of a step, null
    texts (-1), texts repeated across steps; lengths with NaN."""
    rng = np.random.default_rng(seed)
    n = len(case.group)
    codes = rng.integers(0, 40, n)  # many repeats within a step
    groups = np.unique(case.group)
    for k, g in enumerate(groups):
        rows = case.group == g
        if k % 3 == 0:
            codes[rows] = 1000 + int(g) % 4  # one completion per group; groups of a step share some
        elif k % 7 == 1:
            codes[rows] = -1  # null texts: not logged (never identical, outside the support)
    lengths = rng.integers(1, 300, n).astype(float)
    lengths[rng.random(n) < 0.1] = np.nan
    return codes, lengths


@pytest.mark.parametrize("layout", LAYOUTS)
def test_completions_match_the_loop(layout: str) -> None:
    base = with_cancelling_group(make_case(layout, logged=True))
    codes, lengths = made_up_completions(base)
    case = with_completions(base, codes, lengths)
    expected = reference(case, codes, lengths)
    # the cases exercise what they are meant to: one completion with rewards that differ (impossible in practice,
    # counted all the same), equal rewards with different completions, silent groups of either cause
    assert (expected["identical_completion_groups"] > expected["equal_reward_groups"]).any()
    assert expected["equal_reward_distinct_groups"].sum() > 0
    assert expected["silent_identical_groups_grpo"].sum() > 0 and expected["silent_cancel_groups_grpo"].sum() > 0
    assert expected["length_groups"].sum() > 0 and np.abs(expected["length_reward_sxy"]).sum() > 0
    for name, want in expected.items():
        tolerance = 1e-9 if name in LENGTH_MOMENTS else 1e-12  # float sums in another order
        np.testing.assert_allclose(case.stats[name], want, rtol=tolerance, atol=1e-9, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("known", ["none", "lengths", "codes"])
def test_without_text_or_lengths_the_series_are_nan(layout: str, known: str) -> None:
    base = make_case(layout)
    codes, lengths = made_up_completions(base)
    codes_or_none = codes if known == "codes" else None
    lengths_or_none = lengths if known == "lengths" else None
    case = with_completions(base, codes_or_none, lengths_or_none)
    expected = reference(case, codes_or_none, lengths_or_none)
    for name in TEXT:
        assert np.isnan(case.stats[name]).all() == (known != "codes"), name
    for name in (*LENGTHS, *LENGTH_MOMENTS):
        assert np.isnan(case.stats[name]).all() == (known != "lengths"), name
    for name, want in expected.items():
        tolerance = 1e-9 if name in LENGTH_MOMENTS else 1e-12  # float sums in another order
        np.testing.assert_allclose(case.stats[name], want, rtol=tolerance, atol=1e-9, equal_nan=True, err_msg=name)


def test_dense_and_general_paths_agree_exactly() -> None:
    dense = with_cancelling_group(make_case("dense", logged=True))
    general = with_cancelling_group(make_case("dense-as-general", logged=True))
    codes, lengths = made_up_completions(dense)
    a, b = with_completions(dense, codes, lengths), with_completions(general, codes, lengths)
    assert a.allow_dense and dense_group_size(a.chunk) == 8 and not b.allow_dense
    assert list(a.stats) == list(b.stats)
    for name in NAMES:
        np.testing.assert_array_equal(a.stats[name], b.stats[name], err_msg=name)


def _one_step(rewards: list[list[float]], group: list[int], codes: list[int] | None) -> dict[str, float]:
    r = torch.tensor(rewards, dtype=torch.float32)
    gi, si = torch.tensor(group), torch.zeros(len(group), dtype=torch.int64)
    w = torch.ones(r.shape[1])
    adv = compute_advantages(r, gi, weights=w, step_index=si)
    rows = CompletionRows.of(None if codes is None else np.array(codes), None)
    stats = step_statistics(ChunkInput(r, gi, si, w, adv, int(gi.max()) + 1, 1, None, rows))
    return {k: float(v[0]) for k, v in stats.items() if v.ndim == 1}


NAN = float("nan")
# group 0: one completion, equal rewards (a collapsed policy); group 1: complementary channels, four different
# completions (the channels cancel); group 2: equal rewards, two completions; group 3: one completion, rewards
# that differ; group 4: a group of one.
HAND_REWARDS = [
    *([[1.0, 0.0]] * 4),
    [1.0, 0.0],
    [0.0, 1.0],
    [0.0, 1.0],
    [1.0, 0.0],
    *([[0.5, 0.5]] * 3),
    [1.0, 0.0],
    [0.0, 0.0],
    [0.0, 1.0],
    [1.0, 1.0],
]
HAND_GROUPS = [0] * 4 + [1] * 4 + [2] * 3 + [3] * 3 + [4]
HAND_CODES = [7] * 4 + [1, 2, 3, 4] + [5, 5, 6] + [7] * 3 + [8]


def test_hand_counts() -> None:
    st = _one_step(HAND_REWARDS, HAND_GROUPS, HAND_CODES)
    assert st["eligible_groups"] == st["completion_groups"] == 4
    assert st["identical_completion_groups"] == 2  # groups 0 and 3
    assert st["equal_reward_groups"] == 2  # groups 0 and 2
    assert st["equal_reward_distinct_groups"] == 1  # group 2
    assert st["distinct_completion_share"] == 8 / 15  # codes 1..8 (7 shared by groups 0 and 3)
    for a in ALGORITHMS:
        assert st[f"silent_groups_{a}"] == 3  # 0, 1 (totals tie; z-scores cancel), 2
        assert st[f"silent_identical_groups_{a}"] == 1  # group 0
        assert st[f"silent_cancel_groups_{a}"] == 1  # group 1
    without = _one_step(HAND_REWARDS, HAND_GROUPS, None)
    assert np.isnan([without[n] for n in TEXT]).all()
    assert without["equal_reward_groups"] == 2 and without["silent_cancel_groups_grpo"] == 1


def test_nan_rewards_and_rows_without_reward() -> None:
    # Group 0: channel b is NaN on every row and a constant: equal vectors. Group 1: b NaN on one row only: the
    # NaN pattern differs, not equal. Group 2: a row without any reward (left out) and two equal valid rows with
    # one completion. Group 3: one valid row and one without reward (a group of one).
    rewards = [
        [1.0, NAN],
        [1.0, NAN],
        [1.0, 0.5],
        [1.0, NAN],
        [NAN, NAN],
        [0.0, 1.0],
        [0.0, 1.0],
        [1.0, 1.0],
        [NAN, NAN],
    ]
    group = [0, 0, 1, 1, 2, 2, 2, 3, 3]
    codes = [1, 2, 3, 3, 9, 4, 4, 5, 5]
    st = _one_step(rewards, group, codes)
    assert st["valid_rows"] == 7 and st["eligible_groups"] == st["completion_groups"] == 3
    assert st["equal_reward_groups"] == 2  # groups 0 and 2
    assert st["identical_completion_groups"] == 2  # groups 1 and 2 (the row without reward is left out)
    assert st["equal_reward_distinct_groups"] == 1  # group 0
    assert st["distinct_completion_share"] == 5 / 7  # 1, 2, 3, 4, 5 over the valid rows


def test_a_step_without_text_is_nan_next_to_steps_with_text() -> None:
    # Chunks of one run, one with completion codes and one without (merged as the scan merges them).
    with_text = with_completions(make_case("dense"), *made_up_completions(make_case("dense")))
    without = make_case("messy")
    builder = SeriesBuilder(("a", "b", "c"), [("a", "b"), ("a", "c"), ("b", "c")])
    builder.add(np.arange(with_text.num_steps), with_text.stats)
    builder.add(np.arange(without.num_steps) + 100, without.stats)
    series = builder.build()
    assert set(with_text.stats) == set(without.stats)
    for name in TEXT + LENGTHS:
        assert not np.isnan(series[name][: with_text.num_steps]).all(), name
        assert np.isnan(series[name][with_text.num_steps :]).all(), name
    assert not np.isnan(series["equal_reward_groups"]).any()


IDENTICAL_PER_STEP = [0, 1, 3, 2, 6]
"""Groups with one completion per step of the end-to-end runs (of six groups of four)."""


def _completions(steps: int = 5, groups: int = 6, size: int = 4) -> list[str]:
    texts = []
    for s in range(steps):
        for g in range(groups):
            same = g < IDENTICAL_PER_STEP[s]
            # identical groups of a step share their text with each other, the others repeat across steps
            texts += [f"the answer is {s if same else g}-{'x' if same else m}" for m in range(size)]
    return texts


def test_scan_counts_the_identical_groups_of_a_parquet_run(tmp_path: Path) -> None:
    from collapse_doctor.pipeline.scan import diagnose
    from tests.helpers.tables import make_table

    table = make_table(steps=5, groups=6, group_size=4).drop_columns(["completion"])
    table = table.append_column("completion", pa.array(_completions()))
    pq.write_table(table, tmp_path / "run.parquet")
    series = diagnose([tmp_path / "run.parquet"]).series
    assert series["identical_completion_groups"].tolist() == IDENTICAL_PER_STEP
    assert series["completion_groups"].tolist() == [6.0] * 5
    lengths = np.array([len(t) for t in _completions()], dtype=float).reshape(5, 24)
    np.testing.assert_allclose(series["completion_length_mean"], lengths.mean(axis=1))
    pq.write_table(table.drop_columns(["completion"]), tmp_path / "plain.parquet")
    plain = diagnose([tmp_path / "plain.parquet"]).series  # no text: NaN, not missing
    assert np.isnan(plain["identical_completion_groups"]).all() and np.isnan(plain["completion_length_max"]).all()
    np.testing.assert_array_equal(plain["equal_reward_groups"], series["equal_reward_groups"])


def test_scan_counts_the_identical_groups_of_a_trl_run(tmp_path: Path) -> None:
    from collapse_doctor.pipeline.scan import diagnose

    rng = np.random.default_rng(0)
    texts = _completions()
    folder = tmp_path / "out" / "completions"
    folder.mkdir(parents=True)
    for s in range(5):
        rows = slice(24 * s, 24 * (s + 1))
        pq.write_table(
            pa.table(
                {
                    "step": np.full(24, s + 1),
                    "prompt": [f"question {s}-{g}" for g in range(6) for _ in range(4)],
                    "completion": texts[rows],
                    "format_reward": (rng.random(24) < 0.5).astype(float),
                    "accuracy_reward": rng.random(24),
                    "advantage": np.zeros(24),
                }
            ),
            folder / f"completions_{s + 1:05d}.parquet",
        )
    series = diagnose([tmp_path / "out"]).series
    assert series.steps.tolist() == [1, 2, 3, 4, 5]
    assert series["identical_completion_groups"].tolist() == IDENTICAL_PER_STEP
    distinct = [len(set(texts[24 * s : 24 * (s + 1)])) / 24 for s in range(5)]
    np.testing.assert_allclose(series["distinct_completion_share"], distinct)
