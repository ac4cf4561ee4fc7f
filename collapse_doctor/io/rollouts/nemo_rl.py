"""NeMo-RL GRPO training data: ``<log_dir>/.../train_data_step<N>.jsonl``.

NeMo-RL's logger writes, per step, one JSON object per sample with the message ``content`` (prompt
messages, then the response), ``rewards`` (the total reward), ``advantages`` (per token), masks, lengths and
log-probabilities. The step comes from the file name. The prompt is the content without its last message;
samples with the same prompt in a step are a group (NeMo-RL repeats each prompt
``num_generations_per_prompt`` times). The single channel is ``reward``; the logged advantage is the
advantage of the first token that counts for the loss.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from collapse_doctor.core.errors import SchemaError
from collapse_doctor.io.rollouts.jsonl import read_jsonl
from collapse_doctor.io.rollouts.table_run import TableRun

FILE_NAME = re.compile(r"train_data_step(\d+)\.jsonl")
"""NeMo-RL's training data file name, ``train_data_step<N>.jsonl``."""


def _prompt_and_completion(content: Any) -> tuple[str, str]:
    if isinstance(content, list) and content:
        parts = [m if isinstance(m, str) else json.dumps(m, sort_keys=True) for m in content]
        return "\n".join(parts[:-1]), parts[-1]
    return "", str(content)


def _advantage(value: Any, mask: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list) and value:
        flat = value[0] if isinstance(value[0], list) else value
        if isinstance(mask, list) and len(mask) == len(flat):
            for v, m in zip(flat, mask, strict=True):
                if m:
                    return float(v)
        nonzero = [v for v in flat if v]
        return float(nonzero[0]) if nonzero else 0.0
    return None


def open_nemo_rl(
    files: Sequence[Path],
    *,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    **_: object,
) -> TableRun:
    """Read NeMo-RL ``train_data_step<N>.jsonl`` files into one canonical run."""
    steps, prompts, completions, rewards, advantages = [], [], [], [], []
    for path in files:
        found = FILE_NAME.fullmatch(path.name)
        step = int(found.group(1)) if found else 0
        for number, row in enumerate(read_jsonl(path), start=1):
            if "rewards" not in row:
                raise SchemaError(
                    f"{path}: line {number} has no 'rewards' key; found keys: {sorted(row)}",
                    hint="pass NeMo-RL train_data_step<N>.jsonl files",
                )
            if group_size is None and "content" not in row:
                raise SchemaError(
                    f"{path}: line {number} has no 'content' key, so groups cannot be rebuilt from the prompt; "
                    f"found keys: {sorted(row)}",
                    hint="pass --group-size N if the samples of one prompt are consecutive",
                )
            prompt, completion = _prompt_and_completion(row.get("content"))
            reward = row["rewards"]
            steps.append(step)
            prompts.append(prompt)
            completions.append(completion)
            try:
                rewards.append(float(reward[0] if isinstance(reward, list) else reward))
            except (TypeError, ValueError, IndexError) as exc:
                raise SchemaError(
                    f"{path}: line {number}: 'rewards' is not a number: {' '.join(repr(reward).split())[:80]}",
                    hint="NeMo-RL logs the total reward of each sample as a number (or a one-element list)",
                ) from exc
            advantages.append(_advantage(row.get("advantages"), row.get("token_loss_mask")))
    columns: dict[str, Any] = {
        "step": pa.array(steps, pa.int64()),
        "reward/reward": pa.array(rewards, pa.float64()),
        "prompt": pa.array(prompts),
        "completion": pa.array(completions),
    }
    if any(a is not None for a in advantages):
        columns["advantage"] = pa.array(advantages, pa.float64())
    return TableRun(pa.table(columns), label=files[0].parent, sources=files, group_size=group_size, weights=weights)
