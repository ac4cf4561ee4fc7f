"""The estimators table as the text and HTML reports show it."""

from __future__ import annotations

import io
from pathlib import Path

import collapse_doctor
from collapse_doctor.report.html.page import build_report
from collapse_doctor.report.text import counterfactual_rows, render_text
from tests.helpers.runs import binary_run

TABLE = {
    "sample": {"groups_per_step": 64, "groups": 640, "rollouts": 5120, "differing_pairs": 9000},
    "own": "rloo",
    "estimators": [
        {
            "estimator": "grpo",
            "algorithm": "grpo",
            "label": "GRPO",
            "own": False,
            "zero_advantage_share": 0.3,
            "tied_pair_share": 0.1,
            "decides": {"a": 0.7, "b": 0.3},
        },
        {
            "estimator": "rloo",
            "algorithm": "rloo",
            "label": "RLOO",
            "own": True,
            "zero_advantage_share": 0.3,
            "tied_pair_share": 0.1,
            "decides": {"a": 0.7, "b": 0.3},
        },
        {"estimator": "opo", "algorithm": "opo", "label": "OPO", "own": False, "not_computed": "needs x"},
        {
            "estimator": "reinforce_plus_plus",
            "algorithm": "reinforce_plus_plus",
            "label": "R++",
            "own": False,
            "zero_advantage_share": 0.0,
            "tied_pair_share": 0.1,
            "decides": {"a": 0.8, "b": 0.2},
            "note": "rows weighted once",
        },
    ],
}


def test_equal_rows_merge_with_the_runs_own_first() -> None:
    rows = counterfactual_rows(TABLE)
    assert rows[0]["names"] == ["RLOO", "GRPO"] and rows[0]["own"]
    assert rows[0]["cells"] == ("30%", "10%", "a 70%, b 30%")
    assert rows[1] == {"names": ["OPO"], "own": False, "note": "needs x"}
    assert rows[2]["names"] == ["REINFORCE++"] and rows[2]["note"] == "rows weighted once"


def test_a_noted_row_never_merges_and_many_channels_show_the_deciding_four() -> None:
    decides = {f"c{k}": share for k, share in enumerate([0.05, 0.4, 0.1, 0.02, 0.3, 0.13])}
    same = {"zero_advantage_share": 0.3, "tied_pair_share": 0.1, "decides": decides}
    table = TABLE | {
        "estimators": [
            {"estimator": "grpo", "algorithm": "grpo", "label": "GRPO", "own": True, **same},
            {
                "estimator": "reinforce_plus_plus_baseline",
                "algorithm": "reinforce_plus_plus_baseline",
                "label": "x",
                "own": False,
                **same,
                "note": "rows weighted once",
            },
        ]
    }
    rows = counterfactual_rows(table)
    assert [row["names"] for row in rows] == [["GRPO"], ["REINFORCE++ (group baseline)"]]
    assert rows[0]["cells"][2] == "c1 40%, c2 10%, c4 30%, c5 13%, 2 more"


def test_text_and_html_show_the_table_of_a_scan(tmp_path: Path) -> None:
    d = collapse_doctor.diagnose(binary_run(tmp_path / "run.parquet", pass_rates={"a": 0.5, "b": 0.3}))
    out = io.StringIO()
    render_text(d, out, color=False, width=110)
    text = out.getvalue()
    assert "Estimators on the same rewards (1,920 groups, up to 64 per step)" in text
    assert "(run)" in text.split("Estimators on the same rewards")[1].split("Findings")[0]
    page = build_report(d)
    assert 'id="estimators"' in page and "<span class='muted'>(run)</span>" in page
    assert "needs completion_length" in page  # OPO without lengths
