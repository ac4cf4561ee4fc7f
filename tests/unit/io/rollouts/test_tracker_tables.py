"""TRL's completions table read from W&B's files: recognition, the run's config, repeats, chat prompts, errors.

The tables TRL itself logs through wandb and trackio are read in tests/e2e/test_tracker_tables.py; here the layouts
are written by hand to reach the cases a tiny training does not (a user's own table, a damaged file, chat prompts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.rollouts import tracker_tables
from collapse_doctor.io.rollouts.tracker_tables import TrainerSettings, is_wandb_table, open_wandb_tables
from collapse_doctor.io.rollouts.trl import open_trl_completions

TABLES = Path("wandb/offline-run-20261205_000000-abc123/files/media/table")


def rows(step: int, shift: float = 0.0, prompt: Any = None) -> list[dict[str, Any]]:
    """2 prompts x 4 completions; ``advantage`` is TRL RLOO's (beta 0) of ``r``: r_i - mean of the other three."""
    out = []
    for g in range(2):
        rewards = [float((i * (g + 2)) % 3) + shift for i in range(4)]
        for i, r in enumerate(rewards):
            others = (sum(rewards) - r) / 3
            out.append(
                {
                    "step": step,
                    "prompt": prompt if prompt is not None else f"q{g}",
                    "completion": f"a{g}{i}",
                    "r": r,
                    "advantage": r - others,
                }
            )
    return out


def write_table(root: Path, wandb_step: int, digest: str, table_rows: list[dict[str, Any]]) -> Path:
    directory = root / TABLES
    directory.mkdir(parents=True, exist_ok=True)
    columns = list(table_rows[0])
    path = directory / f"completions_{wandb_step}_{digest}.table.json"
    path.write_text(json.dumps({"columns": columns, "data": [[r[c] for c in columns] for r in table_rows]}))
    return path


def test_only_tables_with_trls_columns_in_a_wandb_run_are_rollouts(tmp_path: Path) -> None:
    trl = write_table(tmp_path, 1, "aa", rows(1))
    assert is_wandb_table(trl)
    own = write_table(tmp_path, 2, "bb", [{"step": 1, "prompt": "p", "completion": "c"}])
    assert not is_wandb_table(own), "a user's own table named completions, without rewards and advantages"
    elsewhere = tmp_path / "completions_1_aa.table.json"
    elsewhere.write_text(trl.read_text())
    assert not is_wandb_table(elsewhere)
    damaged = write_table(tmp_path, 3, "cc", rows(1))
    damaged.write_text('{"columns": ["step", ')
    assert not is_wandb_table(damaged)


def test_a_batch_logged_again_is_read_once_and_steps_follow_the_table(tmp_path: Path) -> None:
    files = [
        write_table(tmp_path, 10, "aa", rows(1)),
        write_table(tmp_path, 21, "bb", rows(2, shift=1.0)),
        write_table(tmp_path, 23, "bb", rows(2, shift=1.0)),  # TRL's last log at the end of training
    ]
    run = open_wandb_tables(files)
    assert run.num_rows == 16
    assert [b.step for b in run.iter_steps()] == [1, 2]
    assert run.channels == ("r",)


def test_without_a_config_the_advantages_are_kept_out_and_said_why(tmp_path: Path) -> None:
    run = open_wandb_tables([write_table(tmp_path, 1, "aa", rows(1))])
    assert run.columns.advantage is None
    assert any("config was not found" in w for w in run.notes.warnings())


@pytest.mark.parametrize(
    ("config", "compared", "said"),
    [
        ({"normalize_advantages": False, "beta": 0.0}, True, None),
        ({"normalize_advantages": False, "beta": 0.05}, False, "beta=0.05"),
        ({"normalize_advantages": True}, False, "without a beta"),
        ({"scale_rewards": "group", "beta": 0.04}, True, None),  # GRPO keeps its KL in the loss
        ({}, False, "config was not found"),
    ],
    ids=["rloo-beta0", "rloo-kl", "rloo-no-beta", "grpo", "none"],
)
def test_which_advantages_are_compared(config: dict[str, Any], compared: bool, said: str | None) -> None:
    why = TrainerSettings.of(config).unchecked_advantages()
    assert (why is None) == compared
    if said is not None:
        assert why is not None and said in why


def test_chat_prompts_group_as_in_trls_parquet(tmp_path: Path) -> None:
    """Conversational prompts (lists of messages) become the same text as the TRL Parquet adapter makes of them,
    so the same rollouts group alike whichever file they came from."""
    chat = [{"role": "user", "content": "2+2="}]
    table_rows = rows(1, prompt=chat)
    run = open_wandb_tables([write_table(tmp_path, 1, "aa", table_rows)])
    parquet = tmp_path / "completions" / "completions_00001.parquet"
    parquet.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(table_rows), parquet)
    reference = open_trl_completions([parquet])
    assert [b.num_groups for b in run.iter_steps()] == [b.num_groups for b in reference.iter_steps()]


def test_unique_prompts_is_an_error_naming_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [write_table(tmp_path, 1, "aa", rows(1))]
    config = {"log_unique_prompts": True, "scale_rewards": "group"}
    monkeypatch.setattr(tracker_tables, "_wandb_config", lambda root: config)
    with pytest.raises(InputError, match="log_unique_prompts=True"):
        open_wandb_tables(files)


def test_a_table_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    path = write_table(tmp_path, 1, "aa", rows(1))
    path.write_text('{"columns": ["step", "prompt", "completion", "r", "advantage"], "data": [[1, "q0"')
    with pytest.raises(InputError, match=r"completions_1_aa\.table\.json: cannot read the W&B table"):
        open_wandb_tables([path])
