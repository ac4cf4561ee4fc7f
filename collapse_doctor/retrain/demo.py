"""The ``--demo`` tasks: a tiny Llama built in code, a character tokenizer, digit copying or single-digit sums.

``--demo-task copy`` (the default) is the task where the recipes measurably matter (see :func:`copy_rows`);
``--demo-task sums`` is the earlier one, described here:

Nothing is downloaded: the tokenizer is a ``tokenizers`` word-level model over single characters
(plus the two answer tags as whole tokens), and the model is a randomly initialised
``LlamaForCausalLM`` of about 20k parameters. Prompts are ``"3+4="``; the rewards are ``format``
(an ``<answer>...</answer>`` tag), ``correct`` (the tagged answer equals the sum) and ``length``
(at most 32 characters). The tag is learnable within tens of steps while correctness stays sparse:
the multi-reward situation collapse-doctor is about (see docs/retrain.md, "The demo").
"""

from __future__ import annotations

from typing import Any

DEMO_REWARDS: tuple[str, ...] = (
    "format=collapse_doctor.retrain.rewards:format_tag",
    "correct=collapse_doctor.retrain.rewards:exact_match",
    "length=collapse_doctor.retrain.rewards:length_limit",
)
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
TAG_TOKENS: tuple[str, ...] = ("<answer>", "</answer>")
CHARACTERS = "0123456789+-=* "
DEMO_MAX_STEPS = 100
DEMO_LEARNING_RATE = 3e-2
DEMO_COMPLETION_TOKENS = 8
DEMO_LENGTH_LIMIT = 32
"""Characters before the length reward falls: ``<answer>7</answer>`` (18) and a few more fit."""


def build_char_tokenizer() -> Any:
    """A fast tokenizer with one token per character (and per answer tag); decodes without spaces.

    >>> tok = build_char_tokenizer()
    >>> tok.decode(tok("<answer>12</answer>")["input_ids"])
    '<answer>12</answer>'
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *TAG_TOKENS, *CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("</?answer>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_tiny_model(tokenizer: Any, *, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Any:
    """A randomly initialised Llama causal LM sized for CPU (about 20k parameters by default)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


COPY_REWARDS: tuple[str, ...] = (
    "correct=collapse_doctor.retrain.rewards:starts_with_answer",
    "length=collapse_doctor.retrain.rewards:length_limit",
)
COPY_LENGTH_LIMIT = 2
"""The copy task's ``length`` is 1 up to 2 characters, 0 from 4: an empty completion already earns all of it."""


def copy_rows() -> list[dict[str, Any]]:
    """The copy task: ``"7="`` -> a completion that starts with ``7``; 10 prompts.

    ``correct`` needs the model to read the prompt; ``length`` is earned by stopping at once, so it saturates
    within tens of steps and, summed or normalised, pays the policy for empty completions while ``correct`` is
    still rare: the easy channel that is farmed while the objective fails (docs/retrain.md, "The demo").

    >>> copy_rows()[7]
    {'prompt': '7=', 'answer': '7', 'max_length': 2}
    """
    return [{"prompt": f"{d}=", "answer": str(d), "max_length": COPY_LENGTH_LIMIT} for d in range(10)]


DEMO_TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "copy": ("built-in digit copy (demo)", COPY_REWARDS),
    "sums": ("built-in single-digit sums (demo)", DEMO_REWARDS),
}
"""``--demo-task``: what the dry-run calls it and its default rewards. ``copy`` is the default."""


def demo_task_rows(task: str) -> list[dict[str, Any]]:
    """The prompts of a ``--demo-task``."""
    return copy_rows() if task == "copy" else demo_rows()


def demo_rows() -> list[dict[str, Any]]:
    """The 25 prompts ``"a+b="`` for digits a, b in 0..4, with their ``answer`` (one digit).

    >>> demo_rows()[8]
    {'prompt': '1+3=', 'answer': '4', 'max_length': 32}
    """
    return [
        {"prompt": f"{a}+{b}=", "answer": str(a + b), "max_length": DEMO_LENGTH_LIMIT}
        for a in range(5)
        for b in range(5)
    ]
