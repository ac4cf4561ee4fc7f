"""The advantage estimators trainers use, as a catalogue: what a logged advantage column is compared with.

Each :class:`EstimatorSpec` names one estimator under one trainer's conventions (baseline, std and its ddof,
epsilon, groups of one, token or sample weighting). Its advantages are recomputed by
:mod:`collapse_doctor.engine.estimators` (the function of the same ``key``) from the logged rewards, and compared
with the logged column per step (series ``logged_mae_<key>``). The one that matches names the run's estimator:
``algorithm`` (verl's ``algorithm.adv_estimator`` name where verl has one) and ``label`` (the variant, for
``run.algorithm_source``). A run is then judged under its ``family``: the recomputation (GRPO or GDPO) whose
statistics hold for it (which groups are silent, which reward vectors tie, which channel decides a sign).

The catalogue holds no arithmetic; docs/input-formats.md ("Advantage estimators") is generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["grpo", "gdpo"]

MATCH_MAE = 0.01
"""Logged advantages within this mean absolute difference of an estimator's recomputation are that estimator."""
COMPLETION_LENGTH = "completion_length"
"""The column a token-weighted estimator needs (response tokens per row)."""


@dataclass(frozen=True)
class EstimatorSpec:
    """One advantage estimator and the trainer code whose conventions it follows."""

    key: str
    """Series suffix (``logged_mae_<key>``) and the function's name in :mod:`collapse_doctor.engine.estimators`."""
    algorithm: str
    """``run.algorithm`` when the logged advantages match it: verl's ``adv_estimator`` name where one exists."""
    label: str
    """What ``run.algorithm_source`` says matched (the variant)."""
    family: Family
    """The recomputation whose statistics judge a run trained with it."""
    formula: str
    """The advantage of row i, in one line."""
    source: str
    """The trainer code it reproduces."""
    needs: tuple[str, ...] = ()
    """Columns without which it cannot be recomputed (then it is reported as not checked, never as a mismatch)."""
    group_baseline: bool = True
    """A group whose rewards are all equal gets advantage 0 (false: the baseline is the batch's, not the group's)."""
    sparse: bool = False
    """Zero by design for all but one row per group (pass@k): silence it intends, not a collapse."""
    shape_names: bool = False
    """Without the column it needs, a fit up to what that column decides names this estimator: the shape holds no
    rescaled GRPO or GDPO (OPO: a per-group shift of the total; REINFORCE++: a per-step line in it). False where
    it does (a per-step line in the centred total or in the fused z-scores is also GRPO or GDPO under other
    weights): then a fit only keeps the estimator possible, and a mismatch is reported as not checked."""


ESTIMATORS: tuple[EstimatorSpec, ...] = (
    EstimatorSpec(
        "grpo",
        "grpo",
        "GRPO (scale group)",
        "grpo",
        "(t_i - mean_g) / (std_g + eps), std with ddof 1",
        "TRL GRPOTrainer (eps 1e-4, groups of one: 0); verl compute_grpo_outcome_advantage (eps 1e-6); "
        "OpenRLHF group_norm (eps 1e-9)",
    ),
    EstimatorSpec(
        "grpo_batch",
        "grpo",
        "GRPO (scale batch)",
        "grpo",
        "(t_i - mean_g) / (std_step + 1e-4)",
        "TRL GRPOTrainer scale_rewards='batch'",
    ),
    EstimatorSpec(
        "grpo_none",
        "grpo",
        "GRPO (scale none)",
        "grpo",
        "t_i - mean_g",
        "TRL scale_rewards='none' / Dr. GRPO; verl norm_adv_by_std_in_grpo=False; OpenRLHF dr_grpo",
    ),
    EstimatorSpec(
        "gdpo",
        "gdpo",
        "GDPO",
        "gdpo",
        "batch z-score over the step of sum_c w_c z_ic (z: per-channel group z-scores, eps 1e-4)",
        "TRL multi_objective_aggregation='normalize_then_sum'",
    ),
    EstimatorSpec(
        "grpo_population",
        "grpo",
        "GRPO (population std, eps 1e-8)",
        "grpo",
        "(t_i - mean_g) / (std_g + 1e-8), std with ddof 0",
        "TRL asynchronous GRPO",
    ),
    EstimatorSpec(
        "grpo_loo",
        "grpo_loo",
        "GRPO with leave-one-out baseline and std (NeMo-RL)",
        "grpo",
        "(t_i - mean_{j!=i}) / (std_{j!=i} + 1e-6) where std_{j!=i} > 0, else t_i - mean_{j!=i}; std of the "
        "others with ddof 0; groups of one: 0",
        "NeMo-RL calculate_baseline_and_std_per_prompt(leave_one_out_baseline=True), normalize_rewards=True",
    ),
    EstimatorSpec(
        "rloo",
        "rloo",
        "RLOO (verl loop)",
        "grpo",
        "n / (n - 1) * (t_i - mean_g); groups of one keep t_i",
        "verl compute_rloo_outcome_advantage",
    ),
    EstimatorSpec(
        "rloo_vectorized",
        "rloo_vectorized",
        "RLOO (verl vectorised)",
        "grpo",
        "n / (n - 1) * (t_i - mean_g); groups of one: 0",
        "verl compute_rloo_vectorized_outcome_advantage",
    ),
    EstimatorSpec(
        "rloo_normalized",
        "rloo",
        "RLOO (TRL, normalize_advantages)",
        "grpo",
        "batch z-score over the step (std ddof 1, eps 1e-4) of t_i - mean_{j!=i}; groups of one: 0, left out of the "
        "batch statistics",
        "TRL RLOOTrainer normalize_advantages=True (beta=0; without it TRL's RLOO is rloo_vectorized's formula)",
    ),
    EstimatorSpec(
        "opo",
        "opo",
        "OPO (length-weighted group baseline)",
        "grpo",
        "t_i - sum_g(len_j t_j) / sum_g(len_j); groups of one keep t_i",
        "verl compute_opo_outcome_advantage",
        needs=(COMPLETION_LENGTH,),
        shape_names=True,
    ),
    EstimatorSpec(
        "gpg",
        "gpg",
        "GPG",
        "grpo",
        "alpha * (t_i - mean_g), alpha = rows of the step / rows of the step with t != 0; groups of one keep t_i",
        "verl compute_gpg_outcome_advantage (f_norm 1)",
    ),
    EstimatorSpec(
        "grpo_passk",
        "grpo_passk",
        "GRPO pass@k (best sample only)",
        "grpo",
        "(t_max - t_second) / (std_g + 1e-6) for the group's best row, 0 for the others",
        "verl compute_grpo_passk_outcome_advantage (norm_adv_by_std_in_grpo=True)",
        sparse=True,
    ),
    EstimatorSpec(
        "reinforce_plus_plus",
        "reinforce_plus_plus",
        "REINFORCE++ (token-weighted batch whitening)",
        "grpo",
        "(t_i - m) / sqrt(v + 1e-8), m and v (Bessel-corrected) over the step's response tokens; gamma 1",
        "verl compute_reinforce_plus_plus_outcome_advantage",
        needs=(COMPLETION_LENGTH,),
        group_baseline=False,
        shape_names=True,
    ),
    EstimatorSpec(
        "reinforce_plus_plus_baseline",
        "reinforce_plus_plus_baseline",
        "REINFORCE++ with group baseline (token-weighted batch whitening)",
        "grpo",
        "token-weighted whitening over the step of t_i - mean_g (groups of one keep t_i)",
        "verl compute_reinforce_plus_plus_baseline_outcome_advantage",
        needs=(COMPLETION_LENGTH,),
    ),
    EstimatorSpec(
        "gdpo_nemo",
        "gdpo",
        "GDPO (NeMo-RL: leave-one-out per reward)",
        "gdpo",
        "batch z-score (std ddof 1, no eps) of sum_c w_c a_ic, a_ic NeMo-RL's leave-one-out GRPO advantage of reward c",
        "NeMo-RL GDPOAdvantageEstimator (use_leave_one_out_baseline, normalize_rewards)",
    ),
    EstimatorSpec(
        "gdpo_verl",
        "gdpo",
        "GDPO (verl, token-weighted batch whitening)",
        "gdpo",
        "token-weighted whitening over the step of sum_c w_c (r_ic - mean_gc) / (std_gc + 1e-6)",
        "verl compute_gdpo_outcome_advantage",
        needs=(COMPLETION_LENGTH,),
    ),
)
"""Every estimator, in the order that wins when two match equally well (the common ones first)."""

ESTIMATOR_OF: dict[str, EstimatorSpec] = {spec.key: spec for spec in ESTIMATORS}
ALGORITHMS: tuple[str, ...] = tuple(dict.fromkeys(spec.algorithm for spec in ESTIMATORS))
"""The names ``run.algorithm`` (and ``--algo``) takes, besides ``auto``."""
COUNTERFACTUAL_KEYS: tuple[str, ...] = (
    "grpo",
    "gdpo",
    "rloo",
    "grpo_loo",
    "gpg",
    "opo",
    "grpo_passk",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
)
"""The estimators ``run.counterfactuals`` compares on the same rewards: one variant per algorithm (the common
one), each with its own arithmetic (RLOO's other variants, NeMo-RL's and verl's GDPO differ from these by a scale
or an epsilon, which moves no zero, tie or sign)."""


SHORT_NAMES = {
    "grpo": "GRPO",
    "gdpo": "GDPO",
    "grpo_loo": "LOO-GRPO",
    "rloo": "RLOO",
    "rloo_vectorized": "RLOO",
    "opo": "OPO",
    "gpg": "GPG",
    "grpo_passk": "pass@k GRPO",
    "reinforce_plus_plus": "REINFORCE++",
    "reinforce_plus_plus_baseline": "REINFORCE++ (group baseline)",
}
"""How an algorithm is named in sentences and tables."""


def display_name(algorithm: str) -> str:
    """``algorithm`` as sentences name it.

    >>> display_name("reinforce_plus_plus"), display_name("grpo"), display_name("unknown")
    ('REINFORCE++', 'GRPO', 'UNKNOWN')
    """
    return SHORT_NAMES.get(algorithm, algorithm.upper())


def budget_note(algorithm: str) -> str | None:
    """What the signal budget (computed with the group rule of its family) leaves out under ``algorithm``, or None.

    >>> budget_note("grpo") is None
    True
    """
    if not has_group_baseline(algorithm):
        return (
            f"{algorithm} has a batch baseline: a group of equal rewards still gets advantages, so no group is "
            "silent by its rewards alone; the shares are GRPO's counterfactual on the same rewards"
        )
    if is_sparse(algorithm):
        return (
            f"{algorithm} gives an advantage only to each group's best rollout (the others get 0 by design, not "
            "counted here) and also silences groups whose two best rollouts tie"
        )
    return None


def family_of(algorithm: str) -> Family:
    """The recomputation a run under ``algorithm`` is judged with: GDPO for the GDPO estimators, else GRPO.

    >>> family_of("rloo"), family_of("gdpo"), family_of("unknown")
    ('grpo', 'gdpo', 'grpo')
    """
    return "gdpo" if algorithm == "gdpo" else "grpo"


def specs_of(algorithm: str) -> tuple[EstimatorSpec, ...]:
    """The catalogue's variants of ``algorithm`` (empty for ``unknown``).

    >>> [spec.key for spec in specs_of("gdpo")]
    ['gdpo', 'gdpo_nemo', 'gdpo_verl']
    """
    return tuple(spec for spec in ESTIMATORS if spec.algorithm == algorithm)


def has_group_baseline(algorithm: str) -> bool:
    """Whether a group of equal rewards gets no advantage under ``algorithm`` (false for REINFORCE++).

    >>> has_group_baseline("grpo"), has_group_baseline("reinforce_plus_plus")
    (True, False)
    """
    return all(spec.group_baseline for spec in specs_of(algorithm))


def is_sparse(algorithm: str) -> bool:
    """Whether ``algorithm`` gives all but one row per group advantage 0 by design (pass@k).

    >>> is_sparse("grpo_passk"), is_sparse("grpo")
    (True, False)
    """
    return any(spec.sparse for spec in specs_of(algorithm))


def estimator_table() -> str:
    """The catalogue as the Markdown table docs/input-formats.md carries (a test keeps the two equal)."""
    lines = [
        "| `run.algorithm` | variant (`logged_mae_<key>`) | advantage of row i | reproduces | needs | judged as |",
        "|---|---|---|---|---|---|",
    ]
    for spec in ESTIMATORS:
        needs = ", ".join(f"`{column}`" for column in spec.needs) or "-"
        judged = spec.family.upper() + ("" if spec.group_baseline else " (no group baseline: CD102 skipped)")
        judged += " (sparse by design)" if spec.sparse else ""
        lines.append(
            f"| `{spec.algorithm}` | {spec.label} (`{spec.key}`) | {spec.formula} | {spec.source} | {needs} "
            f"| {judged} |"
        )
    return "\n".join(lines) + "\n"
