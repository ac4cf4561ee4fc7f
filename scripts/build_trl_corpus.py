#!/usr/bin/env python
"""Build ``tests/data/trl_corpus/``: real TRL ``GRPOTrainer`` runs with expected diagnoses.

Every run is TRL's own output directory (``log_completions=True``, ``report_to="tensorboard"``, one
checkpoint), written by ``trl.GRPOTrainer`` training a tiny randomly initialised Llama on CPU, then
pruned to the logs: ``completions/completions_*.parquet``, ``runs/<date>_<host>/events*`` and
``checkpoint-N/trainer_state.json`` (model weights, optimizer state, tokenizer files,
``training_args.bin`` and the model card are deleted).

The reward functions are deterministic functions of the completion text (and the prompt's answer),
chosen so that their distribution under a near-uniform policy can be worked out by hand; the expected
diagnosis of each run (``expected()`` below, written into ``manifest.json``) comes from that
arithmetic, never from collapse-doctor. After each run the script measures the reward statistics
from the completions tables with its own numpy code (``measure_run``) and checks them against the
design (``design_checks``: channel states, signal budget, ``EXTRA_CHECKS``): a run whose rewards do not
behave as designed fails the build (exit code 1). ``tests/data/trl_corpus/README.md`` is written by hand
and is left in place by a rebuild.

Nothing here imports ``collapse_doctor``. Usage::

    .venv/bin/python scripts/build_trl_corpus.py                       # every run -> tests/data/trl_corpus
    .venv/bin/python scripts/build_trl_corpus.py --only complementary  # one scenario (both algos, both seeds)
    .venv/bin/python scripts/build_trl_corpus.py --out /tmp/corpus --jobs 2
    .venv/bin/python scripts/build_trl_corpus.py --merge-from /tmp/corpus   # add /tmp/corpus's runs (no training)

``--out`` into an empty directory writes a manifest of just the runs built; ``--merge-from DIR`` then copies DIR's
runs into ``--out`` (default tests/data/trl_corpus) and adds their entries to its manifest, leaving the entries
already there unchanged (a name already there is an error).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "trl_corpus"
SEEDS = (0, 1)
STEPS = 20
PROMPTS_PER_STEP = 8
LEARNING_RATE = 1e-3
"""Small on purpose: the policy stays near its random initialisation, so the reward statistics
(and the expectations derived from them) hold over the whole run."""
MAX_COMPLETION_LENGTH = 8
ZERO_TOL = 1e-6
"""An advantage with |A| <= ZERO_TOL counts as zero (TRL's exact zeros, and GDPO's ~1e-8 residues)."""
AGGREGATION = {"grpo": "sum_then_normalize", "gdpo": "normalize_then_sum"}

# --------------------------------------------------------------------------------------------------
# Tokenizer and model (built in code, nothing downloaded)
# --------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
DIGITS = "0123456789"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPT_ONLY = "+="
"""Characters that prompts use and generation never produces (suppressed)."""
VISIBLE = DIGITS + LETTERS
"""The 36 characters a completion is made of: with EOS, 37 tokens the policy samples from."""
LOW = frozenset("01234" + "abcdefghijklm")
"""Half of the digits and half of the letters: 'is low' is independent of 'is a digit' (uniform case)."""
EVEN = frozenset("02468" + "acegikmoqsuwy")
"""The other split of the 36 characters into two halves of 18, independent of LOW and of 'is a digit'."""
SPARSE_TRIGGER = frozenset("wxyz")


def build_tokenizer() -> Any:
    """One token per character (digits, a-z, '+', '='), plus pad/bos/eos/unk; decodes without spaces.

    The demo's tokenizer (collapse_doctor.retrain.demo) has no letters; the scenarios need them, so the
    corpus builds its own with the same recipe (tokenizers WordLevel + PreTrainedTokenizerFast).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *VISIBLE, *PROMPT_ONLY))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_model(tokenizer: Any, seed: int) -> Any:
    """A randomly initialised 2-layer Llama (hidden 32, ~20k parameters): a near-uniform policy."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


PREFIT_LR = 1e-2
PREFIT_BATCH = 32
PREFIT_MAX_CHARS = 3


def prefit(model: Any, tokenizer: Any, steps: int, seed: int) -> dict[str, float]:
    """Fit the random model briefly by cross-entropy on 'a+b=' + 1-3 random characters + EOS (answer tokens only).

    The answer characters are uniform over the 36 VISIBLE ones and independent of the prompt, so the fitted
    policy keeps a near-uniform choice of characters (high entropy, groups of different completions) but
    learns to end a completion with EOS after 1-3 characters on its own instead of running into
    max_completion_length. Deterministic (its own torch generator, seeded). Returns the first and last loss.
    """
    import torch

    rows = prompt_rows()
    gen = torch.Generator().manual_seed(10_000 + seed)
    ids = {ch: tokenizer.convert_tokens_to_ids(ch) for ch in (*VISIBLE, *PROMPT_ONLY)}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=PREFIT_LR)
    model.train()
    losses = []
    for _ in range(steps):
        seqs, labels = [], []
        picks = torch.randint(len(rows), (PREFIT_BATCH,), generator=gen).tolist()
        lengths = torch.randint(1, PREFIT_MAX_CHARS + 1, (PREFIT_BATCH,), generator=gen).tolist()
        for row, k in zip(picks, lengths, strict=True):
            prompt = [ids[ch] for ch in rows[row]["prompt"]]
            answer = [ids[VISIBLE[i]] for i in torch.randint(len(VISIBLE), (k,), generator=gen).tolist()] + [eos]
            seqs.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        width = max(map(len, seqs))
        input_ids = torch.tensor([q + [pad] * (width - len(q)) for q in seqs])
        mask = torch.tensor([[1] * len(q) + [0] * (width - len(q)) for q in seqs])
        target = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    model.eval()
    return {"first_loss": losses[0], "last_loss": losses[-1]}


def prompt_rows() -> list[dict[str, Any]]:
    """The 55 prompts 'a+b=' with a + b <= 9 and their one-digit answer."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10) if a + b <= 9]


# --------------------------------------------------------------------------------------------------
# Reward primitives: functions of the completion text t (and the row's answer)
# --------------------------------------------------------------------------------------------------


def share(t: str, chars: frozenset[str] | str) -> float:
    return sum(ch in chars for ch in t) / len(t) if t else 0.0


def no_stutter(t: str, row: dict[str, Any]) -> float:
    return 0.0 if any(t[i] == t[i + 1] == t[i + 2] for i in range(len(t) - 2)) else 1.0


def digit_share(t: str, row: dict[str, Any]) -> float:
    return share(t, DIGITS)


def exact_answer(t: str, row: dict[str, Any]) -> float:
    return 1.0 if t == row["answer"] else 0.0


def judge_sparse(t: str, row: dict[str, Any]) -> float | None:
    return share(t, LOW) if t[:1] in SPARSE_TRIGGER and t else None


def digit_share_affine(t: str, row: dict[str, Any]) -> float:
    return 2.0 * share(t, DIGITS) + 1.0


def first_low(t: str, row: dict[str, Any]) -> float:
    return 1.0 if t[:1] and t[0] in LOW else 0.0


def starts_digit(t: str, row: dict[str, Any]) -> float:
    return 1.0 if t[:1] and t[0] in DIGITS else 0.0


def starts_letter(t: str, row: dict[str, Any]) -> float:
    return 1.0 if t[:1] and t[0] in LETTERS else 0.0


def second_even(t: str, row: dict[str, Any]) -> float:
    return 1.0 if len(t) >= 2 and t[1] in EVEN else 0.0


def score_0_10(t: str, row: dict[str, Any]) -> float:
    return 10.0 * share(t, LOW)


def answer_bonus(t: str, row: dict[str, Any]) -> float:
    return 1.5 if row["answer"] in t[:2] else 0.0


def style_small(t: str, row: dict[str, Any]) -> float:
    return 0.2 * share(t, LOW)


def length_frac(t: str, row: dict[str, Any]) -> float:
    return len(t) / row["max_len"]


EARLY = 0.8
"""Position discount of ``low_early``: the i-th character weighs EARLY**i."""


def low_early(t: str, row: dict[str, Any]) -> float:
    """LOW share with earlier characters counting more: fine-grained values, so sums of two channels
    almost never tie by coincidence (two k/len shares tie in ~9% of pairs)."""
    if not t:
        return 0.0
    weights = [EARLY**i for i in range(len(t))]
    return sum(w for w, ch in zip(weights, t, strict=True) if ch in LOW) / sum(weights)


def detail_0_5(t: str, row: dict[str, Any]) -> float:
    return 5.0 * low_early(t, row)


def single_char(t: str, row: dict[str, Any]) -> float:
    return 1.0 if len(t) == 1 else 0.0


def late_rank(t: str, row: dict[str, Any]) -> float:
    """Position-weighted (EARLY**i) mean rank of the characters in the order 0-9a-z, scaled to [0, 1] (z = 1):
    almost every pair of different completions gets a different value, and the maximum 1.0 is taken only by
    completions made of 'z' alone."""
    if not t:
        return 0.0
    weights = [EARLY**i for i in range(len(t))]
    ranks = [VISIBLE.index(ch) / (len(VISIBLE) - 1) if ch in VISIBLE else 0.0 for ch in t]
    return sum(w * r for w, r in zip(weights, ranks, strict=True)) / sum(weights)


POINTS_PER_CHAR = 5.0
"""``length_points``: a length reward on a large scale (the content check of its scenario lives in [0, 1])."""


def length_points(t: str, row: dict[str, Any]) -> float:
    return POINTS_PER_CHAR * len(t)


@dataclass(frozen=True)
class Channel:
    name: str
    fn: Callable[[str, dict[str, Any]], float | None]
    definition: str
    lo: float
    hi: float
    weight: float = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    channels: tuple[Channel, ...]
    num_generations: int = 4
    prompts_per_step: int = PROMPTS_PER_STEP
    max_completion_length: int = MAX_COMPLETION_LENGTH
    scale_rewards: str = "group"
    algos: tuple[str, ...] = ("grpo", "gdpo")
    steps: int = STEPS
    learning_rate: float = LEARNING_RATE
    prefit_steps: int = 0
    """Supervised steps on prompt + short random answer + EOS before GRPO (``prefit``); 0 = the random model."""
    min_new_tokens: int = 0
    """Added to generation_kwargs when > 0 (1: no completion is empty, EOS cannot be the first token)."""
    beta: float = 0.0
    """TRL's KL coefficient. Above 0 TRL builds a reference model: the policy as it starts GRPO (after the pre-fit),
    saved to a temporary directory that TRL reloads (nothing is downloaded)."""
    num_iterations: int = 1
    """TRL's num_iterations: each generation batch is optimised (and logged) this many steps in a row."""
    anchor: tuple[int, float] | None = None
    """(k, beta): a monitor callback sets ``trainer.beta = beta`` once more than half of the groups of each of k
    consecutive steps held n identical completions (a KL anchor raised when a collapse is noticed); ``beta``
    before that (it must be above 0, so that TRL builds the reference model). None = no monitor."""
    state_window: str = ""
    """'_last_third': the ceiling / floor / clipped channel states are checked on the last third of the steps (a run
    whose state is reached during training), as the scan judges a state on the end of the run."""

    @property
    def weights(self) -> list[float]:
        return [c.weight for c in self.channels]


D_SHARE = "share of the completion's characters that are digits 0-9 (0 for an empty completion)"
L_SHARE = "share of the completion's characters in LOW = {0-4, a-m} (half of the 36 characters; 0 if empty)"
L_EARLY = (
    "share of the completion's characters in LOW = {0-4, a-m}, the i-th character weighted 0.8**i "
    "(earlier characters count more; 0 if empty)"
)

FIRST_LOW = "1 when the first character is in LOW = {0-4, a-m}, else 0"
MODE_COLLAPSE_CHANNELS = (
    Channel("single", single_char, "1 when the completion is exactly one character, else 0", 0, 1),
    Channel(
        "rank",
        late_rank,
        "position-weighted (0.8**i) mean rank of the characters in the order 0-9a-z, scaled to [0, 1] "
        "(1.0 only for completions made of 'z' alone; 0 if empty)",
        0,
        1,
    ),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "ceiling",
            "a format check that (almost) every completion passes + a continuous channel that ranks",
            (
                Channel("format", no_stutter, "1 unless some character repeats 3 times in a row, else 0", 0, 1),
                Channel("digits", digit_share, D_SHARE, 0, 1),
            ),
            num_generations=8,
        ),
        Scenario(
            "floor",
            "an exact-answer channel that is essentially never earned + a continuous channel that ranks",
            (
                Channel(
                    "correct", exact_answer, "1 when the completion is exactly the answer a+b (one digit), else 0", 0, 1
                ),
                Channel("numeric", digit_share, D_SHARE, 0, 1),
            ),
        ),
        Scenario(
            "sparse",
            "a judge that scores only ~11% of completions (None elsewhere) + a continuous channel",
            (
                Channel(
                    "judge",
                    judge_sparse,
                    "None (not applicable) unless the completion starts with w, x, y or z; then " + L_SHARE,
                    0,
                    1,
                ),
                Channel("numeric", digit_share, D_SHARE, 0, 1),
            ),
        ),
        Scenario(
            "collinear",
            "quality_x2 = 2 * quality + 1 exactly, + an independent binary channel",
            (
                Channel("quality", digit_share, D_SHARE, 0, 1),
                Channel("quality_x2", digit_share_affine, "2 * quality + 1 (an exact affine copy)", 1, 3),
                Channel("first_low", first_low, "1 when the first character is in LOW = {0-4, a-m}, else 0", 0, 1),
            ),
        ),
        Scenario(
            "complementary",
            "two mutually exclusive binaries: first character a digit vs a letter",
            (
                Channel("starts_digit", starts_digit, "1 when the first character is a digit, else 0", 0, 1),
                Channel("starts_letter", starts_letter, "1 when the first character is a letter a-z, else 0", 0, 1),
            ),
        ),
        Scenario(
            "independent-binaries",
            "two independent binaries with pass rates near 0.5",
            (
                Channel("first_low", first_low, "1 when the first character is in LOW = {0-4, a-m}, else 0", 0, 1),
                Channel(
                    "second_even",
                    second_even,
                    "1 when the second character is in EVEN = {0,2,4,6,8,a,c,e,...,y}, else 0 "
                    "(also 0 if there is none)",
                    0,
                    1,
                ),
            ),
            num_generations=8,
        ),
        Scenario(
            "drowning-batch",
            "a 0-10 score + a binary format channel, scale_rewards='batch'",
            (
                Channel("score", score_0_10, "10 * (" + L_SHARE + "), in [0, 10]", 0, 10),
                Channel("starts_letter", starts_letter, "1 when the first character is a letter a-z, else 0", 0, 1),
            ),
            scale_rewards="batch",
        ),
        Scenario(
            "weighted",
            "two channels with reward_weights=[1.0, 0.2] (the weights are not in the kept logs)",
            (
                Channel("digits", digit_share, D_SHARE, 0, 1, weight=1.0),
                Channel("detail", detail_0_5, "5 * (" + L_EARLY + "), in [0, 5]", 0, 5, weight=0.2),
            ),
        ),
        Scenario(
            "rare-bonus",
            "a +1.5 answer bonus earned by ~1 completion in a third of the groups + a small continuous channel",
            (
                Channel(
                    "bonus",
                    answer_bonus,
                    "1.5 when the answer digit a+b is among the first two characters of the completion, else 0",
                    0,
                    1.5,
                ),
                Channel("style", style_small, "0.2 * (" + L_SHARE + "), in [0, 0.2]", 0, 0.2),
            ),
            num_generations=8,
        ),
        Scenario(
            "healthy-single",
            "one continuous channel that varies within groups",
            (Channel("quality", low_early, L_EARLY, 0, 1),),
            algos=("grpo",),
        ),
        Scenario(
            "healthy-two",
            "two independent continuous channels that vary within groups",
            (
                Channel("digits", digit_share, D_SHARE, 0, 1),
                Channel("low", low_early, L_EARLY, 0, 1),
            ),
        ),
        Scenario(
            "truncation",
            "a length channel with max_completion_length=2: nearly every completion is clipped",
            (
                Channel(
                    "length",
                    length_frac,
                    "characters / max_completion_length (one token per character, so 1.0 exactly when the "
                    "completion was clipped at the cap)",
                    0,
                    1,
                ),
                Channel("digits", digit_share, D_SHARE, 0, 1),
            ),
            max_completion_length=2,
        ),
        Scenario(
            "mode-collapse",
            "a pre-fitted policy (stops on its own) trained at a 10x learning rate: every group ends up emitting "
            "one identical completion",
            MODE_COLLAPSE_CHANNELS,
            steps=100,
            learning_rate=1e-2,
            prefit_steps=300,
            min_new_tokens=1,
        ),
        Scenario(
            "binary-n2",
            "one binary reward with pass rate ~0.5 at num_generations=2 (16 prompts per step, 32 rows)",
            (Channel("first_low", first_low, FIRST_LOW, 0, 1),),
            num_generations=2,
            prompts_per_step=16,
            algos=("grpo",),
        ),
        Scenario(
            "binary-n16",
            "the same binary reward (pass rate ~0.5) at num_generations=16",
            (Channel("first_low", first_low, FIRST_LOW, 0, 1),),
            num_generations=16,
        ),
        Scenario(
            "scale-mismatch-cut",
            "a 5-points-per-character length reward + a [0, 1] content check independent of length, "
            "max_completion_length=7: a pre-fitted policy that stops on its own learns to run to the cap",
            (
                Channel(
                    "length",
                    length_points,
                    "5 points per character (one token per character): 35 exactly when the completion was cut at "
                    "max_completion_length = 7, 5-15 for a finished 1-3 character one",
                    0,
                    35,
                ),
                Channel("content", low_early, L_EARLY, 0, 1),
            ),
            max_completion_length=7,
            steps=40,
            learning_rate=3e-3,
            prefit_steps=300,
            min_new_tokens=1,
            state_window="_last_third",
        ),
        Scenario(
            "num-iterations-2",
            "healthy-two's channels with num_iterations=2: each generation batch is optimised, and logged, twice",
            (
                Channel("digits", digit_share, D_SHARE, 0, 1),
                Channel("low", low_early, L_EARLY, 0, 1),
            ),
            steps=40,
            num_iterations=2,
        ),
        Scenario(
            "scale-none-beta",
            "healthy-two's channels with scale_rewards='none' and beta=0.04 (a reference model)",
            (
                Channel("digits", digit_share, D_SHARE, 0, 1),
                Channel("low", low_early, L_EARLY, 0, 1),
            ),
            scale_rewards="none",
            beta=0.04,
            algos=("grpo",),
        ),
        Scenario(
            "mode-collapse-recovering",
            "mode-collapse's setup at 2x its learning rate with a KL anchor raised (beta 0.001 -> 50) once 6 "
            "consecutive steps are collapsed: the policy collapses, then recovers well before the end",
            MODE_COLLAPSE_CHANNELS,
            steps=60,
            learning_rate=2e-2,
            prefit_steps=300,
            min_new_tokens=1,
            beta=1e-3,
            anchor=(6, 50.0),
        ),
    )
}
CUT_SCENARIOS = frozenset({"scale-mismatch-cut"})
"""Scenarios measured with ``cut_stats`` (truncation read from the completion text)."""
RECOVERY_SCENARIOS = frozenset({"mode-collapse-recovering"})
"""Scenarios measured with ``recovery_stats`` (a collapse that ends)."""

COLLAPSED_TO = {("grpo", 0): "z", ("grpo", 1): "z", ("gdpo", 0): "zzzzzzzz", ("gdpo", 1): "z"}
"""mode-collapse: the completion each run collapsed to (measured: the completion of >= 98% of the groups of the
last third, checked by design_checks). Which string the collapse picks is not derivable from the math (it depends on
the sampled path); what follows from it is: both strings are all 'z', so rank = 1.0 (its ceiling); single is 1
for 'z' (ceiling) and 0 for 'zzzzzzzz' (floor: 8 characters, the cap)."""


def make_reward(channel: Channel, max_len: int) -> Callable[..., list[float | None]]:
    """A TRL reward function (named after the channel) calling the primitive on each completion."""

    def reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float | None]:
        out = []
        for completion, ans in zip(completions, answer, strict=True):
            value = channel.fn(str(completion), {"answer": ans, "max_len": max_len})
            out.append(None if value is None else float(value))
        return out

    reward.__name__ = channel.name
    reward.__qualname__ = channel.name
    return reward


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------


def run_name(scenario: str, algo: str, seed: int) -> str:
    return f"{scenario}-{algo}-s{seed}"


def trl_config(s: Scenario, algo: str, seed: int) -> dict[str, Any]:
    """The GRPOConfig values that matter for the corpus (all others are TRL's defaults)."""
    return {
        "max_steps": s.steps,
        "per_device_train_batch_size": s.prompts_per_step * s.num_generations,
        "num_generations": s.num_generations,
        **({"num_iterations": s.num_iterations} if s.num_iterations != 1 else {}),
        "learning_rate": s.learning_rate,
        "beta": s.beta,
        "temperature": 1.0,
        "max_completion_length": s.max_completion_length,
        "multi_objective_aggregation": AGGREGATION[algo],
        "scale_rewards": s.scale_rewards,
        "reward_weights": s.weights,
        "logging_steps": 1,
        "log_completions": True,
        "report_to": ["tensorboard"],
        "save_strategy": "steps",
        "save_steps": s.steps,
        "seed": seed,
    }


def generation_kwargs(s: Scenario, suppress: list[int]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"suppress_tokens": suppress}
    if s.min_new_tokens:
        kwargs["min_new_tokens"] = s.min_new_tokens
    return kwargs


KEEP_SUFFIXES = ("trainer_state.json",)


def anchor_callback(s: Scenario) -> Any:
    """A TrainerCallback for ``s.anchor``: after each step it judges the step's completions (the ones TRL keeps for
    logging, ``trainer._logs``), and once more than half of the groups of k consecutive steps held n identical
    completions it sets ``trainer.beta`` (TRL reads ``self.beta`` whenever it computes the reference
    log-probabilities and the loss), from the next step on. ``switched`` keeps that step. None without an anchor."""
    if s.anchor is None:
        return None
    from transformers import TrainerCallback

    k, beta = s.anchor

    class KLAnchor(TrainerCallback):
        trainer: Any = None
        switched: list[int]
        collapsed_run = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.switched:
                return
            done = list(self.trainer._logs["completion"])
            n = s.num_generations
            groups = [done[i : i + n] for i in range(0, len(done), n)]
            same = sum(len(set(g)) == 1 for g in groups) / max(len(groups), 1)
            self.collapsed_run = self.collapsed_run + 1 if same > 0.5 else 0
            if self.collapsed_run >= k:
                self.trainer.beta = beta
                self.switched.append(state.global_step + 1)  # global_step is the step just done

    callback = KLAnchor()
    callback.switched = []
    return callback


def prune(run_dir: Path) -> None:
    """Keep completions/*.parquet, runs/**/events*, trainer_state.json files; delete the rest."""
    for path in sorted(run_dir.rglob("*"), reverse=True):
        rel = path.relative_to(run_dir)
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
            continue
        keep = (
            (rel.parts[0] == "completions" and path.name.startswith("completions_") and path.suffix == ".parquet")
            or (rel.parts[0] == "runs" and "tfevents" in path.name)
            or path.name == "trainer_state.json"
        )
        if not keep:
            path.unlink()


def build_run(scenario: str, algo: str, seed: int, out: str) -> dict[str, Any]:
    """Train one run with TRL into ``out/<name>``, prune it, measure it. Runs in a worker process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, set_seed
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    s = SCENARIOS[scenario]
    name = run_name(scenario, algo, seed)
    final = Path(out) / name
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    reference: Path | None = None
    switched: list[int] | None = None
    started = time.perf_counter()
    try:
        set_seed(seed)
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed)
        if s.prefit_steps:
            prefit(model, tokenizer, s.prefit_steps, seed)
        if s.beta or s.anchor is not None:
            # TRL builds the reference model from config._name_or_path: point it at a local copy of the policy as
            # it starts GRPO (after the pre-fit), so the KL anchor is the starting policy and nothing is downloaded.
            reference = Path(tempfile.mkdtemp(prefix=f".{name}.ref.", dir=out))
            model.save_pretrained(reference)
            model.config._name_or_path = str(reference)
        vocab = tokenizer.get_vocab()
        suppress = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id]
        suppress += [vocab[ch] for ch in PROMPT_ONLY]
        config = trl_config(s, algo, seed)
        args = GRPOConfig(
            output_dir=str(work),
            **config,
            use_cpu=True,
            bf16=False,
            dataloader_num_workers=0,
            disable_tqdm=True,
            generation_kwargs=generation_kwargs(s, suppress),
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[make_reward(c, s.max_completion_length) for c in s.channels],
            args=args,
            train_dataset=Dataset.from_list(prompt_rows()),
            processing_class=tokenizer,
        )
        trainer.remove_callback(PrinterCallback)
        schedule = anchor_callback(s)
        if schedule is not None:
            schedule.trainer = trainer
            trainer.add_callback(schedule)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer.train()
        switched = list(schedule.switched) if schedule is not None else None
        del trainer, model
        prune(work)
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
        if reference is not None and reference.exists():
            shutil.rmtree(reference, ignore_errors=True)
    seconds = time.perf_counter() - started
    measured = measure_run(final, s, algo, seed)
    if switched is not None and "recovery" in measured:
        measured["recovery"]["anchor_switched_at_step"] = switched[0] if switched else None
    return {"name": name, "scenario": scenario, "algo": algo, "seed": seed, "seconds": seconds, "measured": measured}


# --------------------------------------------------------------------------------------------------
# Measurement: reward statistics of the run, read back from TRL's files (numpy, no collapse_doctor)
# --------------------------------------------------------------------------------------------------


def _r(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def trl_advantages(rewards: Any, weights: Any, n: int, algo: str, scale: str) -> Any:
    """TRL 1.16's advantage computation (grpo_trainer.py), re-done in float64 numpy."""
    import numpy as np

    def nanstd(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean = np.nanmean(x, axis=axis, keepdims=True)
            var = np.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
            count = np.sum(~np.isnan(x), axis=axis, keepdims=True)
            out = np.sqrt(var * count / (count - 1))
        return out if keepdims else np.squeeze(out, axis=axis) if axis is not None else out.reshape(())

    unscorable = np.isnan(rewards).all(axis=1)
    if algo == "grpo":
        total = np.nansum(rewards * weights, axis=1)
        total[unscorable] = np.nan
        g = total.reshape(-1, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean = np.repeat(np.nanmean(g, axis=1), n)
        std = np.repeat(nanstd(g, axis=1), n) if scale in ("group", "none") else np.full(total.shape, nanstd(total))
        adv = total - mean
        if scale != "none":
            adv = adv / (std + 1e-4)
    else:
        g = rewards.reshape(-1, n, rewards.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean = np.nanmean(g, axis=1, keepdims=True)
        z = ((g - mean) / (nanstd(g, axis=1, keepdims=True) + 1e-4)).reshape(-1, rewards.shape[1])
        fused = np.nansum(z * weights, axis=1)
        fused[unscorable] = np.nan
        adv = (fused - np.nanmean(fused)) / (nanstd(fused) + 1e-4)
    return np.nan_to_num(adv, nan=0.0)


def measure_run(run_dir: Path, s: Scenario, algo: str, seed: int | None = None) -> dict[str, Any]:
    """Per-channel and combined reward statistics of one run (fields: SEMANTICS["measured"])."""
    import numpy as np
    import pyarrow.parquet as pq

    n = s.num_generations
    names = [c.name for c in s.channels]
    w = np.array(s.weights)
    steps = []
    logged_files = 0
    for f in sorted((run_dir / "completions").glob("completions_*.parquet")):
        t = pq.read_table(f).to_pydict()
        logged_files += 1
        if s.num_iterations > 1 and steps and same_rows(steps[-1], t):
            continue  # the generation batch TRL logged again (num_iterations > 1): each rollout counted once
        steps.append(t)
    reuse = reuse_stats(run_dir, steps, logged_files) if s.num_iterations > 1 else None
    rows = sum(len(t["step"]) for t in steps)
    per_step_rewards = [np.array([[np.nan if v is None else v for v in t[c]] for c in names], float).T for t in steps]
    prompts_ok = all(len(set(t["prompt"][i : i + n])) == 1 for t in steps for i in range(0, len(t["prompt"]), n))
    R = np.concatenate(per_step_rewards)  # [rows, C]
    logged = np.concatenate([np.array(t["advantage"], float) for t in steps])
    completions = [c for t in steps for c in t["completion"]]
    G = R.reshape(-1, n, len(names))  # [groups, n, C]
    groups = G.shape[0]
    step_of_group = np.concatenate([np.full(len(t["step"]) // n, t["step"][0]) for t in steps])

    # Recompute TRL's advantages per step (batch statistics are per step) and compare with the log.
    recomputed = {
        a: np.concatenate([trl_advantages(r, w, n, a, s.scale_rewards) for r in per_step_rewards])
        for a in ("grpo", "gdpo")
    }

    def const_groups(x: Any) -> Any:  # [groups, n] -> bool, constant among non-NaN values (>= 2 of them)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return (np.nanmax(x, axis=1) == np.nanmin(x, axis=1)) & (np.sum(~np.isnan(x), axis=1) >= 2)

    channels: dict[str, Any] = {}
    thirds = np.array_split(np.arange(groups), 3)
    for k, c in enumerate(s.channels):
        x = G[:, :, k]
        valid = ~np.isnan(x)
        applicable = valid.sum(axis=1)
        vals = x[valid]
        entry: dict[str, Any] = {
            "mean": _r(np.nanmean(x)) if valid.any() else None,
            "std": _r(np.nanstd(x, ddof=1)) if valid.sum() > 1 else None,
            "none_share": _r(1 - valid.mean()),
            "share_at_max": _r(np.mean(vals == c.hi)) if vals.size else None,
            "share_at_min": _r(np.mean(vals == c.lo)) if vals.size else None,
            "constant_group_share": _r(np.mean(const_groups(x) | (applicable < 2))),
            "ceiling_group_share": _r(np.mean(np.all(x == c.hi, axis=1))),
            "floor_group_share": _r(np.mean(np.all(x == c.lo, axis=1))),
            "ceiling_group_share_last_third": _r(np.mean(np.all(x[thirds[2]] == c.hi, axis=1))),
            "floor_group_share_last_third": _r(np.mean(np.all(x[thirds[2]] == c.lo, axis=1))),
            "varying_group_share": _r(np.mean(~const_groups(x) & (applicable >= 2))),
            "groups_with_fewer_than_2_values": _r(np.mean(applicable < 2)),
            "one_at_max_group_share": _r(np.mean(np.sum(x == c.hi, axis=1) == 1)),
            "mean_first_third": _r(np.nanmean(x[thirds[0]])) if valid[thirds[0]].any() else None,
            "mean_last_third": _r(np.nanmean(x[thirds[2]])) if valid[thirds[2]].any() else None,
        }
        if set(np.unique(vals)) <= {c.lo, c.hi}:
            entry["pass_rate"] = _r(np.mean(vals == c.hi))
        channels[c.name] = entry

    total = np.nansum(R * w, axis=1).reshape(-1, n)
    # Crude outlier-group check on the GRPO sum: the member farthest from the group median lies more than
    # 8 standard deviations (ddof=1) of the other members away from their mean, while those still differ.
    far = np.argmax(np.abs(total - np.median(total, axis=1, keepdims=True)), axis=1)
    rest = np.array([np.delete(g, i) for g, i in zip(total, far, strict=True)]).reshape(groups, n - 1)
    rest_sd = rest.std(axis=1, ddof=1) if n > 2 else np.zeros(groups)
    extreme = np.abs(total[np.arange(groups), far] - rest.mean(axis=1))
    outlier_groups = (rest_sd > 0) & (extreme > 8 * rest_sd)
    grpo_zero_groups = np.all(np.abs(recomputed["grpo"].reshape(-1, n)) <= ZERO_TOL, axis=1)
    gdpo_zero_groups = np.all(np.abs(recomputed["gdpo"].reshape(-1, n)) <= ZERO_TOL, axis=1)
    logged_zero_groups = np.all(np.abs(logged.reshape(-1, n)) <= ZERO_TOL, axis=1)
    all_pass = np.all(
        [np.all((G[:, :, k] == c.hi) | np.isnan(G[:, :, k]), axis=1) for k, c in enumerate(s.channels)], axis=0
    )
    all_fail = np.all(
        [np.all((G[:, :, k] == c.lo) | np.isnan(G[:, :, k]), axis=1) for k, c in enumerate(s.channels)], axis=0
    )

    # Ties: pairs of completions of one group whose reward vectors differ but whose advantages are equal.
    def tie_share(adv: Any) -> float | None:
        a = adv.reshape(-1, n)
        Rn = np.nan_to_num(G, nan=-999.0)
        differ = tied = 0
        for i in range(n):
            for j in range(i + 1, n):
                d = np.any(Rn[:, i] != Rn[:, j], axis=1)
                differ += int(d.sum())
                tied += int((d & (np.abs(a[:, i] - a[:, j]) <= 1e-6)).sum())
        return tied / differ if differ else None

    # Within-group (demeaned) statistics, pooled over the run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Rz = np.nan_to_num(G, nan=0.0)  # TRL's nansum treats None as 0 in the GRPO sum
        dev = Rz - Rz.mean(axis=1, keepdims=True)
        tot_dev = np.nansum(dev * w, axis=2)
        var_tot = float((tot_dev**2).sum())
        grpo_shares = {
            c.name: _r(w[k] * float((dev[:, :, k] * tot_dev).sum()) / var_tot) if var_tot else None
            for k, c in enumerate(s.channels)
        }
        gstd = np.nanstd(G, axis=1, ddof=1, keepdims=True)
        zch = np.nan_to_num((G - np.nanmean(G, axis=1, keepdims=True)) / (gstd + 1e-4), nan=0.0)
    fused_dev = (zch * w).sum(axis=2)
    var_fused = float((fused_dev**2).sum())
    gdpo_shares = {
        c.name: _r(w[k] * float((zch[:, :, k] * fused_dev).sum()) / var_fused) if var_fused else None
        for k, c in enumerate(s.channels)
    }
    corr = {}
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            da, db = dev[:, :, a].ravel(), dev[:, :, b].ravel()
            den = math.sqrt(float((da**2).sum() * (db**2).sum()))
            corr[f"{names[a]}~{names[b]}"] = _r(float((da * db).sum()) / den) if den else None

    # Scalars TRL logged (trainer_state.json log_history of the last checkpoint).
    states = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(states[-1].read_text())["log_history"] if states else []

    def scalar_mean(key: str) -> float | None:
        vals = [h[key] for h in history if h.get(key) is not None]
        return _r(float(np.mean(vals))) if vals else None

    collapse = collapse_stats(steps, n, recomputed[algo], logged, history, s, algo, seed)
    weight_fit = fit_weight_ratio(per_step_rewards, logged, n, algo, s.scale_rewards) if len(names) == 2 else None
    bound = (n - 1) / math.sqrt(n)
    extra: dict[str, Any] = {}
    if reuse is not None:
        extra["reuse"] = reuse
    if s.name in CUT_SCENARIOS:
        extra["cut"] = cut_stats(steps, s, n)
        clipped = scalar_mean("completions/clipped_ratio")
        extra["cut"]["text_cut_share_minus_trl_clipped_ratio"] = (
            _r(np.mean(extra["cut"]["cut_share_per_step"]) - clipped) if clipped is not None else None
        )
    if s.name in RECOVERY_SCENARIOS:
        extra["recovery"] = recovery_stats(collapse["identical_group_share_per_step"])
        entropy = collapse["entropy_per_step"]
        tenth = max(3, math.ceil(0.1 * len(entropy)))
        extra["recovery"]["entropy_last_10pct_over_first"] = (
            _r(np.mean(entropy[-tenth:]) / entropy[0]) if entropy and entropy[0] else None
        )
    if s.scale_rewards == "none":
        group = np.concatenate([trl_advantages(r, w, n, "grpo", "group") for r in per_step_rewards])
        extra["scale"] = {
            "group_scaled_vs_logged_mean_abs_diff": _r(np.mean(np.abs(group - logged))),
            "logged_abs_advantage_std": _r(np.std(logged)),
        }
    if s.beta or s.anchor is not None:
        kl = [h["kl"] for h in history if h.get("kl") is not None]
        extra["trl_kl_max"] = _r(max(kl)) if kl else None
        extra["trl_kl_mean"] = _r(np.mean(kl)) if kl else None
        # the largest fall from one logged step to the next, relative to the run's largest KL (0 for a KL that only
        # rises; an oscillating KL falls by a large part of its peak)
        falls = [a - b for a, b in itertools.pairwise(kl)]
        extra["trl_kl_largest_drop_over_max"] = _r(max(0.0, *falls) / max(kl)) if len(kl) > 1 and max(kl) > 0 else None
    return {
        "steps": len(steps),
        "rows": rows,
        "groups": groups,
        "groups_per_step": groups // max(len(steps), 1),
        "group_blocks_share_one_prompt": prompts_ok,
        "empty_completion_share": _r(np.mean([c == "" for c in completions])),
        "mean_completion_chars": _r(np.mean([len(c) for c in completions])),
        "channels": channels,
        "logged_matches_trl_formula_max_abs_diff": _r(np.abs(recomputed[algo] - logged).max()),
        "zero_advantage_share": _r(np.mean(np.abs(logged) <= ZERO_TOL)),
        "zero_advantage_group_share": _r(np.mean(logged_zero_groups)),
        "grpo_zero_advantage_group_share": _r(np.mean(grpo_zero_groups)),
        "gdpo_zero_advantage_group_share": _r(np.mean(gdpo_zero_groups)),
        "constant_total_group_share": _r(np.mean(total.max(axis=1) == total.min(axis=1))),
        "all_pass_group_share": _r(np.mean(all_pass)),
        "all_fail_group_share": _r(np.mean(all_fail)),
        "outlier_8sd_group_share": _r(np.mean(outlier_groups)),
        "grpo_tied_pair_share": _r(tie_share(recomputed["grpo"])),
        "gdpo_tied_pair_share": _r(tie_share(recomputed["gdpo"])),
        "within_group_corr": corr,
        "grpo_variance_share": grpo_shares,
        "gdpo_variance_share": gdpo_shares,
        "weight_ratio_fit": weight_fit,
        "logged_abs_advantage_max": _r(np.abs(logged).max()),
        "group_zscore_bound": _r(bound),
        "logged_beyond_bound_share": _r(np.mean(np.abs(logged) > bound + 1e-3)),
        "trl_clipped_ratio_mean": scalar_mean("completions/clipped_ratio"),
        "trl_frac_reward_zero_std_mean": scalar_mean("frac_reward_zero_std"),
        "trl_entropy_first_last": [scalar_mean_of(history, "entropy", 0), scalar_mean_of(history, "entropy", -1)],
        "steps_of_groups": [int(step_of_group.min()), int(step_of_group.max())] if groups else None,
        "collapse": collapse,
    } | extra


def same_rows(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two completions tables hold the same rows (every column but ``step``), as TRL writes one generation
    batch again at each of its num_iterations steps."""
    keys = [k for k in a if k != "step"]
    return set(keys) == {k for k in b if k != "step"} and all(a[k] == b[k] for k in keys)


def reuse_stats(run_dir: Path, batches: list[dict[str, Any]], logged_files: int) -> dict[str, Any]:
    """Logged tables vs generation batches: TRL logs a batch at each step it optimises on it (num_iterations)."""
    import pyarrow.parquet as pq

    logged_rows = sum(pq.read_metadata(f).num_rows for f in (run_dir / "completions").glob("completions_*.parquet"))
    logged_steps = [b["step"][0] for b in batches]
    return {
        "logged_tables": logged_files,
        "logged_rows": logged_rows,
        "generation_batches": len(batches),
        "generated_rows": sum(len(b["step"]) for b in batches),
        "first_logged_step_of_each_batch": logged_steps,
        "tables_per_batch": round(logged_files / len(batches), 4) if batches else None,
    }


def cut_stats(steps: list[dict[str, Any]], s: Scenario, n: int) -> dict[str, Any]:
    """Truncation at the length cap, read from the completion text (one token per character and no EOS in the text,
    so a completion was cut exactly when it has max_completion_length characters): the share cut per step, and per
    channel the within-group difference mean(reward | cut) - mean(reward | finished), averaged over the groups that
    hold both (a trend the run shares with the cut share cancels inside a group)."""
    import numpy as np

    cap = s.max_completion_length
    per_step, diffs, finished_len = [], {c.name: [] for c in s.channels}, []
    for t in steps:
        cut = np.array([len(c) == cap for c in t["completion"]])
        per_step.append(float(cut.mean()))
        finished_len += [len(c) for c in t["completion"] if len(c) < cap]
        for i in range(0, len(cut), n):
            g = cut[i : i + n]
            if g.all() or not g.any():
                continue
            for c in s.channels:
                x = np.array([np.nan if v is None else v for v in t[c.name][i : i + n]], float)
                diffs[c.name].append(float(np.nanmean(x[g]) - np.nanmean(x[~g])))
    third = max(1, len(steps) // 3)
    return {
        "cut_share_per_step": [round(v, 4) for v in per_step],
        "cut_share_first_5_steps": _r(np.mean(per_step[:5])),
        "cut_share_last_third": _r(np.mean(per_step[-third:])),
        "cut_share_max_step": _r(max(per_step)),
        "mixed_groups": len(next(iter(diffs.values()))),
        "finished_mean_chars": _r(np.mean(finished_len)) if finished_len else None,
        "cut_minus_finished": {k: _r(np.mean(v)) if v else None for k, v in diffs.items()},
        "cut_minus_finished_se": {
            k: _r(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None for k, v in diffs.items()
        },
    }


def recovery_stats(ident: list[float], share: float = 0.5) -> dict[str, Any]:
    """A collapse that ends: the longest stretch of consecutive steps with more than ``share`` of the groups
    identical, where it starts and ends (1-based positions among the logged steps), and the identical share over the
    last 10% of the steps (the scan's current window, at least 3 steps) and the last 20%."""
    import numpy as np

    best, start = (0, None, None), None
    for k, v in enumerate([*ident, 0.0]):
        if v > share and start is None:
            start = k
        elif v <= share and start is not None:
            if k - start > best[0]:
                best = (k - start, start + 1, k)
            start = None
    n = len(ident)
    tenth, fifth = max(3, math.ceil(0.1 * n)), max(3, math.ceil(0.2 * n))
    return {
        "longest_collapsed_stretch_steps": best[0],
        "collapsed_stretch": [best[1], best[2]] if best[1] is not None else None,
        "steps_after_stretch": n - best[2] if best[2] is not None else None,
        "identical_group_share_stretch": _r(np.mean(ident[best[1] - 1 : best[2]])) if best[1] is not None else None,
        "identical_group_share_last_10pct": _r(np.mean(ident[-tenth:])),
        "identical_group_share_last_20pct": _r(np.mean(ident[-fifth:])),
        "identical_group_share_max_step": _r(max(ident)) if ident else None,
    }


def collapse_stats(
    steps: list[dict[str, Any]],
    n: int,
    own: Any,
    logged: Any,
    history: list[dict[str, Any]],
    s: Scenario,
    algo: str,
    seed: int | None,
) -> dict[str, Any]:
    """Mode-collapse statistics: per step the share of groups whose n completions are all the same string, distinct
    completions / rows, TRL's logged entropy and the zero-advantage share; their summaries over the first 5 steps and
    the last third of the steps; and the advantages of the identical groups (logged, and recomputed in float64 under
    the run's own algorithm)."""
    import numpy as np

    ident, distinct, zero, first_len = [], [], [], []
    ident_rows = []
    completions_last = []
    third = max(1, len(steps) // 3)
    for k, t in enumerate(steps):
        c = t["completion"]
        groups = [c[i : i + n] for i in range(0, len(c), n)]
        same = [len(set(g)) == 1 for g in groups]
        ident.append(float(np.mean(same)))
        distinct.append(len(set(c)) / len(c))
        zero.append(float(np.mean(np.abs(np.array(t["advantage"], float)) <= ZERO_TOL)))
        ident_rows += [flag for flag in same for _ in range(n)]
        if k >= len(steps) - third:
            completions_last += [g[0] for g, flag in zip(groups, same, strict=True) if flag]
        if k == 0:
            first_len = [len(x) for x in c]
    ident_rows_arr = np.array(ident_rows, bool)
    entropy = [h["entropy"] for h in history if h.get("entropy") is not None]
    last = slice(len(steps) - third, len(steps))
    onset = next((k + 1 for k, v in enumerate(ident) if v >= 0.5), None)
    own_id = np.abs(own[ident_rows_arr]) if ident_rows_arr.any() else np.zeros(0)
    log_id = np.abs(logged[ident_rows_arr]) if ident_rows_arr.any() else np.zeros(0)
    mode = COLLAPSED_TO.get((algo, seed)) if s.name == "mode-collapse" else None
    modes = sorted(set(completions_last), key=lambda x: (-completions_last.count(x), x))
    groups_last = sum(len(t["completion"]) // n for t in steps[last])
    return {
        "identical_group_share_per_step": [round(v, 4) for v in ident],
        "distinct_per_row_per_step": [round(v, 4) for v in distinct],
        "zero_advantage_share_per_step": [round(v, 4) for v in zero],
        "entropy_per_step": [round(float(v), 4) for v in entropy],
        "onset_step": onset,
        "identical_group_share": _r(np.mean(ident_rows_arr)) if ident_rows else None,
        "identical_group_share_first_5_steps": _r(np.mean(ident[:5])) if ident else None,
        "identical_group_share_last_third": _r(np.mean(ident[last])) if ident else None,
        "distinct_per_row_first_step": _r(distinct[0]) if distinct else None,
        "distinct_per_row_last_third": _r(np.mean(distinct[last])) if distinct else None,
        "zero_advantage_share_last_third": _r(np.mean(zero[last])) if zero else None,
        "zero_advantage_share_last_third_recomputed": _r(
            np.mean(np.abs(own[-sum(len(t["completion"]) for t in steps[last]) :]) <= ZERO_TOL)
        )
        if steps
        else None,
        "identical_groups_recomputed_abs_advantage_max": _r(own_id.max()) if own_id.size else None,
        "identical_groups_logged_abs_advantage_max": float(f"{log_id.max():.3g}") if log_id.size else None,
        "entropy_first": _r(entropy[0]) if entropy else None,
        "entropy_last_third_mean": _r(np.mean(entropy[-third:])) if entropy else None,
        "entropy_last_third_over_first": _r(np.mean(entropy[-third:]) / entropy[0]) if entropy and entropy[0] else None,
        "first_step_ended_by_eos_share": _r(np.mean([x < s.max_completion_length for x in first_len]))
        if first_len
        else None,
        "first_step_mean_chars": _r(np.mean(first_len)) if first_len else None,
        "collapsed_completions_last_third": modes[:3],
        "collapsed_mode_group_share_last_third": _r(completions_last.count(mode) / groups_last)
        if mode is not None and groups_last
        else None,
    }


def fit_weight_ratio(per_step_rewards: list[Any], logged: Any, n: int, algo: str, scale: str) -> dict[str, Any]:
    """w2/w1 that makes TRL's formula reproduce the logged advantages best (grid, then a finer grid)."""
    import numpy as np

    def err(ratio: float) -> float:
        w = np.array([1.0, ratio])
        adv = np.concatenate([trl_advantages(r, w, n, algo, scale) for r in per_step_rewards])
        return float(np.abs(adv - logged).max())

    grid = np.logspace(-2, 2, 161)
    errors = [err(x) for x in grid]
    for _ in range(4):  # zoom in around the best point
        best = int(np.argmin(errors))
        grid = np.linspace(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)], 41)
        errors = [err(x) for x in grid]
    k = int(np.argmin(errors))
    fine, fine_errors = grid, errors
    return {
        "ratio_w2_over_w1": _r(fine[k]),
        "max_abs_diff_at_fit": _r(fine_errors[k]),
        "max_abs_diff_at_equal_weights": _r(err(1.0)),
    }


def scalar_mean_of(history: list[dict[str, Any]], key: str, index: int) -> float | None:
    vals = [h[key] for h in history if h.get(key) is not None]
    return _r(vals[index]) if vals else None


# --------------------------------------------------------------------------------------------------
# Expected diagnoses: reasoned from the reward definitions and the advantage math (not from a scan)
# --------------------------------------------------------------------------------------------------
#
# Notation in the `why` texts: the policy is a randomly initialised tiny model, so each generated token
# is close to uniform over 37 tokens (36 characters + EOS). q = P(EOS at a position): 1/37 = 0.027 for
# an exactly uniform policy, about 0.02 measured (`empty_completion_share`). A completion of the
# 8-token cap has ~7.2 characters on average. n = num_generations. Severities: info < warning < critical;
# the severity bounds are consistent with the verdicts (a critical finding would make a run COLLAPSED).

Q = "q = P(EOS at a position) ~ 0.02 (measured empty_completion_share; 1/37 = 0.027 if exactly uniform)"


def _e(
    code: str,
    lo: str,
    hi: str,
    why: str,
    channels: list[str] | None = None,
    evidence: tuple[str, ...] = (),
    **extra: Any,
) -> dict[str, Any]:
    item: dict[str, Any] = {"code": code}
    if channels:
        item["channels"] = channels
    item |= {"min_severity": lo, "max_severity": hi, **extra, "why": why, "evidence": list(evidence)}
    return item


def _f(
    code: str, why: str, channels: list[str] | None = None, lo: str = "warning", evidence: tuple[str, ...] = ()
) -> dict[str, Any]:
    item: dict[str, Any] = {"code": code}
    if channels:
        item["channels"] = channels
    return item | {"min_severity": lo, "why": why, "evidence": list(evidence)}


def _g(resolves: bool, why: str, evidence: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"resolves": resolves, "why": why, "evidence": list(evidence)}


GLOBAL_FORBID = [
    _f(
        "CD202",
        "TRL's logged advantages are exactly TRL's formula applied to the logged rewards with the run's "
        "own settings (measured max |difference| against an independent re-implementation: "
        "logged_matches_trl_formula_max_abs_diff); nothing is stale or mismatched. GDPO and batch-scaled GRPO "
        "exceed the group z-score bound by design.",
        evidence=("logged_matches_trl_formula_max_abs_diff", "logged_beyond_bound_share"),
    ),
    _f(
        "CD501",
        "learning_rate 1e-3 on a ~20k-parameter random model: the policy barely moves, so the logged "
        "reward_std keeps its early level (no spike, no collapse relative to it).",
        evidence=(),
    ),
    _f(
        "CD503",
        "entropy stays at its initial level (near ln 42 = 3.74 nats over the model's 42-token vocabulary): "
        "measured first/last logged entropy.",
        evidence=("trl_entropy_first_last",),
    ),
]


def prefit_setup(s: Scenario) -> dict[str, Any]:
    return {
        "what": "before GRPO, plain cross-entropy on 'a+b=' + 1-3 characters drawn uniformly from the 36 + EOS "
        "(loss on the answer tokens only), so the policy ends completions with EOS on its own with near-uniform "
        "characters",
        "steps": s.prefit_steps,
        "batch": PREFIT_BATCH,
        "optimizer": f"torch AdamW lr {PREFIT_LR}",
        "answer_chars": [1, PREFIT_MAX_CHARS],
    }


REFERENCE_MODEL = (
    "TRL's reference model (beta > 0) is the policy as it starts GRPO (after the pre-fit, if any): saved to a "
    "temporary directory that config._name_or_path points at, which TRL reloads; deleted after the run"
)


def kl_anchor_setup(s: Scenario) -> dict[str, Any]:
    assert s.anchor is not None
    return {
        "what": "a TrainerCallback judges each step's completions (trainer._logs) and, once more than half of the "
        f"groups of {s.anchor[0]} consecutive steps held {s.num_generations} identical completions, sets "
        f"trainer.beta = {s.anchor[1]} from the next step on (TRL reads self.beta at every step); beta is "
        f"{s.beta} before that (above 0 so that TRL builds the reference model)",
        "consecutive_collapsed_steps": s.anchor[0],
        "beta_before": s.beta,
        "beta_after": s.anchor[1],
        "switched_at_step": "measured: recovery.anchor_switched_at_step",
    }


def expected(s: Scenario, algo: str, seed: int | None = None) -> dict[str, Any]:
    """The expected diagnosis of one run (scenario x algo; seed only for mode-collapse's collapsed string)."""
    e: dict[str, Any] = {}
    if s.name == "ceiling":
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = (
            "format is the same for all 8 completions of a group in ~92-93% of groups: a channel constant within a "
            "group adds the same number to every member and changes no advantage (GRPO: the group mean absorbs "
            "it; GDPO: its z-score is 0). digits varies within every group, so every group carries a full-scale "
            "advantage. In the ~7-8% of groups where one completion fails format, that failure takes most of the "
            "group's std under GRPO and squeezes the digits differences of the other seven: a local effect on a "
            "small share of groups. A saturated channel on its own is informational."
        )
        e["channel_states"] = {"format": "ceiling", "digits": "ranking"}
        e["channel_states_why"] = {
            "format": "fails only on a run of 3 equal characters: P ~ (L-2)/36^2 ~ 0.005 for L = 8 if uniform; "
            "measured pass rate ~0.99 (the model repeats characters a little more often than uniform). "
            "P(all 8 pass) ~ 0.99^8 ~ 0.92; measured ceiling_group_share 0.92-0.93.",
            "digits": "digit share of ~7 characters, p ~ 10/37 = 0.27: within-group std ~ sqrt(0.27*0.73/7) ~ 0.17; "
            "8 completions with the same share essentially never happen (measured varying_group_share ~1.0).",
        }
        e["expect"] = [
            _e(
                "CD101",
                "info",
                "info",
                "format is saturated at its maximum from step 1: reported as information "
                "(a fully saturated channel changes no advantage), not as a warning.",
                ["format"],
                ("channels.format.ceiling_group_share", "channels.format.pass_rate"),
            ),
        ]
        e["forbid"] = [
            _f(
                "CD102",
                "the combined reward varies in every group (digits ranks): zero-variance groups ~0.",
                evidence=("zero_advantage_group_share",),
            ),
            _f(
                "CD402",
                "format holds only ~18-21% of the within-group variance of the GRPO sum (all of it from the "
                "~7-8% of groups where it varies; ~6-7% of the GDPO fused variance); digits holds the rest.",
                evidence=("grpo_variance_share",),
            ),
            _f("CD505", "format's std is ~0 from the first step (saturated, not a fall from a peak).", ["format"]),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {
            "CD101": _g(
                False,
                "a channel that is constant within a group has z = 0 under GDPO "
                "as well: saturation is a property of the rewards, not of the aggregation.",
            )
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.05],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.01],
            "all_fail_group_share": [0.0, 0.01],
            "why": "no group is flat (digits varies); individual zeros are completions whose digit share equals "
            "their group's mean. all-pass needs digits = 1 for all 8 (P ~ 0.27^(7*8)), all-fail digits = 0 and a "
            "stutter for all 8: both ~0.",
        }
    elif s.name == "floor":
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = (
            "correct is 0 for every completion in ~100% of groups, so it changes no advantage; numeric ranks "
            "within groups, so the gradient signal the run uses is intact (it just does not contain the objective, "
            "which is information about the task, not a collapse of the advantages)."
        )
        e["channel_states"] = {"correct": "floor", "numeric": "ranking"}
        e["channel_states_why"] = {
            "correct": "P(completion == answer digit) = P(first token is that digit) * P(EOS next) ~ (1/37)*q ~ 6e-4; "
            "P(a group of 4 has no success) ~ 0.998. Measured pass rate ~0.000, floor_group_share ~1.0 (seed 1 has a "
            "single success in 640 completions).",
            "numeric": "digit share, within-group std ~0.17; measured varying_group_share ~0.99.",
        }
        e["expect"] = [
            _e(
                "CD101",
                "info",
                "info",
                "correct sits at its minimum in essentially every group from step 1: "
                "information (a channel that is never earned changes no advantage), not a warning.",
                ["correct"],
                ("channels.correct.floor_group_share", "channels.correct.pass_rate"),
            ),
        ]
        e["forbid"] = [
            _f(
                "CD102",
                "numeric varies in ~99% of groups: zero-variance groups ~1%.",
                evidence=("zero_advantage_group_share",),
            ),
            _f("CD505", "correct's std is ~0 from the first step (never earned, not a fall from a peak).", ["correct"]),
            _f(
                "CD402",
                "correct holds ~0-5% of the within-group variance (one success in seed 1).",
                evidence=("grpo_variance_share",),
            ),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {
            "CD101": _g(False, "correct's z-score is 0 in every group where it is constant: the same under GDPO.")
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.15],
            "zero_advantage_group_share": [0.0, 0.05],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "groups are flat only when all 4 digit shares coincide (~1%); individual zeros (~7%) are "
            "completions at their group's mean (digit shares are k/len fractions). all-fail needs 4 completions "
            "without a digit: (0.73^7)^4 ~ 1e-4.",
        }
    elif s.name == "sparse":
        e["verdict"] = ["HEALTHY", "AT RISK"]
        e["verdict_why"] = (
            "numeric ranks every group; judge gives signal only where it applies. Under GRPO (sum_then_normalize) "
            "TRL's nansum counts None as 0, so an applicable completion gets judge in [0, 0.875] (mean ~0.44) on top "
            "and a not-applicable one 0: the sum rewards 'starting with w-z' (measured: judge holds ~27-40% of the "
            "within-group variance of the GRPO total). Under GDPO judge is z-scored among applicable rows only and "
            "contributes in groups with >= 2 applicable rows: P = 1 - 0.892^4 - 4*0.108*0.892^3 ~ 0.06 (its share "
            "of the fused variance ~1-2%). A precursor at most; the run's gradient signal is intact."
        )
        e["channel_states"] = {"judge": "sparse", "numeric": "ranking"}
        e["channel_states_why"] = {
            "judge": "applicable iff the first character is one of w, x, y, z: P ~ 4/37 = 0.108, so None ~ 0.89 "
            "(measured none_share 0.87-0.91).",
            "numeric": "digit share, varies in ~99% of groups.",
        }
        e["expect"] = [
            _e(
                "SPARSE",
                "info",
                "warning",
                "judge returns None for ~89% of rows (TRL's 'not applicable').",
                ["judge"],
                (
                    "channels.judge.none_share",
                    "channels.judge.groups_with_fewer_than_2_values",
                    "grpo_variance_share.judge",
                    "gdpo_variance_share.judge",
                ),
            ),
        ]
        e["forbid"] = [
            _f(
                "CD101",
                "judge is not saturated: where it applies it varies (values k/len); 'None in most rows' is "
                "sparsity, reported as SPARSE, not as rel_gain decay.",
                ["judge"],
            ),
            _f("CD102", "numeric varies in ~99% of groups.", evidence=("zero_advantage_group_share",)),
        ]
        e["gdpo_resolves"] = {
            "SPARSE": _g(
                False,
                "sparsity is in the reward: GDPO removes GRPO's None-as-0 "
                "applicability bias (judge's share of the fused variance ~1-2% vs ~27-40% "
                "of the GRPO sum) but the channel still applies to ~11% of rows.",
                ("grpo_variance_share.judge", "gdpo_variance_share.judge"),
            )
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.15],
            "zero_advantage_group_share": [0.0, 0.03],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "numeric keeps every group but ~1% unflat; all-pass would need numeric = 1 for all members.",
        }
    elif s.name == "collinear":
        e["verdict"] = ["AT RISK"]
        e["verdict_why"] = (
            "quality_x2 = 2*quality + 1 exactly: within a group its deviations are twice quality's, so their "
            "within-group correlation is exactly +1 and GRPO's sum is 3*quality + first_low + 1 (quality counts "
            "3x with configured weights 1 and 1). Under GDPO z(quality_x2) = z(quality) exactly (a positive affine "
            "map leaves a z-score unchanged): the fused sum is 2*z(quality) + z(first_low), still double-counted. "
            "The advantages still rank (first_low keeps ~41-43% of the GRPO within-group variance, ~18% under GDPO): "
            "double counting is a precursor, not a collapse."
        )
        e["channel_states"] = {"quality": "ranking", "quality_x2": "ranking", "first_low": "ranking"}
        e["channel_states_why"] = {
            "quality": "digit share, varies in ~99% of groups.",
            "quality_x2": "affine copy of quality: varies exactly where quality varies.",
            "first_low": "binary, p ~ 18/37 = 0.49: constant in a group of 4 with P = p^4 + (1-p)^4 ~ 0.13 "
            "(measured constant_group_share 0.11-0.15).",
        }
        e["expect"] = [
            _e(
                "CD401",
                "warning",
                "warning",
                "within-group correlation of quality and quality_x2 is exactly 1 "
                "(measured within_group_corr 1.0); quality and first_low are independent (|rho| < 0.06).",
                ["quality", "quality_x2"],
                ("within_group_corr",),
            ),
        ]
        e["forbid"] = [
            _f(
                "CD402",
                "no single channel holds most of the within-group variance: GRPO ~0.19 / 0.38 / 0.41-0.43, "
                "GDPO ~0.41 / 0.41 / 0.18-0.19.",
                evidence=("grpo_variance_share", "gdpo_variance_share"),
            ),
            _f("CD102", "quality varies in ~99% of groups.", evidence=("zero_advantage_group_share",)),
            _f(
                "CD301",
                "ties need 3*(quality_i - quality_j) = +-1 exactly: ~0.2% of differing pairs.",
                evidence=("grpo_tied_pair_share",),
            ),
        ]
        e["gdpo_resolves"] = {
            "CD401": _g(
                False, "z(2*quality + 1) = z(quality): GDPO adds the same z-score twice.", ("gdpo_variance_share",)
            )
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.05],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "groups are flat only if quality and first_low are both constant (~0.01 * 0.13).",
        }
    elif s.name == "complementary":
        e["verdict"] = ["COLLAPSED"]
        e["verdict_why"] = (
            "every non-empty completion starts with a digit or a letter, so starts_digit + starts_letter = 1 for it. "
            "In a group with no empty completion, P = (1-q)^4 ~ 0.92, the GRPO sum is 1 for every member: zero "
            "std, advantage exactly 0. Under GDPO starts_letter = 1 - starts_digit within such a group, so the two "
            "have the same group std and opposite deviations: z_letter = -z_digit, the fused sum is exactly 0 for "
            "every member (and the batch mean of the fused sums is 0, since z-scores sum to 0 within each group): "
            "advantage 0, the same silence. Measured: 92.5-94% of rollouts carry zero advantage under either "
            "algorithm; only groups holding an empty completion (0, 0) train."
        )
        e["channel_states"] = {"starts_digit": "ranking", "starts_letter": "ranking"}
        e["channel_states_why"] = {
            "starts_digit": "p ~ 10/37 = 0.27 (measured 0.24-0.30): constant in a group of 4 with P ~ 0.73^4 + "
            "0.27^4 ~ 0.29, so it varies in ~70% of groups; it ranks, but only against its complement.",
            "starts_letter": "p ~ 26/37 = 0.70 (measured 0.69-0.74): varies in ~72-77% of groups.",
        }
        e["expect"] = [
            _e(
                "CD102",
                "critical",
                "critical",
                "~92% of groups flat by theory ((1-q)^4), measured 92.5-94% under the "
                "run's own algorithm (GRPO: constant sum; GDPO: fused z-scores cancel exactly). Judged on the run's "
                "advantages, not on 'every channel constant' (only ~23-31% of groups have both channels constant).",
                evidence=(
                    "zero_advantage_group_share",
                    "grpo_zero_advantage_group_share",
                    "gdpo_zero_advantage_group_share",
                    "channels.starts_digit.constant_group_share",
                ),
            ),
            _e(
                "CD301",
                "warning",
                "critical",
                "for two completions of a group: P((1,0),(0,1)) = 2*0.27*0.70 ~ 0.38, "
                "P(vectors differ) ~ 1 - (0.27^2 + 0.70^2 + q^2) ~ 0.43: ~88% of differing pairs tie (measured "
                "0.91-0.92 under GRPO, 0.89-0.90 under GDPO).",
                ["starts_digit", "starts_letter"],
                ("grpo_tied_pair_share", "gdpo_tied_pair_share"),
            ),
            _e(
                "CD401",
                "warning",
                "critical",
                "within a group without an empty completion the channels are exact "
                "complements (rho = -1); empty completions (0, 0) pull the pooled value to -0.956/-0.960.",
                ["starts_digit", "starts_letter"],
                ("within_group_corr",),
            ),
        ]
        if algo == "grpo":
            e["expect"].append(
                _e(
                    "CD504",
                    "warning",
                    "critical",
                    "TRL's frac_reward_zero_std (GRPO: share of rows in zero-std groups) 0.925-0.94 on average.",
                    evidence=("trl_frac_reward_zero_std_mean",),
                )
            )
        else:
            e["scalar_note"] = (
                "under GDPO TRL's frac_reward_zero_std tests the std of the fused rewards over the "
                "whole batch: it is 1 only in steps where all 8 groups are silent (P ~ 0.93^8 ~ 0.55) "
                "and 0 otherwise, so the scalar log shows 0.50-0.55 on average; CD504 is neither "
                "expected nor forbidden, the rollouts carry the diagnosis."
            )
        e["forbid"] = [
            _f(
                "CD402",
                "neither channel drowns the other; they cancel (CD102/CD301), which is not dominance.",
                lo="critical",
            ),
        ]
        e["gdpo_resolves"] = {
            "CD102": _g(
                False,
                "z_letter = -z_digit in every group without an empty completion: the GDPO fused sum "
                "is 0 exactly where the GRPO sum is flat.",
                ("gdpo_zero_advantage_group_share",),
            ),
            "CD301": _g(
                False,
                "(1,0) and (0,1) get z_digit(1) + z_letter(0) and z_digit(0) + z_letter(1); with "
                "s_digit = s_letter (complements) both are 0.",
                ("gdpo_tied_pair_share",),
            ),
            "CD401": _g(False, "two complementary channels stay complementary after per-channel normalisation."),
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.85, 0.98],
            "zero_advantage_group_share": [0.85, 0.98],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "zero-advantage groups = groups without an empty completion: (1-q)^4 ~ 0.92. all-pass (both "
            "channels 1) is impossible; all-fail needs 4 empty completions (q^4).",
        }
    elif s.name == "independent-binaries":
        e["channel_states"] = {"first_low": "ranking", "second_even": "ranking"}
        e["channel_states_why"] = {
            "first_low": "p ~ 18/37 = 0.49 (measured 0.51-0.53): constant among 8 with P ~ 2*0.5^8 ~ 0.008.",
            "second_even": "p ~ (1-q)^2 * 0.5 ~ 0.48 (measured 0.49-0.52); the second character is independent "
            "of the first: measured within-group rho -0.006 to 0.017.",
        }
        tie = (
            "The GRPO sum takes 3 values (0, 1, 2), so (1,0) and (0,1) get the same advantage. For two "
            "completions of a group with pass rates ~0.5: P(vectors differ) = 3/4, P({(1,0),(0,1)}) = "
            "2*(1/4)*(1/4) = 1/8, so 1/6 ~ 0.17 of the differing pairs tie (measured grpo_tied_pair_share "
            "0.157-0.170)."
        )
        gd = (
            "Under GDPO (1,0) gets (1-m_A)/s_A - m_B/s_B and (0,1) gets -m_A/s_A + (1-m_B)/s_B: they differ by "
            "1/s_A - 1/s_B, so GDPO separates them exactly when the group's per-channel stds differ, i.e. unless "
            "the pass counts satisfy k_B = k_A or k_B = 8 - k_A. Simulated for p = 0.5, n = 8: 0.059 of the "
            "differing pairs still tie (measured gdpo_tied_pair_share 0.055-0.064), below the 0.1 warning level."
        )
        if algo == "grpo":
            e["verdict"] = ["AT RISK"]
            e["verdict_why"] = tie + (
                " A sixth of the distinctions are lost, every group still has signal (zero-variance groups "
                "~0.4%): a precursor."
            )
            e["expect"] = [
                _e(
                    "CD301",
                    "warning",
                    "warning",
                    tie,
                    ["first_low", "second_even"],
                    ("grpo_tied_pair_share", "gdpo_tied_pair_share"),
                )
            ]
        else:
            e["verdict"] = ["HEALTHY"]
            e["verdict_why"] = "The run's own advantages are GDPO's. " + gd
            e["expect"] = []
            e["max_warning"] = 0
        e["forbid"] = [
            _f(
                "CD102",
                "P(a group of 8 has a constant sum) ~ 2*(1/4)^8 + (1/2)^8 ~ 0.004.",
                evidence=("zero_advantage_group_share",),
            ),
            _f("CD401", "independent channels: within-group rho -0.006 to 0.017.", evidence=("within_group_corr",)),
            _f("CD402", "equal spreads: ~50/50 variance shares.", evidence=("grpo_variance_share",)),
        ]
        if algo == "gdpo":
            e["forbid"].append(_f("CD301", gd, evidence=("gdpo_tied_pair_share",)))
        e["gdpo_resolves"] = {"CD301": _g(True, gd, ("gdpo_tied_pair_share",))}
        e["signal_budget"] = {
            "zero_advantage_share": [0.05, 0.2],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.01],
            "all_fail_group_share": [0.0, 0.01],
            "why": "flat groups ~0.004 (see CD102); individual zero advantages (~11%) are members whose sum equals "
            "the group mean (e.g. sum 1 in a group averaging 1). all-pass = (1,1) for all 8: 0.25^8.",
        }
    elif s.name == "drowning-batch":
        e["channel_states"] = {"score": "ranking", "starts_letter": "ranking"}
        e["channel_states_why"] = {
            "score": "10 * LOW share of ~7 characters: within-group std ~ 10*sqrt(0.25/7) ~ 1.9 (measured overall "
            "std ~2.1).",
            "starts_letter": "p ~ 0.70 (measured 0.69-0.75): varies in 1 - 0.7^4 - 0.3^4 ~ 0.75 of groups; variance "
            "0.21 vs score's ~3.5.",
        }
        drown = (
            "score's within-group variance (~3.5) is ~17x starts_letter's (0.21): ~94% of the within-group "
            "variance of the GRPO sum is score (measured grpo_variance_share). score moves in steps of 10/len "
            "(1.25 points for 8 characters), so starts_letter's 1 point decides the order of two completions only "
            "when their scores are equal or less than 1 apart (P(equal) = C(16,8)/4^8 ~ 0.20 for two 8-character "
            "completions; measured from the completions: 14-19% of the within-group pairs that differ in "
            "starts_letter). scale_rewards='batch' divides by the batch std (~2.1-2.2), so groups where score "
            "happens to be flat are not re-inflated either."
        )
        if algo == "grpo":
            e["verdict"] = ["AT RISK", "COLLAPSED"]
            e["verdict_why"] = drown + (
                " The intended format channel is drowned: COLLAPSED by the rule 'intended "
                "channels are drowned', AT RISK if drowning of one channel while the "
                "other still trains is read as a precursor."
            )
            e["expect"] = [
                _e(
                    "CD402",
                    "warning",
                    "critical",
                    drown,
                    ["score"],
                    ("grpo_variance_share", "gdpo_variance_share"),
                    drowned=["starts_letter"],
                )
            ]
            e["forbid"] = [
                _f(
                    "CD202",
                    "logged advantages are GRPO with batch scaling, exactly (max |diff| ~0); |A| exceeds the "
                    "group bound (n-1)/sqrt(n) = 1.5 in ~9% of rows by design of scale_rewards='batch'.",
                    evidence=("logged_beyond_bound_share",),
                ),
            ]
        else:
            e["verdict"] = ["HEALTHY"]
            e["verdict_why"] = (
                "GDPO z-scores each channel in its group (scale_rewards does not apply to "
                "normalize_then_sum): both channels get unit spread, ~57/43 of the fused variance."
            )
            e["expect"] = []
            e["forbid"] = [
                _f("CD402", "GDPO variance shares 0.57-0.58 / 0.42-0.43.", evidence=("gdpo_variance_share",))
            ]
            e["max_warning"] = 0
        e["forbid"].append(_f("CD102", "score varies in ~99% of groups.", evidence=("zero_advantage_group_share",)))
        e["gdpo_resolves"] = {
            "CD402": _g(
                True,
                "per-channel z-scores give starts_letter the same unit spread as "
                "score: measured GDPO shares 0.56-0.58 / 0.42-0.44.",
                ("gdpo_variance_share",),
            )
        }
        e["weights_inferred"] = {"score": 1.0, "starts_letter": 1.0}
        e["weights_inferred_why"] = "reward_weights [1, 1]; the channels are independent, so the ratio is identifiable."
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.06],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "score varies in ~99% of groups.",
        }
    elif s.name == "weighted":
        e["verdict"] = ["HEALTHY"]
        e["channel_states"] = {"digits": "ranking", "detail": "ranking"}
        e["channel_states_why"] = {
            "digits": "digit share, within-group std ~0.17.",
            "detail": "5 * position-weighted LOW share, within-group std ~1 (x 0.2 weight ~0.2).",
        }
        if algo == "grpo":
            e["verdict_why"] = (
                "TRL summed digits + 0.2*detail: weighted spreads ~0.17 and ~0.2, so both channels "
                "rank (~41-44 / 56-59 of the within-group variance)."
            )
            dom = (
                "with the weights, digits and 0.2*detail share the within-group variance ~41-44 / 56-59 (measured "
                "grpo_variance_share uses the true weights). A scan that assumed weights 1:1 would see detail "
                "(spread 5x) hold ~96-97% (computed from the completions) and report a false dominance."
            )
        else:
            e["verdict_why"] = "TRL fused z_digits + 0.2*z_detail: detail's lower say is the configured priority."
            dom = (
                "the fused sum is z_digits + 0.2*z_detail: detail's ~4% share of the fused variance is exactly "
                "the configured weight (0.2^2 / (1 + 0.2^2) = 0.038), an intended priority, not a spread-driven "
                "drowning."
            )
        e["expect"] = []
        e["weights_inferred"] = {"digits": 1.0, "detail": 0.2}
        e["weights_inferred_why"] = (
            "TRL applied reward_weights=[1.0, 0.2]; the weights are only in training_args.bin, which is deleted, so "
            "a scan must infer them from the logged advantages. The log equals TRL's formula with weights [1, 0.2] "
            "(measured weight_ratio_fit: best ratio 0.2, residual ~0) and differs by up to ~2.6-2.8 (GRPO) or "
            "~1.4-1.5 (GDPO) from equal weights (max_abs_diff_at_equal_weights)."
        )
        e["forbid"] = [
            _f(
                "CD202",
                "the logged advantages match GRPO/GDPO with the inferred weights [1, 0.2] exactly; calling "
                "them a mismatch (from assuming weights 1:1) would be a false alarm.",
                evidence=("weight_ratio_fit",),
            ),
            _f("CD402", dom, evidence=("grpo_variance_share", "gdpo_variance_share")),
            _f("CD102", "both channels vary in ~99% of groups.", evidence=("zero_advantage_group_share",)),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.03],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "both channels vary; detail's fine-grained values make exact zeros rare.",
        }
    elif s.name == "rare-bonus":
        e["channel_states"] = {"bonus": "floor", "style": "ranking"}
        e["channel_states_why"] = {
            "bonus": "P(answer digit among the first two characters) ~ 2/37 ~ 0.054 (measured pass rate ~0.05): "
            "P(no bonus among 8) ~ 0.946^8 ~ 0.64, so it sits at its minimum 0 in most groups (measured "
            "floor_group_share 0.59-0.72); exactly one bonus in ~8*0.054*0.946^7 ~ 0.29 of groups (measured "
            "one_at_max_group_share 0.22-0.33).",
            "style": "0.2 * LOW share: within-group std ~0.04; varies in every group.",
        }
        grpo_shape = (
            "in the ~29% of groups where exactly one completion earns the +1.5, GRPO gives it A ~ (n-1)/sqrt(n) = "
            "2.47 and the other seven ~ -0.35, their style differences squeezed (style std ~0.04 against a group "
            "std ~0.53: spread ~0.07): outlier-dominated groups. That is the rare success signal doing its job; "
            "in the other ~65% of groups style alone ranks at full scale."
        )
        not_dominant = (
            "bonus holds ~99% of the pooled within-group variance of the GRPO sum, but under group normalisation "
            "style decides every advantage in the ~65% of groups without a bonus, and the bonus deciding the "
            "groups where it is earned is the intended priority of a correctness bonus. A dominance warning (remedy: "
            "GDPO, or lower the bonus) would be a false alarm."
        )
        if algo == "grpo":
            e["verdict"] = ["HEALTHY", "AT RISK"]
            e["verdict_why"] = grpo_shape
            e["expect"] = [
                _e(
                    "CD201",
                    "info",
                    "warning",
                    grpo_shape,
                    ["bonus"],
                    ("channels.bonus.one_at_max_group_share", "logged_abs_advantage_max"),
                )
            ]
            e["forbid"] = [
                _f(
                    "CD201",
                    "outlier groups are ~29% of groups and carry the run's correctness signal: not a "
                    "collapse of the advantages.",
                    ["bonus"],
                    lo="critical",
                ),
                _f("CD402", not_dominant, evidence=("grpo_variance_share",)),
            ]
        else:
            e["verdict"] = ["HEALTHY", "AT RISK"]
            e["verdict_why"] = (
                "under GDPO the bonus member gets z_bonus ~ 2.47 plus its style z-score and the other seven keep "
                "their style z-scores (spread ~1): no squeezed rest. GDPO also gives style, constant-free in every "
                "group, ~71-79% of the fused variance (bonus' z is 0 in the ~64% of groups without a bonus): the "
                "correctness bonus has less say than under GRPO, which a scan may note; not a collapse."
            )
            e["expect"] = []
            e["forbid"] = [
                _f(
                    "CD201",
                    "GDPO keeps the rest of an outlier group spread (style z-scores): informational at most.",
                    ["bonus"],
                ),
                _f(
                    "CD402",
                    "style's ~71-79% share of the fused variance comes from bonus being constant in ~64% of "
                    "groups, not from style drowning the bonus: where the bonus is earned its z (2.47) is the largest "
                    "single term.",
                    evidence=("gdpo_variance_share",),
                ),
            ]
        e["forbid"].append(
            _f(
                "CD101",
                "bonus is earned at a stationary rate (~0.05 in the first and last third): "
                "its rel_gain (1.5 x share of groups with a bonus ~0.5) does not decay.",
                ["bonus"],
                evidence=("channels.bonus.mean_first_third", "channels.bonus.mean_last_third"),
            )
        )
        e["gdpo_resolves"] = {
            "CD201": _g(
                True,
                "GDPO z-scores style separately: the rest of a one-bonus group keeps a spread ~1 instead of ~0.07.",
            )
        }
        e["weights_inferred"] = {"bonus": 1.0, "style": 1.0}
        e["weights_inferred_why"] = "reward_weights [1, 1]; independent channels (rho ~ -0.03)."
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.04],
            "zero_advantage_group_share": [0.0, 0.01],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.0],
            "why": "style varies in every group.",
        }
    elif s.name == "healthy-single":
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = "one continuous channel that varies within every group: full-scale group z-scores."
        e["channel_states"] = {"quality": "ranking"}
        e["channel_states_why"] = {
            "quality": "position-weighted LOW share: fine-grained values, varies in ~99% of groups."
        }
        e["expect"] = []
        e["forbid"] = [
            _f("CD102", "quality varies in ~99% of groups.", evidence=("zero_advantage_group_share",)),
            _f("CD101", "quality's rel_gain is stationary (the policy barely moves).", ["quality"]),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.03],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "a group is flat only if its 4 completions have identical LOW patterns (or are all empty).",
        }
    elif s.name == "healthy-two":
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = (
            "two independent continuous channels with similar spreads (~0.17 and ~0.2), both "
            "varying within every group: ~40-44 / 56-60 variance shares, no ties, no flat groups."
        )
        e["channel_states"] = {"digits": "ranking", "low": "ranking"}
        e["channel_states_why"] = {
            "digits": "digit share, varies in ~99% of groups.",
            "low": "position-weighted LOW share, varies in ~99% of groups.",
        }
        e["expect"] = []
        e["forbid"] = [
            _f("CD102", "both channels vary.", evidence=("zero_advantage_group_share",)),
            _f(
                "CD301",
                "the position weights make equal sums of different vectors a coincidence (measured tie share ~0).",
                evidence=("grpo_tied_pair_share",),
            ),
            _f("CD401", "independent channels: within-group rho ~0.", evidence=("within_group_corr",)),
            _f("CD402", "~40-44 / 56-60 shares.", evidence=("grpo_variance_share",)),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["weights_inferred"] = {"digits": 1.0, "low": 1.0}
        e["weights_inferred_why"] = "reward_weights [1, 1] (TRL's default); identifiable."
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.03],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "both channels vary in ~99% of groups.",
        }
    elif s.name == "truncation":
        e["verdict"] = ["AT RISK"]
        e["verdict_why"] = (
            "length is at its maximum in ~84% of groups because generation is cut at max_completion_length = 2, "
            "not because the completions are good: in those groups it changes no advantage, and TRL trains on the "
            "cut completions (mask_truncated_completions=False). digits still ranks ~95% of groups, so the gradient "
            "has signal; the length reward measures the cap. A precursor."
        )
        e["channel_states"] = {"length": "clipped", "digits": "ranking"}
        e["channel_states_why"] = {
            "length": "length = 1.0 exactly when both tokens were characters (no EOS): P = (1-q)^2 ~ 0.96 (measured "
            "TRL completions/clipped_ratio 0.95-0.96); P(all 4 of a group clipped) ~ 0.85 (measured "
            "ceiling_group_share "
            "0.81-0.85).",
            "digits": "digit share of 2 characters (0, 0.5 or 1), p ~ 0.3: P(all 4 equal) ~ 0.49^4 + 0.42^4 + "
            "0.09^4 ~ 0.09 for iid tokens (measured constant_group_share 0.04-0.06).",
        }
        e["expect"] = [
            _e(
                "TRUNCATION",
                "warning",
                "warning",
                "TRL logs completions/clipped_ratio 0.95-0.96 on "
                "average and the length channel equals 1.0 exactly on the clipped completions.",
                ["length"],
                ("trl_clipped_ratio_mean", "channels.length.ceiling_group_share"),
            )
        ]
        e["forbid"] = [
            _f(
                "CD102",
                "zero-advantage groups 4-6%: digits keeps most groups apart.",
                evidence=("zero_advantage_group_share",),
            )
        ]
        e["gdpo_resolves"] = {
            "TRUNCATION": _g(
                False,
                "truncation happens in generation, before any aggregation: the GDPO run clips the same 95-96%.",
                ("trl_clipped_ratio_mean",),
            )
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.03, 0.2],
            "zero_advantage_group_share": [0.01, 0.1],
            "all_pass_group_share": [0.0, 0.02],
            "all_fail_group_share": [0.0, 0.01],
            "why": "a group is flat when all 4 are clipped (~0.85) and their digit shares coincide (~0.05-0.09): "
            "~4-8% (measured 4-6%). "
            "all-pass = 4 clipped all-digit completions: (0.27^2)^4 ~ 3e-5.",
        }
    elif s.name == "mode-collapse":
        mode = COLLAPSED_TO.get((algo, seed), "z") if seed is not None else "z"
        single_state = "ceiling" if len(mode) == 1 else "floor"
        silent = (
            "When the n = 4 completions of a group are the same string, every reward channel is the same number for "
            "all of them (a reward is a deterministic function of the completion text and the prompt's answer), so "
            "the group's std is 0 on every channel: GRPO's total - group mean is exactly 0, and under GDPO every "
            "channel's z-score is 0, the fused sum is 0 (and the batch mean of the fused sums is 0, since z-scores "
            "sum to 0 within each group): advantage 0 for every member, no gradient. The zero-advantage share is "
            "therefore the identical-group share (plus the rare varying group whose members happen to tie)."
        )
        e["verdict"] = ["COLLAPSED"]
        e["verdict_why"] = (
            "After a supervised pre-fit the policy ends its completions on its own (1-3 characters, EOS), with "
            "near-uniform characters: at step 1 no group holds identical completions (measured "
            "identical_group_share_first_5_steps ~0, distinct completions ~0.8-0.9 of the rows, TRL entropy ~2.7-2.8). "
            "GRPO at learning_rate 1e-2 (10x the corpus's) then commits within ~20-50 steps to one string for every "
            "prompt and stays there: " + silent + " Once every group is identical nothing pulls the policy back "
            "(no advantage, beta = 0 so no KL term), so the collapse is absorbing: measured 0.98-1.0 of the groups of "
            "the last third identical, entropy 0.1-6% of its first value. Most of the run trains on nothing: "
            "the gradient signal the run used is gone, COLLAPSED."
        )
        e["channel_states"] = {"single": single_state, "rank": "ceiling"}
        e["channel_states_why"] = {
            "single": f"the run collapsed to {mode!r} (measured: collapse.collapsed_completions_last_third); "
            f"single({mode!r}) = {1 if len(mode) == 1 else 0}, its "
            + ("maximum: ceiling" if len(mode) == 1 else "minimum (8 characters, the cap): floor")
            + ". Which string the collapse picks depends on the sampled path, not on the math (GDPO seed 0 drifted "
            "to long all-'z' strings, where single is 0 for every member and so gives no pull back to one "
            "character); the state follows from the string.",
            "rank": f"rank({mode!r}) = 1.0 (all 'z'), its maximum: ceiling in every collapsed group.",
        }
        e["expect"] = [
            _e(
                "CD105",
                "critical",
                "critical",
                "mode collapse: most groups of the last window hold n identical completions (measured "
                "identical_group_share_last_third 0.98-1.0; distinct completions per row ~1/32 per step: one string "
                "for the whole batch).",
                evidence=(
                    "collapse.identical_group_share_last_third",
                    "collapse.distinct_per_row_last_third",
                    "collapse.onset_step",
                    "collapse.entropy_last_third_over_first",
                ),
            ),
        ]
        e["forbid"] = [
            _f(
                "CD202",
                "TRL's logged advantages are TRL's formula on the logged rewards (identical groups: exactly 0 under "
                "GRPO; under GDPO TRL's float32 leaves |A| up to ~2e-5 on them in a step where another group varies).",
                evidence=(
                    "logged_matches_trl_formula_max_abs_diff",
                    "collapse.identical_groups_logged_abs_advantage_max",
                ),
            ),
        ]
        e["forbid_remedies"] = [
            {
                "codes": ["CD102", "CD105"],
                "kinds": ["weight", "aggregation"],
                "why": "the zero-variance groups come from identical completions: every channel is constant in them, "
                "so no channel weight changes their advantage (w * 0 = 0) and GDPO's per-channel z-scores are 0 too. "
                "Reweighting the channels or switching to GDPO (or gdpo-dynamic) cannot restore a gradient; the fix "
                "is on the sampling side (a lower learning rate, temperature or an entropy bonus, a KL term, "
                "restarting from a checkpoint before the onset).",
            }
        ]
        e["allowed_note"] = (
            "CD102 (zero-variance groups) may fire, at any severity up to critical: its cause here is identical "
            "completions. CD101 (channels constant at their ceiling/floor), CD501 (reward std collapsing to 0), "
            "CD503 (entropy collapse) and CD504 (zero-std share) describe the same collapse from other angles and "
            "are neither expected nor forbidden (CD503 holds off when the reward rose over the fall, which it did "
            "in the runs that collapsed to 'z')."
        )
        e["gdpo_resolves"] = {
            "CD102": _g(
                False,
                "identical completions have equal rewards on every channel: per-channel z-scores are 0, the GDPO "
                "fused sum is 0 exactly where the GRPO sum is flat.",
                ("grpo_zero_advantage_group_share", "gdpo_zero_advantage_group_share"),
            ),
            "CD105": _g(
                False,
                "the aggregation acts on rewards, after sampling: GDPO cannot make identical completions differ "
                "(the GDPO runs collapse as well).",
                ("collapse.identical_group_share_last_third",),
            ),
        }
        all_pass = [0.4, 0.95] if len(mode) == 1 else [0.0, 0.01]
        e["signal_budget"] = {
            "zero_advantage_share": [0.4, 0.95],
            "zero_advantage_group_share": [0.4, 0.95],
            "all_pass_group_share": all_pass,
            "all_fail_group_share": [0.0, 0.01],
            "why": "zero-advantage rollouts = rollouts of identical groups (see verdict_why), whose share over the "
            "run is the collapsed stretch (~1/2-3/4 of the steps: onset at step ~20-50 of 100) at ~1.0 plus ~0 "
            "before it. Under GDPO the logged share (|A| <= 1e-6) can fall a little short of the identical share: "
            "TRL computes in float32, and in a step where one group varies the identical groups get |A| up to ~2e-5 "
            "(collapse.identical_groups_logged_abs_advantage_max); recomputed in float64 they are 0 "
            f"(collapse.identical_groups_recomputed_abs_advantage_max). all-pass = both channels at their maximum: "
            f"the groups collapsed to {mode!r}"
            + (" (single 1, rank 1)" if len(mode) == 1 else " have single = 0, so none")
            + ". all-fail needs rank 0 (the string '0'...) and single 0 together: ~never.",
        }
    elif s.name == "binary-n2":
        silent = (
            "A group of n = 2 completions scored by one binary reward is silent when both pass or both fail: "
            "P = p^2 + (1-p)^2, which is 1/2 at p = 1/2 and more at any other pass rate (at group size n a binary "
            "reward leaves at least 2^(1-n) of the groups silent, whatever the prompts). Here p ~ 18/37 = 0.49 "
            "(the first character is one of the 18 LOW characters; an empty completion fails; measured pass rate "
            "0.49-0.55): about a quarter of the groups all-pass, a quarter all-fail, and half of the rollouts get "
            "advantage exactly 0 (measured zero_advantage_group_share 0.47-0.49; all-pass groups 0.23-0.28, "
            "all-fail 0.19-0.26)."
        )
        e["verdict"] = ["AT RISK"]
        e["verdict_why"] = silent + (
            " The other half train at full scale (A = +-0.707), so the run's gradient signal is halved, not gone: "
            "a precursor (half the rollouts silent), below the 80% of a collapse."
        )
        e["channel_states"] = {}
        e["channel_states_why"] = {
            "first_low": "no state is expected: by the arithmetic of n = 2 the channel varies in only ~half of the "
            "groups (not 'most', so not ranking), and sits at its maximum in ~25% and its minimum in ~25% (neither "
            "ceiling nor floor); its pass rate (measured 0.49-0.55) is stationary (lr 1e-3).",
        }
        fix = (
            "With p ~ 1/2 the silent share p^2 + (1-p)^2 is already at its minimum over p: harder prompts (lower p) or "
            "easier prompts (higher p) can only raise it, and asking for both at once contradicts itself. What lowers "
            "it is a larger group: 2^(1-n) is 0.125 at n = 4 and 0.008 at n = 8 (the remedy raises num_generations, "
            "a trainer_setting action)."
        )
        e["expect"] = [
            _e(
                "CD102",
                "warning",
                "warning",
                silent + " The silent groups are all-pass and all-fail in equal parts, which is what a pass/fail "
                "reward does at a small group size. " + fix,
                evidence=(
                    "zero_advantage_group_share",
                    "all_pass_group_share",
                    "all_fail_group_share",
                    "channels.first_low.pass_rate",
                ),
                evidence_ranges={
                    "all_pass_group_share": [0.15, 0.35],
                    "all_fail_group_share": [0.15, 0.35],
                    "zero_advantage_rollout_share": [0.4, 0.6],
                },
                actions_include=[{"kind": "trainer_setting", "setting": "num_generations", "change": "raise"}],
            ),
        ]
        support = (
            "one binary reward at n = 2 gives exactly three advantage values: 0 in the silent groups (~50% of the "
            "rollouts) and +-(1/2) / (1/sqrt(2) + 1e-4) = +-0.7070 in the others (~25% each), which is the group "
            "z-score bound (n-1)/sqrt(n) = 0.707 itself. That support is forced by the reward and the group size; "
            "a bimodality, kurtosis or outlier statistic on it measures n = 2, not outlier groups (no group has a "
            "member far from the others: a group of two has no 'rest')."
        )
        e["forbid"] = [
            _f("CD201", support, lo="info", evidence=("logged_abs_advantage_max", "group_zscore_bound")),
            _f(
                "CD101",
                "first_low's pass rate is stationary (lr 1e-3): its rel_gain (the share of varying groups, ~0.5) "
                "does not decay.",
                ["first_low"],
                evidence=("channels.first_low.mean_first_third", "channels.first_low.mean_last_third"),
            ),
            _f("CD402", "one channel: there is no other channel to drown."),
        ]
        e["forbid_remedies"] = [
            {
                "kinds": ["harder_and_easier"],
                "why": "the scan has the completions: the silent groups are all-pass and all-fail in equal parts "
                "(p ~ 1/2). " + fix,
            },
            {
                "codes": ["CD102"],
                "kinds": ["weight", "aggregation"],
                "why": "one channel: its weight cancels in the group z-score (w*r - mean(w*r) over the std of w*r), "
                "and GDPO's z-score of a single channel is the same z-score, 0 in the same groups.",
            },
        ]
        e["allowed_note"] = (
            "CD504 (TRL's frac_reward_zero_std ~0.5) describes the same silence from the scalar log and is neither "
            "expected nor forbidden."
        )
        e["gdpo_resolves"] = {
            "CD102": _g(
                False,
                "one channel: GDPO z-scores it within the group (0 where both members agree), then renormalises over "
                "the batch: the same groups are silent.",
                ("grpo_zero_advantage_group_share", "gdpo_zero_advantage_group_share"),
            )
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.4, 0.6],
            "zero_advantage_group_share": [0.4, 0.6],
            "all_pass_group_share": [0.15, 0.35],
            "all_fail_group_share": [0.15, 0.35],
            "why": "p^2 + (1-p)^2 ~ 0.5 of the 320 groups silent (standard error ~0.03); p^2 ~ 0.24 all-pass, "
            "(1-p)^2 ~ 0.26 all-fail.",
        }
    elif s.name == "binary-n16":
        two = (
            "one binary reward at n = 16: a group with k passes gives its passing members (1 - k/16)/s and its failing "
            "ones -(k/16)/s (s = the group std, ddof 1); GDPO z-scores the one channel the same way and renormalises "
            "over the batch. Two advantage values per group, concentrated near +-1 for k ~ 8, are forced by a "
            "pass/fail reward: a bimodality or outlier statistic on them measures the reward type, not outlier groups."
        )
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = (
            "p ~ 0.5 (measured 0.55): a group of 16 is silent only when all pass or all fail, P = p^16 + (1-p)^16 "
            "~ 1e-4, so every group carries signal (measured zero-advantage groups 0-0.6%: one group of 160 in seed "
            "1, where the prompt moves the pass rate a little); " + two
        )
        e["channel_states"] = {"first_low": "ranking"}
        e["channel_states_why"] = {
            "first_low": "pass rate ~0.5 (measured 0.55): constant among 16 with P ~ 1e-4, varies in every group "
            "(measured varying_group_share 0.99-1.0)."
        }
        e["expect"] = []
        e["forbid"] = [
            _f("CD201", two, lo="info", evidence=("logged_abs_advantage_max",)),
            _f(
                "CD202",
                "TRL's logged advantages are TRL's formula (max |difference| ~0); |A| <= 3.75 = (n-1)/sqrt(n) (GRPO "
                "max ~1.9 for k = 3 or 13, GDPO renormalised ~+-1): nothing to report, not even as information.",
                lo="info",
                evidence=("logged_matches_trl_formula_max_abs_diff", "logged_abs_advantage_max"),
            ),
            _f("CD102", "P(silent group) ~ 1e-4: 0-1 of 160 measured.", evidence=("zero_advantage_group_share",)),
            _f("CD101", "the pass rate is stationary (lr 1e-3).", ["first_low"]),
            _f("CD402", "one channel: there is no other channel to drown."),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.01],
            "zero_advantage_group_share": [0.0, 0.01],
            "all_pass_group_share": [0.0, 0.01],
            "all_fail_group_share": [0.0, 0.01],
            "why": "a member of a varying binary group never has zero advantage (its reward 0 or 1 differs from the "
            "group mean k/16 in (0, 1)); silent groups ~1e-4 (0-1 of 160 measured).",
        }
    elif s.name == "scale-mismatch-cut":
        cut = (
            "The pre-fitted policy ends its completions after 1-3 characters (measured cut share ~0 over steps 1-5), "
            "so a completion is cut at max_completion_length = 7 only if it emits 7 characters without EOS. length "
            "pays 5 points per character: a cut completion scores 35, a finished one 5-15, so within a group the cut "
            "members score ~+16-20 more on length on average (measured cut_minus_finished.length; +30 over a "
            "1-character one), while content, the position-weighted LOW share of iid characters, has mean 1/2 at any "
            "length (measured cut_minus_finished.content ~0). Under GRPO length's within-group spread (5 points x "
            "~1 character) dwarfs content's (~0.3): the advantage is the length rank, the policy learns to stop "
            "emitting EOS, and by the last third most completions are cut (measured cut_share_last_third). Under GDPO "
            "each channel gets unit spread, but length still ranks a longer completion higher in every group where "
            "lengths differ: the same drift, a little slower. The length reward then measures the cap: cut "
            "completions earn its maximum, and TRL trains on them (mask_truncated_completions=False)."
        )
        e["verdict"] = ["AT RISK"]
        e["verdict_why"] = cut + (
            " content still varies within every group (fine-grained values), so the gradient signal the run uses "
            "is intact: a precursor."
        )
        e["channel_states"] = {"length": "clipped", "content": "ranking"}
        e["channel_states_why"] = {
            "length": "at its maximum 35 exactly when the completion was cut: over the last third of the steps all "
            "4 members of most groups are cut (measured ceiling_group_share_last_third), for the wrong reason (the "
            "cap, not the content): clipped, judged on the end of the run.",
            "content": "position-weighted LOW share: fine-grained values, varies in every group (measured ~1.0).",
        }
        e["expect"] = [
            _e(
                "CD104",
                "warning",
                "warning",
                cut,
                ["length"],
                (
                    "trl_clipped_ratio_mean",
                    "cut.cut_share_first_5_steps",
                    "cut.cut_share_last_third",
                    "cut.cut_minus_finished",
                    "channels.length.ceiling_group_share_last_third",
                ),
            )
        ]
        e["forbid"] = [
            _f(
                "CD104",
                "content is not a length-type reward: inside a group, where the members share one policy, the cut "
                "members score the same content as the finished ones (measured cut_minus_finished.content -0.03 to "
                "+0.05, within 2 standard errors of 0, against length's +16-20; within-group correlation of length "
                "and content ~0). A trend content may share "
                "with the cut share over the run (the policy drifting while it learns to run to the cap) is not that "
                "evidence.",
                ["content"],
                lo="info",
                evidence=("cut.cut_minus_finished", "cut.cut_minus_finished_se", "within_group_corr"),
            ),
            _f(
                "CD101",
                "content's within-group range is stationary: its rel_gain does not decay.",
                ["content"],
                evidence=("channels.content.mean_first_third", "channels.content.mean_last_third"),
            ),
            _f("CD102", "content varies in every group.", evidence=("zero_advantage_group_share",)),
        ]
        e["allowed_note"] = (
            "The cut also makes length stop varying inside the groups once all members are cut: CD101 on length "
            "(its rel_gain decays), CD505 on length (its std falls) and CD501 (the logged reward std falls from "
            "length's spread to content's) describe the same saturation at the cap and are neither expected nor "
            "forbidden; so is CD402 under GRPO (length holds ~99% of the within-group variance of the sum while "
            "lengths still differ)."
        )
        e["gdpo_resolves"] = {
            "CD104": _g(
                False,
                "truncation happens in generation, before any aggregation; under GDPO length still ranks longer "
                "completions higher, and the GDPO runs run to the cap as well.",
                ("cut.cut_share_last_third",),
            )
        }
        e["weights_inferred"] = {"length": 1.0, "content": 1.0}
        e["weights_inferred_why"] = "reward_weights [1, 1] (TRL's default); independent channels, identifiable."
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.05],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.01],
            "all_fail_group_share": [0.0, 0.0],
            "why": "content varies in every group; all-pass needs 4 cut completions of LOW characters only (content "
            "= 1), ~(2^-7)^4; all-fail needs length 0, impossible with min_new_tokens = 1.",
        }
    elif s.name == "num-iterations-2":
        reuse = (
            "num_iterations = 2 with max_steps = 40 (steps_per_generation = 1): TRL generates at steps 1, 3, ..., 39 "
            "and optimises each generation batch for two steps, so there are 20 generation batches of 8 prompts x 4 = "
            "32 rollouts: 640 rollouts in 160 groups. TRL writes completions_<step>.parquet at every logged step from "
            "the buffer of the latest batch, so step 2k's table repeats step 2k-1's rows (40 tables, 1,280 logged "
            "rows; measured reuse). A scan that counted logged rows would see every rollout twice."
        )
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = reuse + (
            " The rewards are healthy-two's: two independent continuous channels that vary in every group; lr 1e-3 "
            "over 40 optimiser steps keeps the policy near its start."
        )
        e["channel_states"] = {"digits": "ranking", "low": "ranking"}
        e["channel_states_why"] = {
            "digits": "digit share, varies in ~99% of groups.",
            "low": "position-weighted LOW share, varies in ~99% of groups.",
        }
        e["expect"] = []
        e["run_expect"] = [
            {"field": "rollouts", "equals": 640, "why": reuse},
            {"field": "groups", "equals": 160, "why": "640 rollouts / 4 per group."},
            {"field": "signal.rollouts", "equals": 640, "why": "the signal budget rests on each rollout once."},
            {
                "field": "warnings",
                "any_startswith": "advantages reused",
                "why": "the run says that the logged advantages of a generation batch were used for more than one "
                "step (20 of 40 logged steps repeat the previous one).",
            },
        ]
        e["forbid"] = [
            _f("CD102", "both channels vary.", evidence=("zero_advantage_group_share",)),
            _f("CD301", "position weights make equal sums a coincidence.", evidence=("grpo_tied_pair_share",)),
            _f("CD401", "independent channels: within-group rho ~0.", evidence=("within_group_corr",)),
            _f("CD402", "~45 / 55 shares.", evidence=("grpo_variance_share",)),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["weights_inferred"] = {"digits": 1.0, "low": 1.0}
        e["weights_inferred_why"] = "reward_weights [1, 1] (TRL's default); identifiable."
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.03],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "both channels vary in ~99% of groups; counted over the 640 rollouts (each once).",
        }
    elif s.name == "scale-none-beta":
        e["verdict"] = ["HEALTHY"]
        e["verdict_why"] = (
            "healthy-two's rewards (two independent continuous channels varying in every group) with "
            "scale_rewards='none': TRL only centres the sum, A = total - group mean, so |A| stays below the spread "
            "of the sum (measured max |A| 1.04, under the group bound 1.5) and the advantage std is the "
            "within-group std of the raw sum (measured scale.logged_abs_advantage_std 0.26), by definition of "
            "'none' (Adam's update does not see a global scale). beta = 0.04 adds a KL term to the starting policy; "
            "at lr 1e-3 the policy barely moves: the "
            "logged KL rises smoothly from 0 to ~0.01-0.02 nats per token (measured trl_kl_max; it never falls by "
            "more than a small part of its peak, trl_kl_largest_drop_over_max) against an entropy of ~3.7 nats."
        )
        e["channel_states"] = {"digits": "ranking", "low": "ranking"}
        e["channel_states_why"] = {
            "digits": "digit share, varies in ~99% of groups.",
            "low": "position-weighted LOW share, varies in ~99% of groups.",
        }
        e["expect"] = []
        e["run_expect"] = [
            {"field": "algorithm", "equals": "grpo", "why": "multi_objective_aggregation sum_then_normalize."},
            {
                "field": "algorithm_source",
                "contains": "scale none",
                "why": "the logged advantages are TRL's formula with scale_rewards='none' exactly (measured "
                "logged_matches_trl_formula_max_abs_diff) and differ from the group-scaled recomputation by far more "
                "than float noise (measured scale.group_scaled_vs_logged_mean_abs_diff): the scale is identifiable.",
            },
        ]
        e["forbid"] = [
            _f(
                "CD202",
                "the logged advantages are GRPO with scale 'none' exactly, all within the group bound: nothing "
                "stale or mismatched, not even as information.",
                lo="info",
                evidence=("logged_matches_trl_formula_max_abs_diff", "logged_abs_advantage_max"),
            ),
            _f(
                "CD201",
                "unscaled advantages have the within-group spread of the raw sum (std 0.26), below a z-score's "
                "~0.87: the definition of scale_rewards='none', not an advantage std out of band; and no group has an "
                "extreme member (bounded continuous rewards).",
                evidence=("logged_abs_advantage_max", "scale.logged_abs_advantage_std", "outlier_8sd_group_share"),
            ),
            _f(
                "CD502",
                "the KL to the starting policy rises smoothly from 0 to ~0.01-0.02 at lr 1e-3 (measured trl_kl_max, "
                "trl_kl_largest_drop_over_max): nothing oscillates.",
                evidence=("trl_kl_max", "trl_kl_largest_drop_over_max"),
            ),
            _f("CD102", "both channels vary.", evidence=("zero_advantage_group_share",)),
            _f("CD401", "independent channels: within-group rho ~0.", evidence=("within_group_corr",)),
            _f("CD402", "~44 / 56 shares.", evidence=("grpo_variance_share",)),
        ]
        e["max_warning"] = 0
        e["gdpo_resolves"] = {}
        e["weights_inferred"] = {"digits": 1.0, "low": 1.0}
        e["weights_inferred_why"] = (
            "reward_weights [1, 1]: with scale 'none' the advantages are linear in the weights, so the ratio is "
            "identifiable (measured weight_ratio_fit)."
        )
        e["signal_budget"] = {
            "zero_advantage_share": [0.0, 0.03],
            "zero_advantage_group_share": [0.0, 0.02],
            "all_pass_group_share": [0.0, 0.0],
            "all_fail_group_share": [0.0, 0.01],
            "why": "both channels vary in ~99% of groups (centring alone gives zero exactly where scaling would).",
        }
    elif s.name == "mode-collapse-recovering":
        e["verdict"] = ["HEALTHY", "AT RISK"]
        e["verdict_why"] = (
            "mode-collapse's rewards and pre-fitted start, at learning_rate 2e-2: the policy commits to one string per "
            "prompt within 14-31 steps (measured recovery.collapsed_stretch), and then, as in mode-collapse, every "
            "group of identical completions has advantage 0 under any aggregation. Here a monitor raises beta from "
            "0.001 to 50 once 6 consecutive steps were collapsed (measured anchor_switched_at_step): with the "
            "advantages 0 the loss is beta times the KL to the pre-fitted reference (diverse 1-3 character "
            "completions), so the update pulls the policy back, and at beta = 50 against rewards in [0, 2] the "
            "KL-regularised optimum stays within a factor exp(2/50) ~ 1.04 of the reference: the collapse ends and "
            "does not return. Measured: a stretch of 11-19 steps at 0.91-0.94 identical groups ends 12-29 steps "
            "before the end (the anchor switched at steps 20-37), and no group of the last 10% of the steps is "
            "identical. A collapse that ended before the current window "
            "(the last 10% of the steps, at least the persistence window) is information about the run's history, "
            "not its state: not COLLAPSED."
        )
        e["channel_states"] = {}
        e["channel_states_why"] = {
            "single": "no state is expected: the channel was at its ceiling (or floor, for a run collapsed to a long "
            "all-'z' string) during the collapse and varies again after it.",
            "rank": "the same: ceiling during the collapse, varying after it.",
        }
        e["expect"] = [
            _e(
                "CD105",
                "info",
                "info",
                "a sustained stretch where most groups hold identical completions (measured "
                "recovery.identical_group_share_stretch >= 0.8 over >= 6 steps) that ended before the current window "
                "(measured recovery.steps_after_stretch, recovery.identical_group_share_last_10pct): reported with "
                "the step it recovered at.",
                evidence=(
                    "recovery.collapsed_stretch",
                    "recovery.identical_group_share_stretch",
                    "recovery.steps_after_stretch",
                    "recovery.identical_group_share_last_10pct",
                    "recovery.anchor_switched_at_step",
                ),
                title_matches=r"recovered at step \d+",
                title_example="identical completions at steps 21-31, recovered at step 32",
            ),
        ]
        e["forbid"] = [
            _f(
                "CD202",
                "TRL's logged advantages are TRL's formula on the logged rewards (identical groups: exactly 0 under "
                "GRPO; under GDPO TRL's float32 leaves |A| ~1e-5 on them in a step where another group varies).",
                evidence=(
                    "logged_matches_trl_formula_max_abs_diff",
                    "collapse.identical_groups_logged_abs_advantage_max",
                ),
            ),
        ]
        e["forbid_remedies"] = [
            {
                "codes": ["CD102", "CD105"],
                "kinds": ["weight", "aggregation"],
                "why": "the silent groups of the collapse hold identical completions: every channel is constant in "
                "them, so no channel weight and no aggregation changes their advantage (w * 0 = 0).",
            }
        ]
        e["allowed_note"] = (
            "CD102 (zero-variance groups during the collapse), CD101, CD501, CD502 (the logged KL rises with the "
            "collapse and falls after the anchor), CD503 and CD504 describe the same episode and are neither "
            "expected nor forbidden, at information or warning (a critical one would say the run is collapsed "
            "now, against the verdict); so is CD104 where the collapse was to a long all-'z' string cut at the cap "
            "(GDPO seed 0: single is 0 for every cut completion, by definition), CD507 (the training reward rises "
            "into the collapse and falls back when the anchor pulls the policy to the reference: a real regression "
            "of the reward, the price of the anchor) and CD402 (while most groups are identical, the few that vary "
            "may be ranked by one channel)."
        )
        e["gdpo_resolves"] = {
            "CD105": _g(
                False,
                "the aggregation acts after sampling: GDPO cannot make identical completions differ (the GDPO runs "
                "collapse as well).",
                ("recovery.identical_group_share_stretch",),
            ),
        }
        e["signal_budget"] = {
            "zero_advantage_share": [0.1, 0.6],
            "zero_advantage_group_share": [0.1, 0.6],
            "all_pass_group_share": [0.0, 0.6],
            "all_fail_group_share": [0.0, 0.01],
            "why": "zero-advantage rollouts ~ the collapsed stretch's share of the run (11-19 of 60 steps) at ~0.9 "
            "plus ~0 elsewhere. all-pass = groups collapsed to 'z' (single 1, rank 1); a run collapsed to a long "
            "all-'z' string has single 0 there, so none. all-fail needs rank 0 and single 0 together: ~never.",
        }
    else:
        raise KeyError(s.name)
    if e["verdict"] == ["HEALTHY"] and s.num_generations == 4 and not any(f["code"] == "CD201" for f in e["forbid"]):
        e["forbid"].append(
            _f(
                "CD201",
                "no completion is extreme (every reward is bounded, within-group std ~0.2 of a [0, 1] range). With "
                "n = 4 the rest of a group is 3 completions that can lie close together by chance, so the crude "
                "'farthest member > 8 sd of the others' test holds in ~4-10% of groups (outlier_8sd_group_share) "
                "of this healthy run: sampling noise of small groups, not an outlier-dominated distribution.",
                evidence=("outlier_8sd_group_share",),
            )
        )
    own = {f["code"] for f in e["forbid"]}
    if s.name in ("mode-collapse", "mode-collapse-recovering"):
        own |= {"CD501", "CD503"}  # the reward std and the entropy really do collapse here: not false alarms
    if s.name == "scale-mismatch-cut":
        own |= {"CD501"}  # the reward std falls from length's spread to content's once every member is cut
    e["forbid"] += [dict(f) for f in GLOBAL_FORBID if f["code"] not in own]
    return e


STATE_CHECKS = {
    "ceiling": ("ceiling_group_share", 0.5, 1.0),
    "floor": ("floor_group_share", 0.5, 1.0),
    "sparse": ("none_share", 0.5, 1.0),
    "ranking": ("varying_group_share", 0.5, 1.0),
    "clipped": ("ceiling_group_share", 0.5, 1.0),
}
"""How each channel state is verified on the measured statistics ('most groups' = more than half)."""

EXTRA_CHECKS: dict[str, list[tuple[str, float, float]]] = {
    "ceiling": [("channels.format.pass_rate", 0.97, 1.0)],
    "floor": [("channels.correct.pass_rate", 0.0, 0.005)],
    "sparse": [("channels.judge.none_share", 0.84, 0.94)],
    "collinear": [
        ("within_group_corr.quality~quality_x2", 0.9999, 1.0),
        ("within_group_corr.quality~first_low", -0.15, 0.15),
    ],
    "complementary": [
        ("grpo_tied_pair_share", 0.6, 1.0),
        ("gdpo_tied_pair_share", 0.6, 1.0),
        ("gdpo_zero_advantage_group_share", 0.85, 0.98),
        ("grpo_zero_advantage_group_share", 0.85, 0.98),
    ],
    "independent-binaries": [
        ("grpo_tied_pair_share", 0.12, 0.22),
        ("gdpo_tied_pair_share", 0.0, 0.1),
        ("channels.first_low.pass_rate", 0.4, 0.6),
        ("channels.second_even.pass_rate", 0.4, 0.6),
        ("within_group_corr.first_low~second_even", -0.1, 0.1),
    ],
    "drowning-batch": [("grpo_variance_share.score", 0.85, 1.0), ("gdpo_variance_share.score", 0.4, 0.7)],
    "weighted": [
        ("weight_ratio_fit.ratio_w2_over_w1", 0.19, 0.21),
        ("weight_ratio_fit.max_abs_diff_at_fit", 0.0, 1e-3),
        ("weight_ratio_fit.max_abs_diff_at_equal_weights", 0.5, 100.0),
        ("grpo_tied_pair_share", 0.0, 0.03),
    ],
    "rare-bonus": [("channels.bonus.pass_rate", 0.03, 0.08), ("channels.bonus.one_at_max_group_share", 0.2, 0.4)],
    "healthy-single": [],
    "healthy-two": [
        ("grpo_tied_pair_share", 0.0, 0.03),
        ("gdpo_tied_pair_share", 0.0, 0.03),
        ("within_group_corr.digits~low", -0.15, 0.15),
    ],
    "truncation": [("trl_clipped_ratio_mean", 0.9, 1.0)],
    "mode-collapse": [
        # collapsed over the last third of the steps: >= 80% of the groups identical, entropy < 10% of its first value
        ("collapse.identical_group_share_last_third", 0.8, 1.0),
        ("collapse.entropy_last_third_over_first", 0.0, 0.1),
        ("collapse.collapsed_mode_group_share_last_third", 0.8, 1.0),
        ("collapse.zero_advantage_share_last_third_recomputed", 0.8, 1.0),
        ("collapse.identical_groups_recomputed_abs_advantage_max", 0.0, 1e-6),
        # not collapsed before the onset: the pre-fitted policy samples diverse completions that end on their own
        ("collapse.identical_group_share_first_5_steps", 0.0, 0.05),
        ("collapse.distinct_per_row_first_step", 0.6, 1.0),
        ("collapse.entropy_first", 2.0, 4.0),
        ("collapse.first_step_ended_by_eos_share", 0.95, 1.0),
        ("collapse.onset_step", 6, 67),
    ],
    "binary-n2": [
        ("channels.first_low.pass_rate", 0.4, 0.6),
        ("grpo_zero_advantage_group_share", 0.4, 0.6),
        # three advantage values: 0 and +-(1/2)/(1/sqrt(2) + 1e-4) = +-0.7070, the bound (n-1)/sqrt(n) = 0.7071
        ("logged_abs_advantage_max", 0.706, 0.7071),
        ("logged_beyond_bound_share", 0.0, 0.0),
        ("groups_per_step", 16, 16),
        ("rows", 640, 640),
    ],
    "binary-n16": [
        ("channels.first_low.pass_rate", 0.4, 0.6),
        ("grpo_zero_advantage_group_share", 0.0, 0.01),
        ("gdpo_zero_advantage_group_share", 0.0, 0.01),
        ("groups_per_step", 8, 8),
    ],
    "scale-mismatch-cut": [
        # truncation is learned, not there from the start: ~0 cut in steps 1-5, most cut over the last third
        ("cut.cut_share_first_5_steps", 0.0, 0.1),
        ("cut.cut_share_last_third", 0.6, 1.0),
        ("collapse.first_step_ended_by_eos_share", 0.95, 1.0),
        # within groups the cut members earn far more length and the same content
        ("cut.cut_minus_finished.length", 10.0, 35.0),
        ("cut.cut_minus_finished.content", -0.1, 0.1),
        ("cut.mixed_groups", 30, 10_000),
        ("within_group_corr.length~content", -0.15, 0.15),
        # the text-based cut share agrees with TRL's own clipped_ratio (one token per character)
        ("cut.text_cut_share_minus_trl_clipped_ratio", -0.01, 0.01),
        # and no mode collapse
        ("collapse.identical_group_share_last_third", 0.0, 0.1),
    ],
    "num-iterations-2": [
        ("reuse.logged_tables", 40, 40),
        ("reuse.logged_rows", 1280, 1280),
        ("reuse.generation_batches", 20, 20),
        ("reuse.generated_rows", 640, 640),
        ("reuse.tables_per_batch", 2.0, 2.0),
        ("groups", 160, 160),
        ("grpo_tied_pair_share", 0.0, 0.03),
        ("within_group_corr.digits~low", -0.15, 0.15),
    ],
    "scale-none-beta": [
        ("scale.group_scaled_vs_logged_mean_abs_diff", 0.1, 10.0),
        ("logged_abs_advantage_max", 0.0, 1.5),
        ("logged_beyond_bound_share", 0.0, 0.0),
        ("trl_kl_max", 0.0, 0.05),
        ("trl_kl_largest_drop_over_max", 0.0, 0.25),
        ("grpo_tied_pair_share", 0.0, 0.03),
        ("within_group_corr.digits~low", -0.15, 0.15),
    ],
    "mode-collapse-recovering": [
        # diverse at the start, as in mode-collapse
        ("collapse.identical_group_share_first_5_steps", 0.0, 0.05),
        ("collapse.first_step_ended_by_eos_share", 0.95, 1.0),
        ("collapse.entropy_first", 2.0, 4.0),
        # a sustained collapse: >= 6 consecutive steps with most groups identical, ~all of them over the stretch
        ("recovery.longest_collapsed_stretch_steps", 6, 60),
        ("recovery.identical_group_share_stretch", 0.8, 1.0),
        ("recovery.anchor_switched_at_step", 7, 50),
        # ... that ended well before the current window (the last 10% of the steps)
        ("recovery.steps_after_stretch", 9, 60),
        ("recovery.identical_group_share_last_10pct", 0.0, 0.2),
        ("recovery.identical_group_share_last_20pct", 0.0, 0.3),
        ("recovery.entropy_last_10pct_over_first", 0.3, 2.0),
    ],
}


def design_checks(s: Scenario, algo: str, seed: int | None = None) -> list[tuple[str, float, float]]:
    """Statistics the rewards were designed to produce: channel states, signal budget, scenario specifics."""
    e = expected(s, algo, seed)
    # mode-collapse: a channel's state is that of the collapsed stretch (the last third), as the scan judges a
    # state on the end of the run (likewise a scenario with state_window); the other scenarios are stationary and
    # are checked over the whole run.
    suffix = "_last_third" if s.name == "mode-collapse" else s.state_window
    checks = [
        (
            f"channels.{c}.{STATE_CHECKS[state][0]}{suffix if state in ('ceiling', 'floor', 'clipped') else ''}",
            *STATE_CHECKS[state][1:],
        )
        for c, state in e["channel_states"].items()
    ]
    checks += [(k, *v) for k, v in e["signal_budget"].items() if k != "why"]
    checks += EXTRA_CHECKS[s.name]
    inferred = e.get("weights_inferred")
    if inferred and len(s.channels) == 2:
        ratio = inferred[s.channels[1].name] / inferred[s.channels[0].name]
        checks.append(("weight_ratio_fit.ratio_w2_over_w1", ratio * 0.95, ratio * 1.05))
    return checks


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import datasets
    import torch
    import transformers
    import trl

    return {
        "python": sys.version.split()[0],
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "datasets": datasets.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="scenario(s) to build (repeat or comma-separate)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="runs trained in parallel")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default 0,1)")
    parser.add_argument(
        "--merge-from",
        type=Path,
        metavar="DIR",
        help="train nothing: copy the runs of DIR (a corpus built with --out DIR) into --out and add their manifest "
        "entries to --out/manifest.json; the entries already there are kept as they are, and a run name already "
        "there is an error",
    )
    args = parser.parse_args(argv)
    if args.merge_from is not None:
        return merge_corpus(args.merge_from, args.out)
    only = [x for part in args.only for x in part.split(",") if x]
    unknown = [x for x in only if x not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    seeds = [int(x) for x in args.seeds.split(",")]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(sc, algo, seed, str(out)) for sc in (only or SCENARIOS) for algo in SCENARIOS[sc].algos for seed in seeds]
    started = time.perf_counter()
    results = []
    failed_checks = []
    import multiprocessing

    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        for result in pool.map(build_run, *zip(*jobs, strict=True)):
            problems = check_design(result)
            failed_checks += [(result["name"], p) for p in problems]
            results.append(result)
            print(summary_line(result, out, problems), flush=True)
    total = time.perf_counter() - started
    write_manifest(out, results)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"built {len(results)} run(s) in {total:.1f}s (wall, --jobs {args.jobs}); corpus {out} is {size / 1e6:.2f} MB"
    )
    for name, problem in failed_checks:
        print(f"DESIGN CHECK FAILED {name}: {problem}", file=sys.stderr)
    return 1 if failed_checks else 0


def summary_line(result: dict[str, Any], out: Path, problems: list[str]) -> str:
    m = result["measured"]
    size = sum(p.stat().st_size for p in (out / result["name"]).rglob("*") if p.is_file())
    parts = [
        f"{result['name']:<34}",
        f"{result['seconds']:5.1f}s",
        f"{size / 1e3:6.0f} kB",
        f"{m['steps']} steps x {m['groups_per_step']} groups",
        f"zero-adv {m['zero_advantage_share']:.2f}",
    ]
    for name, ch in m["channels"].items():
        stat = f"pass {ch['pass_rate']:.2f}" if "pass_rate" in ch else f"mean {ch['mean']:.2f}"
        parts.append(
            f"{name}: {stat} const {ch['constant_group_share']:.2f}"
            + (f" none {ch['none_share']:.2f}" if ch["none_share"] else "")
        )
    if m["trl_clipped_ratio_mean"] is not None:
        parts.append(f"clipped {m['trl_clipped_ratio_mean']:.2f}")
    parts.append("design OK" if not problems else f"DESIGN CHECK FAILED ({len(problems)})")
    return " | ".join(parts)


def check_design(result: dict[str, Any]) -> list[str]:
    """The measured statistics a scenario was designed to produce (DESIGN_CHECKS); failures listed."""
    problems = []
    m = result["measured"]
    if m["logged_matches_trl_formula_max_abs_diff"] is None or m["logged_matches_trl_formula_max_abs_diff"] > 1e-3:
        problems.append(
            f"logged advantages differ from TRL's formula by {m['logged_matches_trl_formula_max_abs_diff']}"
        )
    if not m["group_blocks_share_one_prompt"]:
        problems.append("a block of num_generations rows holds more than one prompt")
    for key, lo, hi in design_checks(SCENARIOS[result["scenario"]], result["algo"], result["seed"]):
        value = lookup(m, key)
        if value is None or not (lo <= value <= hi):
            problems.append(f"{key} = {value}, designed to be in [{lo}, {hi}]")
    return problems


def lookup(m: dict[str, Any], key: str) -> Any:
    value: Any = m
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


SETUP = {
    "trainer": "trl.GRPOTrainer (transformers generate path, CPU), TRL's own output directory, pruned",
    "model": "LlamaForCausalLM built in code, randomly initialised per seed: hidden 32, 2 layers, 2 heads (1 KV), "
    "intermediate 64, tied embeddings, vocabulary 42 tokens (~20k parameters)",
    "tokenizer": "tokenizers WordLevel, one token per character: <pad> <s> </s> <unk>, digits 0-9, letters a-z, "
    "'+', '='",
    "generation": "TRL defaults (do_sample, temperature 1.0, no top-k/top-p) plus generation_kwargs "
    "suppress_tokens = [<pad>, <s>, <unk>, '+', '=']: each generated token is one of 36 characters or EOS",
    "prompts": "the 55 prompts 'a+b=' with a + b <= 9 (dataset column 'answer' = str(a+b)); "
    "prompts_per_step of them per step in TRL's seeded RepeatSampler order, num_generations completions each",
    "training": f"max_steps {STEPS}, learning_rate {LEARNING_RATE}, beta 0 (no reference model, no KL logged), "
    "logging_steps 1 (one completions parquet per step), save_steps = max_steps (one checkpoint); a scenario may "
    "set other values (max_steps, learning_rate, num_generations, prompts_per_step, num_iterations, beta, "
    "scale_rewards, max_completion_length): each run's trl_config holds its own",
    "kept": "completions/completions_<step>.parquet, runs/<date>_<host>/events.out.tfevents.*, "
    "checkpoint-<max_steps>/trainer_state.json",
    "deleted": "model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin (it held "
    "reward_weights), config.json, generation_config.json, tokenizer files, the model card README.md",
}

SEMANTICS = {
    "verdict": "acceptable verdicts of a correct scan (any of the list). COLLAPSED only when the gradient signal the "
    "run actually used is collapsing; AT RISK for precursors; HEALTHY otherwise. A channel constant within a group "
    "changes no advantage under GRPO or GDPO; a saturated channel on its own is informational.",
    "channel_states": "ceiling: constant at its run maximum in most groups; floor: constant at its minimum in most "
    "groups; sparse: None in most rows; ranking: varies within most groups; clipped: saturated because "
    "completions hit the length cap. 'most' = more than half, checked on the measured statistics (design_checks).",
    "expect": "findings a correct scan reports: code, channels (optional, the channels the finding names), "
    "min_severity..max_severity (info < warning < critical). Codes: docs/detectors.md, plus TRUNCATION (completions "
    "cut at max_completion_length) and SPARSE (a channel None in most rows).",
    "forbid": "findings that would be false alarms: the code (and channels, if given) at min_severity or worse. "
    "Every run forbids CD202, CD501 and CD503 at warning.",
    "max_warning": "where present: the most findings at warning or worse a correct scan may report (0 = none).",
    "gdpo_resolves": "per code: whether the same condition disappears on the GDPO advantages of the same rewards "
    "(true) or persists (false), with the math.",
    "weights_inferred": "where present: the channel weights (up to a common scale) that a scan should infer from "
    "the logged advantages, since the kept logs do not record reward_weights.",
    "signal_budget": "ranges for: zero_advantage_share (rollouts with |logged advantage| <= 1e-6, i.e. under the "
    "run's own algorithm), zero_advantage_group_share (groups whose every member has zero advantage), "
    "all_pass_group_share / all_fail_group_share (groups in which every member has every non-None channel at its "
    "maximum / minimum possible value, channels[*].range). 'measured' holds the run's values.",
    "measured": "reward statistics of the run, read back from the completions parquet (groups = consecutive blocks "
    "of num_generations rows) and the checkpoint's trainer_state.json log_history by the builder's own numpy code "
    "(no collapse_doctor). grpo_*/gdpo_* are TRL's two aggregations recomputed from the same rewards; "
    "*_variance_share = w_c * Cov_within(r_c, combined) / Var_within(combined) pooled over the run (GRPO: the "
    "weighted sum with None as 0; GDPO: the weighted sum of per-channel group z-scores); *_tied_pair_share = "
    "share of within-group pairs with different reward vectors and equal advantages; within_group_corr = "
    "correlation of group-demeaned rewards; weight_ratio_fit = the w2/w1 that reproduces the logged advantages.",
    "forbid_remedies": "where present: per rule, finding codes (every finding when codes is absent) whose remedy "
    "must not propose the listed kinds of change (weight: changing channel weights; aggregation: switching to GDPO "
    "or gdpo-dynamic; harder_and_easier: harder prompts and easier prompts in one remedy), read from the finding's "
    "typed actions and its remedy text (benchmarks/accuracy_scoring.py forbidden_remedies).",
    "prefit": "where present: the supervised pre-fit of the random model before GRPO (mode-collapse, "
    "mode-collapse-recovering, scale-mismatch-cut).",
    "expect_details": "an expect item may also carry title_matches (a regular expression the finding's title must "
    "match; title_example is a title that matches it), actions_include (typed remedy actions, findings[].actions, "
    "each given field equal) and evidence_ranges "
    "({key: [lo, hi]} on the finding's evidence); a finding at the right severity that misses one is "
    "'wrong_detail'.",
    "run_expect": "where present: facts about the run block of the scan (run.<field>, dotted for nested fields), "
    "each with equals, contains (text, case-insensitive) or any_startswith (some item of a list field starts with "
    "the text), and why.",
    "kl_anchor": "where present: the monitor callback that raises beta once the run is collapsed "
    "(mode-collapse-recovering).",
    "reference_model": "where present (beta > 0): what TRL's reference model is.",
    "allowed_note": "where present: findings that are neither expected nor forbidden, and why.",
    "design_checks": "the statistics each scenario was designed to produce, with the measured value; the builder "
    "fails when one is out of range (the reward function gets fixed, not the expectation).",
}


def write_manifest(out: Path, results: list[dict[str, Any]]) -> None:
    path = out / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    runs = {r["run"]: r for r in old.get("runs", [])}
    for result in results:
        runs[result["name"]] = manifest_entry(result)
    manifest = {
        "format_version": 1,
        "generated_by": "scripts/build_trl_corpus.py (.venv/bin/python scripts/build_trl_corpus.py)",
        "versions": versions(),
        "setup": SETUP,
        "semantics": SEMANTICS,
        "runs": [runs[k] for k in sorted(runs)],
    }
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def merge_corpus(src: Path, dest: Path) -> int:
    """Add the runs of corpus ``src`` to corpus ``dest`` (``--merge-from``): copy each run directory, append its
    manifest entry. The entries already in ``dest`` are written back unchanged (the same JSON values, in the same
    order among themselves; the list stays sorted by run name); ``setup`` and ``semantics`` are the builder's
    current text, ``versions`` stays ``dest``'s (entries built with other library versions carry their own)."""
    new = json.loads((src / "manifest.json").read_text())
    path = dest / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {"runs": []}
    have = {r["run"]: r for r in old["runs"]}
    clash = sorted(r["run"] for r in new["runs"] if r["run"] in have or (dest / r["run"]).exists())
    if clash:
        print(f"error: {dest} already holds {', '.join(clash)}; nothing merged", file=sys.stderr)
        return 2
    missing = [r["run"] for r in new["runs"] if not (src / r["run"] / "completions").is_dir()]
    if missing:
        print(f"error: {src} lacks the run directories of {', '.join(missing)}; nothing merged", file=sys.stderr)
        return 2
    versions = old.get("versions") or new.get("versions")
    runs = dict(have)
    for entry in new["runs"]:
        if new.get("versions") != versions:
            entry = {**entry, "versions": new.get("versions")}
        runs[entry["run"]] = entry
    dest.mkdir(parents=True, exist_ok=True)
    for entry in new["runs"]:
        shutil.copytree(src / entry["run"], dest / entry["run"])
    manifest = {
        "format_version": old.get("format_version", 1),
        "generated_by": old.get("generated_by", new.get("generated_by")),
        "versions": versions,
        "setup": SETUP,
        "semantics": SEMANTICS,
        "runs": [runs[k] for k in sorted(runs)],
    }
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    kept = all(json.dumps(runs[k]) == json.dumps(have[k]) for k in have)
    print(f"merged {len(new['runs'])} run(s) into {dest} ({len(runs)} in all); existing entries unchanged: {kept}")
    return 0 if kept else 1


def manifest_entry(result: dict[str, Any]) -> dict[str, Any]:
    s = SCENARIOS[result["scenario"]]
    algo = result["algo"]
    return {
        "run": result["name"],
        "scenario": s.name,
        "summary": s.summary,
        "algo": algo,
        "seed": result["seed"],
        "trl_config": trl_config(s, algo, result["seed"])
        | {"prompts_per_step": s.prompts_per_step}
        | ({"generation_kwargs_extra": {"min_new_tokens": s.min_new_tokens}} if s.min_new_tokens else {}),
        **({"kl_anchor": kl_anchor_setup(s)} if s.anchor is not None else {}),
        **({"reference_model": REFERENCE_MODEL} if s.beta else {}),
        **({"prefit": prefit_setup(s)} if s.prefit_steps else {}),
        "channels": {
            c.name: {"definition": c.definition, "range": [c.lo, c.hi], "weight": c.weight} for c in s.channels
        },
        "expected": fill_evidence(expected(s, algo, result["seed"]), result["measured"]),
        "design_checks": [
            {"stat": key, "range": [lo, hi], "measured": lookup(result["measured"], key)}
            for key, lo, hi in design_checks(s, algo, result["seed"])
        ],
        "measured": result["measured"],
    }


def fill_evidence(e: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    """Put the measured value of every `evidence` key next to the reasoning that cites it."""

    def fill(item: dict[str, Any]) -> dict[str, Any]:
        keys = item.pop("evidence", [])
        if keys:
            item["measured"] = {k: lookup(m, k) for k in keys}
        return item

    e = json.loads(json.dumps(e))
    for key in ("expect", "forbid"):
        e[key] = [fill(item) for item in e.get(key, [])]
    e["gdpo_resolves"] = {code: fill(item) for code, item in e.get("gdpo_resolves", {}).items()}
    budget = e["signal_budget"]
    budget["measured"] = {k: lookup(m, k) for k in budget if k not in ("why", "measured")}
    return e


if __name__ == "__main__":
    sys.exit(main())
