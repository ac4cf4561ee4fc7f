"""`collapse-doctor advantages` reads the trainer layouts that `scan` sniffs (TRL completions, verl JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.errors import InputError
from collapse_doctor.pipeline.export import export_advantages
from tests.helpers.scalar_runs import trl_series, write_events
from tests.helpers.trl import GROUPS, SIZE, STEPS, trl_output_dir

runner = CliRunner()


def test_exports_a_trl_output_dir(tmp_path: Path) -> None:
    root = trl_output_dir(tmp_path / "trl")
    out = tmp_path / "adv.parquet"
    result = runner.invoke(app, ["advantages", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.num_rows == STEPS * GROUPS * SIZE
    assert {"adv/grpo", "adv/gdpo", "advantage"} <= set(table.column_names)
    # TRL logged plain group-scaled GRPO: the recomputation agrees with it.
    np.testing.assert_allclose(
        table.column("adv/grpo").to_numpy(), table.column("advantage").to_numpy(), atol=1e-3, rtol=1e-3
    )


def test_exports_verl_rollout_jsonl(tmp_path: Path) -> None:
    dump = tmp_path / "rollouts"
    dump.mkdir()
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        rows = [
            {"input": f"q{g}", "output": "o", "step": step, "acc": float(rng.random() < 0.5), "format": 1.0}
            for g in range(GROUPS)
            for _ in range(SIZE)
        ]
        (dump / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = export_advantages([dump], tmp_path / "adv.parquet", device="cpu")
    assert summary.rows == 3 * GROUPS * SIZE and summary.steps == 3
    assert summary.channels == ("acc", "format")


def test_a_scalar_log_alone_has_nothing_to_export(tmp_path: Path) -> None:
    write_events(tmp_path / "runs" / "a", trl_series())
    with pytest.raises(InputError, match="no rollouts found"):
        export_advantages([tmp_path / "runs"], tmp_path / "adv.parquet", device="cpu")
    assert not (tmp_path / "adv.parquet").exists()
