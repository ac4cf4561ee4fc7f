"""The ``--demo`` task: a tiny Llama built in code, a character tokenizer, and single-digit sums.

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
