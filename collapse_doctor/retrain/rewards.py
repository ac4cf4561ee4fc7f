"""Built-in reward functions and the ``--reward name=module:function`` resolver.

Every reward function follows TRL's calling convention: keyword arguments ``prompts``,
``completions``, ``completion_ids`` plus one list per extra dataset column (``answer``...), and it
returns one float (or ``None`` for "not applicable") per completion. Built-ins are importable as
``collapse_doctor.retrain.rewards:format_tag`` or by their short names ``format_tag``, ``exact_match``,
``starts_with_answer`` and ``length_limit``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from collapse_doctor.core.errors import UsageError

RewardFunction = Callable[..., list[float | None]]

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
"""What ``format_tag`` looks for and where ``exact_match`` reads the answer from."""
LENGTH_LIMIT_CHARS = 32
"""``length_limit``: completions up to this many characters score 1, longer ones decay to 0."""


def _text(completion: Any) -> str:
    """A completion as text: plain strings as they are, chat completions as their last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def format_tag(completions: Sequence[Any], **_: Any) -> list[float | None]:
    """1.0 when the completion holds an ``<answer>...</answer>`` tag, else 0.0.

    >>> format_tag(["<answer>4</answer>", "4"])
    [1.0, 0.0]
    """
    return [1.0 if ANSWER_TAG.search(_text(c)) else 0.0 for c in completions]


def _answer_of(text: str) -> str:
    match = ANSWER_TAG.search(text)
    return (match.group(1) if match else text).strip()


def exact_match(completions: Sequence[Any], answer: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 when the tagged answer (or the whole completion) equals the ``answer`` column, else 0.0.

    Rows without an answer (``None``) are not applicable and return ``None``.

    >>> exact_match(["<answer>4</answer>", "5", "x"], answer=["4", "4", None])
    [1.0, 0.0, None]
    """
    if answer is None:
        raise UsageError(
            "reward exact_match needs an 'answer' column in the dataset", hint="add it, or use another reward"
        )
    out: list[float | None] = []
    for completion, expected in zip(completions, answer, strict=True):
        if expected is None:
            out.append(None)
        else:
            out.append(1.0 if _answer_of(_text(completion)) == str(expected).strip() else 0.0)
    return out


def starts_with_answer(completions: Sequence[Any], answer: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 when the completion begins with the ``answer`` column's text, else 0.0 (``None`` where no answer).

    >>> starts_with_answer(["7", "7</s>", " 7", "3"], answer=["7", "7", "7", None])
    [1.0, 1.0, 0.0, None]
    """
    if answer is None:
        raise UsageError(
            "reward starts_with_answer needs an 'answer' column in the dataset", hint="add it, or use another reward"
        )
    return [
        None if expected is None else 1.0 if _text(completion).startswith(str(expected)) else 0.0
        for completion, expected in zip(completions, answer, strict=True)
    ]


def length_limit(completions: Sequence[Any], max_length: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 up to a length limit in characters, then linearly down to 0.0 at twice the limit.

    The limit is the row's ``max_length`` dataset column when there is one, else ``LENGTH_LIMIT_CHARS``.

    >>> length_limit(["short", "x" * 48, "x" * 80])
    [1.0, 0.5, 0.0]
    >>> length_limit(["x" * 15], max_length=[10])
    [0.5]
    """
    limits = list(max_length) if max_length is not None else [None] * len(completions)
    out: list[float | None] = []
    for completion, limit in zip(completions, limits, strict=True):
        cap = float(limit) if limit else float(LENGTH_LIMIT_CHARS)
        over = max(0.0, len(_text(completion)) - cap) / cap
        out.append(max(0.0, 1.0 - over))
    return out


BUILTINS: dict[str, RewardFunction] = {
    "format_tag": format_tag,
    "exact_match": exact_match,
    "length_limit": length_limit,
    "starts_with_answer": starts_with_answer,
}


@dataclass(frozen=True)
class RewardSpec:
    """One reward channel: its name (the ``reward/<name>`` column) and the function computing it."""

    name: str
    target: str
    function: RewardFunction


def _import_function(target: str, spec: str) -> RewardFunction:
    if target in BUILTINS:
        return BUILTINS[target]
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"--reward {spec!r}: expected name=module:function",
            hint=f"e.g. format=collapse_doctor.retrain.rewards:format_tag, or a built-in: {', '.join(BUILTINS)}",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"--reward {spec!r}: cannot import module {module_name!r} ({exc})",
            hint="check the module is on PYTHONPATH",
        ) from exc
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        functions = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        )[:8]
        raise UsageError(
            f"--reward {spec!r}: module {module_name!r} has no function {attr!r}",
            hint=f"its functions: {', '.join(functions) or 'none'}; or a built-in: {', '.join(BUILTINS)}",
        )
    return function


def parse_reward(spec: str) -> RewardSpec:
    """Parse ``name=module:function`` (or ``name=builtin``, or a bare built-in name).

    >>> parse_reward("format=collapse_doctor.retrain.rewards:format_tag").name
    'format'
    >>> parse_reward("exact_match").name
    'exact_match'
    """
    name, sep, target = spec.partition("=")
    name, target = name.strip(), target.strip()
    if not sep:
        name, target = name.split(":")[-1], name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name or ""):
        raise UsageError(f"--reward {spec!r}: channel name {name!r} must be a word (letters, digits, _ . -)")
    return RewardSpec(name, target, _import_function(target, spec))


def parse_rewards(specs: Sequence[str]) -> list[RewardSpec]:
    """Parse every ``--reward``; channel names must be unique."""
    if not specs:
        raise UsageError("no reward function given", hint="pass --reward name=module:function (once per channel)")
    parsed = [parse_reward(s) for s in specs]
    names = [p.name for p in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"--reward: channel {duplicates[0]!r} given twice", hint="give each channel its own name")
    return parsed


def named_reward(spec: RewardSpec) -> RewardFunction:
    """The function under its channel name: TRL logs ``rewards/<__name__>/mean``."""

    @functools.wraps(spec.function)
    def reward(*args: Any, **kwargs: Any) -> list[float | None]:
        return spec.function(*args, **kwargs)

    reward.__name__ = spec.name
    reward.__qualname__ = spec.name
    return reward
