"""Channel weights inferred from logged advantages: the solver on forms built by a numpy loop (wfit_reference).

TRL's advantages (float32, as TRL logs them) from known weights; the solver must recover the weights to 1e-4,
refuse weights that do not reproduce them, and say which channel's weight is not identifiable.
"""

from __future__ import annotations

import glob
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.series import RunSeries
from collapse_doctor.judge.weights import (
    FIT_TOLERANCE,
    _quadratic_form,
    _relative,
    infer_weights,
    weight_inference,
)
from tests.helpers.paths import ROOT as REPO_ROOT
from tests.unit.judge.wfit_reference import trl_advantages, wfit_series

CORPUS = REPO_ROOT / "tests" / "data" / "trl_corpus"


def _run(
    weights: tuple[float, ...],
    *,
    algo: str = "grpo",
    scale: str = "group",
    steps: int = 8,
    groups: int = 16,
    size: int = 8,
    seed: int = 0,
    channels: list[str] | None = None,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Steps of (rewards, group, logged): a binary channel, a 0-5 continuous one, more continuous ones if asked."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        n = groups * size
        cols = [(rng.random(n) < 0.4).astype(float), 5 * rng.random(n)]
        cols += [rng.random(n) for _ in range(len(weights) - 2)]
        rewards = np.stack(cols[: len(weights)], axis=1)
        group = np.repeat(np.arange(groups), size)
        logged = trl_advantages(rewards, group, weights, algo, scale).astype(np.float32).astype(np.float64)
        out.append((rewards, group, logged))
    return out


NAMES = ("digits", "detail", "third", "fourth")


@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_recovers_trl_weights(algo: str) -> None:
    series = wfit_series(_run((1.0, 0.2), algo=algo), NAMES[:2])
    fit = infer_weights(series, NAMES[:2])
    assert fit is not None and fit.algorithm == algo
    assert fit.weights["digits"] == 1.0
    assert fit.weights["detail"] == pytest.approx(0.2, abs=1e-4)
    assert fit.residual < 1e-12  # float32 rounding of exact advantages
    assert fit.configured_residual > 1e-2  # equal weights are far off


@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_equal_weights_do_not_fit_weighted_advantages(algo: str) -> None:
    series = wfit_series(_run((1.0, 0.2), algo=algo), NAMES[:2])
    matrix, norm = _quadratic_form(series, algo, NAMES[:2])  # type: ignore[misc]
    right = _relative(matrix, np.array([1.0, 0.2]), norm)
    wrong = _relative(matrix, np.array([1.0, 1.0]), norm)
    near = _relative(matrix, np.array([1.0, 0.21]), norm)
    assert right < 1e-12 < FIT_TOLERANCE < near < wrong


def test_advantages_from_equal_weights_need_no_inference() -> None:
    found = weight_inference(wfit_series(_run((1.0, 1.0)), NAMES[:2]), NAMES[:2])
    assert found.fit is None
    assert "configured weights reproduce" in found.reason


def test_configured_weights_are_what_the_fit_is_judged_against() -> None:
    series = wfit_series(_run((1.0, 0.2)), NAMES[:2])
    assert infer_weights(series, NAMES[:2], {"digits": 1.0, "detail": 0.2}) is None
    assert infer_weights(series, NAMES[:2], {"digits": 5.0, "detail": 1.0}) is None  # the same ratio
    assert infer_weights(series, NAMES[:2], {"digits": 1.0, "detail": 0.5}) is not None


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_grpo_fit_does_not_depend_on_the_scaling(scale: str) -> None:
    fit = infer_weights(wfit_series(_run((1.0, 0.2), scale=scale), NAMES[:2]), NAMES[:2])
    assert fit is not None and fit.algorithm == "grpo"
    assert fit.weights["detail"] == pytest.approx(0.2, abs=1e-4)


def test_three_channels_a_zero_and_a_negative_weight() -> None:
    fit = infer_weights(wfit_series(_run((0.0, 1.0, -0.5)), NAMES[:3]), NAMES[:3])
    assert fit is not None
    assert [fit.weights[c] for c in NAMES[:3]] == pytest.approx([0.0, 1.0, -0.5], abs=1e-4)


def test_four_channels_scaled_to_a_largest_weight_of_one() -> None:
    fit = infer_weights(wfit_series(_run((2.0, 0.4, 1.0, 0.1), algo="gdpo"), NAMES), NAMES)
    assert fit is not None and fit.algorithm == "gdpo"
    assert [fit.weights[c] for c in NAMES] == pytest.approx([1.0, 0.2, 0.5, 0.05], abs=1e-4)


def test_ragged_groups_and_sparse_rewards() -> None:
    rng = np.random.default_rng(4)
    steps = []
    for _ in range(6):
        sizes = rng.integers(2, 9, size=12)
        group = np.repeat(np.arange(len(sizes)), sizes)
        n = len(group)
        rewards = np.stack([(rng.random(n) < 0.5).astype(float), 5 * rng.random(n)], axis=1)
        rewards[rng.random(n) < 0.3, 1] = np.nan  # TRL sums a None as 0 under GRPO
        steps.append((rewards, group, trl_advantages(rewards, group, (1.0, 0.2)).astype(np.float32).astype(float)))
    fit = infer_weights(wfit_series(steps, NAMES[:2]), NAMES[:2])
    assert fit is not None and fit.weights["detail"] == pytest.approx(0.2, abs=1e-4)


def test_a_channel_that_never_varies_is_not_identifiable() -> None:
    steps = []
    for rewards, group, _ in _run((1.0, 0.2, 1.0)):
        flat = rewards.copy()
        flat[:, 2] = 3.0
        steps.append((flat, group, trl_advantages(flat, group, (1.0, 0.2, 1.0))))
    found = weight_inference(wfit_series(steps, NAMES[:3]), NAMES[:3])
    assert found.fit is None
    assert found.unidentified == ("third",)
    assert "third never varies within a group" in found.reason
    # Without the rel_gain series the form itself shows it: third's weight leaves it flat.
    found = weight_inference(wfit_series(steps, NAMES[:3], rel_gain=False), NAMES[:3])
    assert found.fit is None and found.unidentified == ("third",)
    assert "weight ratio of third" in found.reason


def test_an_affine_copy_leaves_the_weights_unidentified() -> None:
    steps = []
    for rewards, group, _ in _run((1.0, 1.0, 1.0)):
        copy = np.column_stack([rewards[:, 1], 2 * rewards[:, 1] + 1, rewards[:, 2]])
        steps.append((copy, group, trl_advantages(copy, group, (1.0, 0.5, 1.0))))
    names = ("quality", "quality_x2", "other")
    found = weight_inference(wfit_series(steps, names), names)
    assert found.fit is None
    assert {"quality", "quality_x2"} <= set(found.unidentified)


def test_weights_that_cancel_an_affine_copy_are_not_a_fit() -> None:
    """GDPO advantages of (quality, 2 quality + 1, other): under GRPO only quality - quality_x2 / 2 "fits"
    (its D w is 0, on every line); that is no fit, and GDPO's own weights are not identifiable."""
    steps = []
    for rewards, group, _ in _run((1.0, 1.0, 1.0), algo="gdpo"):
        copy = np.column_stack([rewards[:, 1], 2 * rewards[:, 1] + 1, rewards[:, 2]])
        steps.append((copy, group, trl_advantages(copy, group, (1.0, 0.5, 1.0), "gdpo")))
    names = ("quality", "quality_x2", "other")
    series = wfit_series(steps, names)
    found = weight_inference(series, names)
    assert found.fit is None


def test_unrelated_advantages_fit_nothing() -> None:
    rng = np.random.default_rng(9)
    steps = [(r, g, rng.standard_normal(len(g))) for r, g, _ in _run((1.0, 0.2))]
    found = weight_inference(wfit_series(steps, NAMES[:2]), NAMES[:2])
    assert found.fit is None
    assert found.reason.startswith("no weights reproduce the logged advantages")
    assert all(r > 1e-2 for r in found.residuals.values())


def test_no_series_or_one_channel() -> None:
    assert weight_inference(RunSeries(np.arange(3), ("a", "b"), [("a", "b")]), ("a", "b")).reason.startswith(
        "no logged advantage"
    )
    one = wfit_series(_run((1.0, 0.2)), NAMES[:2])
    assert infer_weights(RunSeries(one.steps, ("a",), [], {"wfit_grpo_diag": np.ones((8, 1))}), ("a",)) is None


def _corpus_run(name: str) -> tuple[RunSeries, tuple[str, ...], dict]:  # type: ignore[type-arg]
    config = next(r for r in json.loads((CORPUS / "manifest.json").read_text())["runs"] if r["run"] == name)
    size = config["trl_config"]["num_generations"]
    steps = []
    for path in sorted(glob.glob(str(CORPUS / name / "completions" / "*.parquet"))):
        table = pq.read_table(path)
        channels = tuple(c for c in table.column_names if c not in ("step", "prompt", "completion", "advantage"))
        rewards = np.stack([table[c].to_numpy(zero_copy_only=False).astype(float) for c in channels], axis=1)
        logged = table["advantage"].to_numpy().astype(float)
        steps.append((rewards, np.arange(len(logged)) // size, logged))
    return wfit_series(steps, channels), channels, config


@pytest.mark.parametrize("name", ["weighted-grpo-s0", "weighted-grpo-s1", "weighted-gdpo-s0", "weighted-gdpo-s1"])
def test_real_trl_weighted_runs(name: str) -> None:
    """TRL 1.16 with reward_weights [1.0, 0.2] (kept only in the deleted training_args.bin)."""
    series, channels, _ = _corpus_run(name)
    fit = infer_weights(series, channels)
    assert fit is not None
    assert fit.algorithm == ("gdpo" if "-gdpo-" in name else "grpo")
    assert fit.weights == pytest.approx({"digits": 1.0, "detail": 0.2}, abs=1e-4)
    assert fit.residual < 1e-12 and fit.configured_residual > 0.05


@pytest.mark.parametrize(
    "name", ["healthy-two-grpo-s0", "drowning-batch-grpo-s0", "sparse-gdpo-s0", "collinear-grpo-s0"]
)
def test_real_trl_equal_weight_runs_infer_nothing(name: str) -> None:
    series, channels, _ = _corpus_run(name)
    assert infer_weights(series, channels) is None


def test_weights_are_reported_in_the_order_asked() -> None:
    series = wfit_series(_run((1.0, 0.2, 0.5)), NAMES[:3])
    fit = infer_weights(series, ("third", "digits", "detail"))
    assert fit is not None and list(fit.weights) == ["third", "digits", "detail"]
    assert fit.weights == pytest.approx({"digits": 1.0, "detail": 0.2, "third": 0.5}, abs=1e-4)
    with pytest.raises(ValueError, match="not the series' channels"):
        infer_weights(series, ("digits", "detail"))
