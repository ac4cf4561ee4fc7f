"""Report test helpers: a run whose log text carries script payloads, and reading a page's figure data."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa

PAYLOAD_CHANNEL = '<img src=x onerror="window.__xss=1">'
PAYLOAD_SCRIPT = "<script>window.__xss=1</script>"


def payload_table(steps: int = 30, groups: int = 4, group_size: int = 8) -> pa.Table:
    """A run whose channel names, group ids, prompts and completions carry script payloads."""
    rng = np.random.default_rng(0)
    n = steps * groups * group_size
    group_names = [f"{PAYLOAD_SCRIPT}{g}" for g in range(groups)]
    prompts = [f"prompt {PAYLOAD_SCRIPT} {g} " + "words " * 40 for g in range(groups)]
    return pa.table(
        {
            "step": np.repeat(np.arange(steps), groups * group_size),
            "group_id": np.tile(np.repeat(group_names, group_size), steps),
            "reward/format": (rng.random(n) < 0.5).astype(np.float32),
            f"reward/{PAYLOAD_CHANNEL}": rng.random(n).astype(np.float32),
            "prompt": np.tile(np.repeat(prompts, group_size), steps),
            "completion": [
                f"{PAYLOAD_CHANNEL} {PAYLOAD_SCRIPT} completion {i} " + ("long " * 40 if i % 2 else "")
                for i in range(n)
            ],
        }
    )


def report_data(page: str) -> dict[str, Any]:
    """The figure data a report page embeds (the ``report-data`` JSON script)."""
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data
