"""Every run of the real-TRL corpus scanned and held to its manifest's expected diagnosis.

One test per run (``tests/data/trl_corpus/<run>/``, xdist spreads them), scanned with the default options on the
CPU, read through ``Diagnosis.to_dict()`` and scored by ``benchmarks/accuracy_scoring.py``, the module the accuracy
benchmark (``benchmarks/bench_accuracy.py``) uses. A failure lists every missed expectation, one line each, tagged
with its category: ``[verdict]``, ``[expect]`` (code, channels, expected severity range vs what was found),
``[forbid]``, ``[max_warning]``, ``[channel_state]``, ``[signal_budget]``, ``[gdpo_resolves]``, ``[weights]``,
``[remedy]``, ``[crash]``, ``[scan]``.

The expectations come from the reward math (tests/data/trl_corpus/README.md); never edit them to match the tool.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.scan import diagnose
from tests.helpers.paths import ROOT

CORPUS = ROOT / "tests" / "data" / "trl_corpus"
MANIFEST = CORPUS / "manifest.json"
CATEGORY_ORDER = (
    "[scan]",
    "[crash]",
    "[verdict]",
    "[expect]",
    "[forbid]",
    "[max_warning]",
    "[remedy]",
    "[gdpo_resolves]",
    "[weights]",
    "[channel_state]",
    "[signal_budget]",
)


def _load_scoring() -> ModuleType:
    """benchmarks/accuracy_scoring.py by path (benchmarks/ is not a package)."""
    name = "accuracy_scoring"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "accuracy_scoring.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


scoring = _load_scoring()
ENTRIES: dict[str, dict[str, Any]] = (
    {entry["run"]: entry for entry in json.loads(MANIFEST.read_text())["runs"]} if MANIFEST.exists() else {}
)


def _report(run: str, lines: list[str]) -> str:
    def order(line: str) -> int:
        tag = line.split(" ", 1)[0]
        return CATEGORY_ORDER.index(tag) if tag in CATEGORY_ORDER else len(CATEGORY_ORDER)

    ordered = sorted(lines, key=order)
    return f"{run}: {len(ordered)} expectation(s) missed\n  " + "\n  ".join(ordered)


@pytest.mark.parametrize("run", sorted(ENTRIES))
def test_corpus_run_matches_manifest(run: str) -> None:
    entry = ENTRIES[run]
    try:
        diagnosis = diagnose([CORPUS / run], ScanOptions(device="cpu")).to_dict(include_series=False)
    except Exception as exc:
        raise AssertionError(f"{run}: [scan] the scan raised {type(exc).__name__}: {exc}") from exc
    score = scoring.score_run(entry, diagnosis)
    if score["failures"]:
        pytest.fail(_report(run, score["failures"]))


def test_corpus_is_complete() -> None:
    assert len(ENTRIES) == 70, f"manifest lists {len(ENTRIES)} runs"
    missing = [run for run in ENTRIES if not (CORPUS / run / "completions").is_dir()]
    assert not missing, f"run directories without completions/: {missing}"


# ---------------------------------------------------------------------------------------------------
# the instrument itself: a scan that says exactly what the manifest expects must score clean


def _ideal_diagnosis(entry: dict[str, Any]) -> dict[str, Any]:
    expected = entry["expected"]
    resolves = {code: spec["resolves"] for code, spec in expected.get("gdpo_resolves", {}).items()}
    findings = [
        {
            "code": scoring.code_names(item["code"])[0],
            "severity": item["min_severity"],
            "channels": list(item.get("channels") or []),
            "onset_step": 1,
            "title": item.get("title_example", ""),
            "remedy": "",
            "actions": list(item.get("actions_include") or []),
            "evidence": {key: (low + high) / 2 for key, (low, high) in (item.get("evidence_ranges") or {}).items()},
            "gdpo_resolves": resolves.get(item["code"]),
        }
        for item in expected["expect"]
    ]
    budget = {
        key: (bounds[0] + bounds[1]) / 2
        for key, bounds in expected["signal_budget"].items()
        if isinstance(bounds, list) and len(bounds) == 2
    }
    signal = {scoring.SIGNAL_KEYS[key][0]: value for key, value in budget.items()}
    weights = expected.get("weights_inferred") or {c: spec.get("weight", 1.0) for c, spec in entry["channels"].items()}
    run: dict[str, Any] = {"weights": {c: 3.0 * w for c, w in weights.items()}, "signal": signal}
    for fact in expected.get("run_expect") or []:  # the run facts, each as the scan would say it
        *parents, name = fact["field"].split(".")
        block = run
        for parent in parents:
            block = block.setdefault(parent, {})
        if "equals" in fact:
            block[name] = fact["equals"]
        elif "contains" in fact:
            block[name] = f"... {fact['contains']} ..."
        elif "any_startswith" in fact:
            block[name] = [f"{fact['any_startswith']} ..."]
    return {
        "verdict": expected["verdict"][0].lower().replace(" ", "_"),
        "run": run,
        "channels": [{"channel": c, "state": s} for c, s in expected["channel_states"].items()],
        "findings": findings,
    }


@pytest.mark.parametrize("run", sorted(ENTRIES))
def test_scoring_accepts_the_expected_diagnosis(run: str) -> None:
    entry = ENTRIES[run]
    score = scoring.score_run(entry, _ideal_diagnosis(entry))
    if score["failures"]:
        pytest.fail(_report(run, score["failures"]))


def test_scoring_flags_contradicting_remedies() -> None:
    diagnosis = {
        "verdict": "at_risk",
        "run": {"weights": {"correct": 1.0, "numeric": 1.0}},
        "channels": [{"channel": "correct", "state": "floor"}, {"channel": "numeric", "state": "ranking"}],
        "findings": [
            {
                "code": "CD101",
                "severity": "warning",
                "channels": ["correct"],
                "remedy": "lower `correct`'s weight (e.g. retrain --weights correct=0.1) or drop it, or switch to "
                "GDPO: collapse-doctor retrain --algo gdpo --from-scan scan.json",
                "gdpo_resolves": False,
            },
            {
                "code": "CD301",
                "severity": "warning",
                "channels": ["correct", "numeric"],
                "remedy": "adapt the channel weights per step: collapse-doctor retrain --algo gdpo-dynamic",
                "gdpo_resolves": False,
            },
        ],
    }
    kinds = sorted(c["kind"] for c in scoring.remedy_contradictions(diagnosis))
    assert kinds == ["gdpo_unresolved", "lower_floor"]


def test_scoring_doctests() -> None:
    result = doctest.testmod(scoring)
    assert result.failed == 0 and result.attempted > 0
