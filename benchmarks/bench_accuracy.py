"""Accuracy benchmark: scan every labelled run and score the diagnosis against what the run should get.

Run:  .venv/bin/python benchmarks/bench_accuracy.py [--markdown] [--json OUT] [--strict]

Three suites. The TRL corpus (``tests/data/trl_corpus/*/``, one scan per run directory, expectations in its
``manifest.json``, reasoned from the reward math), the simulator (``collapse_doctor.pipeline.simulate``, each scenario
for a few seeds, expectations from the ground truth in the file's metadata), and simulated scalar logs
(:data:`SCALAR_SCENARIOS`: TensorBoard files written with torch's ``SummaryWriter`` under TRL's tag names, with
the run-health pathologies CD507-CD511 built in and their expected findings written next to them). Every scan uses
the default options on the CPU and is read through ``Diagnosis.to_dict()``, the JSON users see. Scoring:
``accuracy_scoring.py`` (shared with ``tests/e2e/test_corpus.py``); method: ``docs/accuracy.md``. Output: the totals
and targets, a per-class table per suite (one row per scenario family: its runs over algorithms and seeds; also
``per_class`` in ``--json``), then each suite's tables. ``--corpus DIR`` scores another corpus (e.g. one built with
``scripts/build_trl_corpus.py --out DIR``).

The exit status is 0 (it is a measurement), or with ``--strict`` 1 when a target is missed: every expected finding
found at the expected severity, no warning on a healthy run, no remedy that contradicts the scan's own numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_scoring as scoring  # benchmarks/ is not a package: found through sys.path above

from collapse_doctor.core.options import ScanOptions
from collapse_doctor.pipeline.scan import diagnose
from collapse_doctor.pipeline.simulate import GROUND_TRUTH_KEY, SCENARIOS, write_simulation

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "trl_corpus"


# ---------------------------------------------------------------------------------------------------
# scanning


def scan(paths: Sequence[Path], device: str) -> tuple[dict[str, Any], float]:
    """The scan's JSON (without the per-step series) and its wall time; ``{"error": ...}`` when it fails."""
    start = time.perf_counter()
    try:
        out = diagnose([str(p) for p in paths], ScanOptions(device=device)).to_dict(include_series=False)
    except Exception as exc:  # a benchmark reports a crashed scan, it does not stop
        out = {"error": f"{type(exc).__name__}: {exc}"}
    return out, time.perf_counter() - start


def corpus_scores(corpus: Path, device: str, only: str | None) -> list[dict[str, Any]]:
    manifest = json.loads((corpus / "manifest.json").read_text())
    scores = []
    for entry in manifest["runs"]:
        if only and only not in entry["run"]:
            continue
        diagnosis, seconds = scan([corpus / entry["run"]], device)
        score = scoring.score_run(entry | {"suite": "corpus"}, diagnosis)
        score["seconds"] = round(seconds, 3)
        scores.append(score)
    return scores


def simulator_scores(args: argparse.Namespace) -> list[dict[str, Any]]:
    scores = []
    with tempfile.TemporaryDirectory(prefix="cd-accuracy-") as tmp:
        for seed in args.seeds:
            for scenario in SCENARIOS:
                name = f"sim:{scenario}-s{seed}"
                if args.only and args.only not in name:
                    continue
                path = Path(tmp) / f"{scenario}-s{seed}.parquet"
                write_simulation(
                    path, scenario, steps=args.steps, groups=args.groups, group_size=args.group_size, seed=seed
                )
                truth = json.loads(pq.read_schema(path).metadata[GROUND_TRUTH_KEY])
                diagnosis, seconds = scan([path], args.device)
                score = scoring.score_run(scoring.simulation_entry(truth, name), diagnosis)
                score["seconds"] = round(seconds, 3)
                scores.append(score)
    return scores


# ---------------------------------------------------------------------------------------------------
# simulated scalar logs (run health, CD507-CD511)

SCALAR_STEPS = 200
EVAL_EVERY = 10


def _healthy_scalars(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A healthy TRL GRPO log: reward 0.3 -> 0.7, entropy 0.8 -> 0.6, grad norm ~0.3 (25% noise), clipping ~1% per
    side, and a held-out reward every 10 steps rising with the training reward."""
    t = np.arange(SCALAR_STEPS)
    e = np.arange(EVAL_EVERY, SCALAR_STEPS, EVAL_EVERY)
    low = np.clip(0.01 * (1 + 0.2 * rng.standard_normal(len(t))), 0, 1)
    high = np.clip(0.012 * (1 + 0.2 * rng.standard_normal(len(t))), 0, 1)
    return {
        "train/reward": (t, 0.3 + 0.4 * t / SCALAR_STEPS + 0.05 * rng.standard_normal(len(t))),
        "train/entropy": (t, (0.8 - 0.2 * t / SCALAR_STEPS) * (1 + 0.05 * rng.standard_normal(len(t)))),
        "train/grad_norm": (t, 0.3 * np.exp(0.25 * rng.standard_normal(len(t)))),
        "train/clip_ratio/low_mean": (t, low),
        "train/clip_ratio/high_mean": (t, high),
        "train/clip_ratio/region_mean": (t, low + high),
        "eval/reward": (e, 0.3 + 0.35 * e / SCALAR_STEPS + 0.01 * rng.standard_normal(len(e))),
    }


def _scalar_case(scenario: str, rng: np.random.Generator) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """One scenario's series and its expected findings (severity range and onset where the math fixes them)."""
    series = _healthy_scalars(rng)
    t = np.arange(SCALAR_STEPS)
    e = np.arange(EVAL_EVERY, SCALAR_STEPS, EVAL_EVERY)
    noise = rng.standard_normal(len(t))
    expect: list[dict[str, Any]] = []
    healthy = False

    def finding(code: str, low: str, high: str, onset: int | None = None) -> None:
        item: dict[str, Any] = {"code": code, "min_severity": low, "max_severity": high}
        if onset is not None:
            item["onset_step"] = onset
        expect.append(item)

    if scenario == "healthy":
        healthy = True
    elif scenario == "converged":  # the reward saturates by ~step 60 (within 0.3% of 0.8): a plateau, information
        healthy = True
        series["train/reward"] = (t, 0.8 - 0.5 * np.exp(-t / 15) + 0.02 * noise)
        del series["eval/reward"]
        finding("CD507", "info", "info")
    elif scenario == "regression":  # best at step 60, back to the start by step 120
        series["train/reward"] = (t, np.interp(t, [0, 60, 120, SCALAR_STEPS], [0.3, 0.7, 0.3, 0.3]) + 0.02 * noise)
        del series["eval/reward"]
        finding("CD507", "warning", "warning", onset=60)
    elif scenario == "clip-saturation":  # 35% clipped, 30% on the high side (also a one-sided-clip finding)
        low, high = 0.05 * (1 + 0.1 * noise), 0.30 * (1 + 0.1 * rng.standard_normal(len(t)))
        series["train/clip_ratio/low_mean"], series["train/clip_ratio/high_mean"] = (t, low), (t, high)
        series["train/clip_ratio/region_mean"] = (t, low + high)
        finding("CD508", "warning", "warning", onset=0)
    elif scenario == "grad-nonfinite":  # the norm is NaN from step 180 on: diverged
        norm = series["train/grad_norm"][1].copy()
        norm[180:] = np.nan
        series["train/grad_norm"] = (t, norm)
        finding("CD509", "critical", "critical", onset=180)
    elif scenario == "grad-spikes":  # 5 spikes of 10x the norm
        norm = series["train/grad_norm"][1].copy()
        at = rng.choice(np.arange(20, 190), 5, replace=False)
        norm[at] *= 10
        series["train/grad_norm"] = (t, norm)
        finding("CD509", "warning", "warning", onset=int(at.min()))
    elif scenario == "reward-hacking-flat":  # the training reward rises, the held-out reward stays at 0.45
        series["eval/reward"] = (e, 0.45 + 0.01 * rng.standard_normal(len(e)))
        finding("CD510", "warning", "warning")
        finding("CD507", "info", "info")  # judged on the held-out score: it never rose (no learning)
    elif scenario == "reward-hacking-falling":  # ... and falls from 0.5 to 0.3
        series["eval/reward"] = (e, 0.5 - 0.2 * e / SCALAR_STEPS + 0.01 * rng.standard_normal(len(e)))
        finding("CD510", "critical", "critical")
        finding("CD507", "warning", "warning")  # judged on the held-out score: it fell from its first points
    elif scenario == "entropy-arrival":  # entropy 0.8 exp(-t/250) while the reward stays at 0.5
        series["train/entropy"] = (t, 0.8 * np.exp(-t / 250) * (1 + 0.02 * noise))
        series["train/reward"] = (t, 0.5 + 0.02 * rng.standard_normal(len(t)))
        del series["eval/reward"]
        finding("CD511", "warning", "warning", onset=100)
        finding("CD507", "info", "info")  # a flat reward over the whole run: no learning
    else:  # pragma: no cover - the list below is the only caller
        raise ValueError(scenario)
    return series, {"scenario": scenario, "healthy": healthy, "expect": expect}


SCALAR_SCENARIOS = (
    "healthy",
    "converged",
    "regression",
    "clip-saturation",
    "grad-nonfinite",
    "grad-spikes",
    "reward-hacking-flat",
    "reward-hacking-falling",
    "entropy-arrival",
)
"""The run-health scenarios; CD511's onset is where its fitted stretch starts (the last half of the log)."""


def write_scalar_log(directory: Path, series: dict[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    """One event file, each tag at its own steps, written by torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(directory))
    for step, tag, value in sorted(
        (int(s), tag, float(v)) for tag, (steps, values) in series.items() for s, v in zip(steps, values, strict=True)
    ):
        writer.add_scalar(tag, value, step)
    writer.close()
    return directory


def scalar_scores(args: argparse.Namespace) -> list[dict[str, Any]]:
    scores = []
    with tempfile.TemporaryDirectory(prefix="cd-accuracy-scalars-") as tmp:
        for seed in args.seeds:
            for scenario in SCALAR_SCENARIOS:
                name = f"scalars:{scenario}-s{seed}"
                if args.only and args.only not in name:
                    continue
                series, truth = _scalar_case(scenario, np.random.default_rng(1000 + seed))
                path = write_scalar_log(Path(tmp) / f"{scenario}-s{seed}" / "runs", series)
                diagnosis, seconds = scan([path], args.device)
                score = scoring.score_run(scoring.scalar_entry(truth | {"seed": seed}, name), diagnosis)
                score["seconds"] = round(seconds, 3)
                scores.append(score)
    return scores


# ---------------------------------------------------------------------------------------------------
# tables


class Table:
    def __init__(self, title: str, headers: Sequence[str], note: str = "") -> None:
        self.title, self.headers, self.note = title, list(headers), note
        self.rows: list[list[str]] = []

    def add(self, *cells: Any) -> None:
        self.rows.append(["" if c is None else str(c) for c in cells])

    def render(self, markdown: bool, level: int = 3) -> str:
        lines = [f"{'#' * level} {self.title}" if markdown else f"== {self.title} ==", ""]
        if self.note:
            lines += [self.note, ""]
        if not self.rows:
            return "\n".join([*lines, "(none)", ""])
        if markdown:
            esc: Callable[[str], str] = lambda s: s.replace("|", "\\|")  # noqa: E731
            lines.append("| " + " | ".join(self.headers) + " |")
            lines.append("|" + "|".join("---" for _ in self.headers) + "|")
            lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        else:
            widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(self.headers)]
            lines.append("  ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=True)).rstrip())
            lines.append("  ".join("-" * w for w in widths))
            lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in self.rows]
        return "\n".join([*lines, ""])


MARK = {"ok": "ok", "fail": "FAIL", "n/a": "n/a", "skip": "-"}


def _ratio(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "-"
    scored = [r for r in rows if r["status"] != "skip"]
    if scored and all(r["status"] == "n/a" for r in scored):
        return "n/a"
    return f"{sum(1 for r in scored if r['status'] == 'ok')}/{len(scored)}" if scored else "-"


def _name(code: str, channels: Sequence[str] | None) -> str:
    return f"{code}[{','.join(channels)}]" if channels else code


def _sev_range(row: dict[str, Any]) -> str:
    low, high = row["min_severity"], row["max_severity"]
    return low if low == high else f"{low}..{high}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def tables(scores: Sequence[dict[str, Any]]) -> list[Table]:
    runs = Table(
        "Runs",
        ["run", "verdict expected", "found", "expected findings", "false alarms", "states", "budget", "gdpo", "weights",
         "contradictions", "pass"],
        "expected findings: at the expected severity / expected; states, budget, gdpo: ok / compared "
        "(n/a: the scan does not report it); pass: every expectation of the run met.",
    )  # fmt: skip
    expect = Table(
        "Expected findings",
        ["run", "finding", "expected", "found", "status", "onset error"],
        "found: the severity and channels of the best-matching finding of that code; onset error in steps "
        "(found - truth) where the truth has an onset.",
    )
    alarms = Table("False alarms", ["run", "finding", "severity", "why"])
    crashes = Table("Detector crashes", ["run", "code", "message"])
    errors = Table("Scan errors", ["run", "error"])
    unexpected = Table(
        "Other findings at warning or worse",
        ["run", "finding", "severity"],
        "neither expected nor forbidden on a run without max_warning (not counted as false alarms).",
    )
    states = Table("Channel states", ["run", "expected -> reported", "status"])
    budget = Table("Signal budget", ["run", "share: expected range -> found", "status"])
    gdpo = Table(
        "gdpo_resolves", ["run", "code", "expected", "found", "status"], "only codes the scan reported on the run."
    )
    weights = Table("Inferred weights", ["run", "expected (up to scale)", "found", "weights_source", "status"])
    contradictions = Table("Remedy contradictions", ["run", "finding", "kind", "remedy"])
    facts = Table("Run facts", ["run", "run.<field>", "expected", "found", "status"])
    for s in scores:
        run = s["run"]
        v = s["verdict"]
        found = sum(1 for r in s["expect"] if r["status"] == "ok")
        runs.add(
            run,
            " / ".join(v["expected"]) if v["expected"] else "-",
            f"{v['found'] or 'error'}{'' if v['status'] in ('ok', 'skip') else ' ✗'}",
            f"{found}/{len(s['expect'])}" if s["expect"] else "-",
            len(s["false_alarms"]),
            _ratio(s["channel_states"]),
            _ratio(s["signal_budget"]),
            _ratio(s["gdpo_resolves"]),
            MARK[s["weights"]["status"]] if s.get("weights") else "-",
            len(s["remedy_contradictions"]),
            "FAIL" if s["failures"] else "ok",
        )
        for r in s["expect"]:
            if r["found"]:
                got = f"{r['found_severity']} {_name(r['found_code'] or r['code'], r['found_channels'])}"
            elif r["status"] == "wrong_channels":
                got = "only on " + "; ".join(",".join(c) or "(no channel)" for c in r["other_channels"])
            elif r["status"] == "crashed":
                got = f"crashed: {r['crash']}"
            else:
                got = "-"
            if r["status"] == "wrong_detail":
                got += " (" + "; ".join(r.get("detail_misses") or []) + ")"
            expect.add(
                run,
                _name(r["code"], r["channels"]),
                _sev_range(r),
                got,
                r["status"],
                _fmt(r.get("onset_error")) if "onset_expected" in r else "",
            )
        for a in s["false_alarms"]:
            alarms.add(run, _name(a["code"], a["channels"]), a["severity"], "; ".join(a["reasons"]))
        if s.get("error"):
            errors.add(run, s["error"])
        for c in s["crashes"]:
            crashes.add(run, c["code"], c["message"])
        for a in s["unexpected"]:
            unexpected.add(run, _name(a["code"], a["channels"]), a["severity"])
        if s["channel_states"]:
            states.add(
                run,
                ", ".join(f"{r['channel']}: {r['expected']} -> {r['reported'] or 'n/a'}" for r in s["channel_states"]),
                _ratio(s["channel_states"]),
            )
        if s["signal_budget"]:
            budget.add(
                run,
                ", ".join(
                    f"{r['key']}: [{r['range'][0]:g}, {r['range'][1]:g}] -> {_fmt(r['found'])}"
                    for r in s["signal_budget"]
                ),
                _ratio(s["signal_budget"]),
            )
        for r in s["gdpo_resolves"]:
            if r["status"] != "skip":
                gdpo.add(run, r["code"], r["expected"], _fmt(r["found"]), MARK[r["status"]])
        w = s.get("weights")
        if w:
            weights.add(run, _fmt(w["expected"]), _fmt(w["found"]), _fmt(w.get("source")), MARK[w["status"]])
        for c in s["remedy_contradictions"]:
            remedy = c["remedy"] if len(c["remedy"]) <= 110 else c["remedy"][:107] + "..."
            contradictions.add(run, _name(c["code"], c["channels"]), c["detail"], remedy)
        for r in s.get("run_facts") or []:
            facts.add(run, r["field"], f"{r['check']} {r['expected']!r}", _fmt(r["found"]), MARK[r["status"]])
    out = [runs, errors, expect, alarms, crashes, unexpected, states, budget, gdpo, weights, contradictions]
    return [*out, facts] if facts.rows else out


def scenario_class(score: dict[str, Any]) -> str:
    """A scored run's class: its scenario family (the corpus's scenario, the simulator's or scalar log's scenario)."""
    scenario = score.get("scenario")
    if scenario:
        return str(scenario)
    run = str(score.get("run") or "")
    return run.rsplit("-s", 1)[0] if "-s" in run else run


def per_class(scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Totals per class (``scenario_class``), in first-seen order: runs, runs passing, verdicts, expected findings,
    false alarms, remedy contradictions, run facts, and the failure categories that occur."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for s in scores:
        grouped.setdefault(scenario_class(s), []).append(s)
    out = {}
    for name, group in grouped.items():
        t = scoring.totals(group)
        categories: dict[str, int] = {}
        for s in group:
            for line in s["failures"]:
                tag = line.split(" ", 1)[0]
                categories[tag] = categories.get(tag, 0) + 1
        out[name] = {
            "runs": [s["run"] for s in group],
            "algos": sorted({str(s.get("algo")) for s in group}),
            "runs_passing": t["runs_passing"],
            "verdicts": t["verdicts"],
            "expected_findings": {"n": t["expected_findings"]["n"], "ok": t["expected_findings"]["at_severity"]},
            "false_alarms": t["false_alarms"]["findings"],
            "remedy_contradictions": t["remedy_contradictions"]["n"],
            "run_facts": {"n": t["run_facts"]["n"], "ok": t["run_facts"]["ok"]},
            "failure_categories": categories,
        }
    return out


def class_table(classes: dict[str, dict[str, Any]], suite: str) -> Table:
    table = Table(
        f"Per class ({suite})",
        ["class", "algos", "runs passing", "verdicts", "expected findings", "false alarms", "contradictions",
         "run facts", "failures by category"],
        "one row per scenario family (its runs over algorithms and seeds); expected findings, verdicts and run "
        "facts: ok / compared; failures by category: failure lines of its runs, by tag.",
    )  # fmt: skip
    for name, c in classes.items():
        v, e, f = c["verdicts"], c["expected_findings"], c["run_facts"]
        table.add(
            name,
            ",".join(c["algos"]),
            f"{c['runs_passing']}/{len(c['runs'])}",
            f"{v['correct']}/{v['n']}" if v["n"] else "-",
            f"{e['ok']}/{e['n']}" if e["n"] else "-",
            c["false_alarms"],
            c["remedy_contradictions"],
            f"{f['ok']}/{f['n']}" if f["n"] else "-",
            ", ".join(f"{k} {n}" for k, n in c["failure_categories"].items()) or "-",
        )
    return table


def totals_table(suites: dict[str, dict[str, Any]]) -> Table:
    names = list(suites)
    table = Table("Totals", ["measure", *names])

    def row(label: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        table.add(label, *(fn(suites[n]) for n in names))

    def part(k: int, n: int) -> str:
        return f"{k} of {n}" + (f" ({100 * k / n:.0f}%)" if n else "")

    row("runs scanned (scan errors)", lambda t: f"{t['runs']} ({t['scan_errors']})")
    row("detector crashes (findings with severity error)", lambda t: t["detector_crashes"])
    row("runs meeting every expectation", lambda t: part(t["runs_passing"], t["runs"]))
    row(
        "expected findings at the expected severity",
        lambda t: part(t["expected_findings"]["at_severity"], t["expected_findings"]["n"]),
    )
    row(
        "  found at another severity / on other channels / detector crashed / missing",
        lambda t: "{wrong_severity} / {wrong_channels} / {crashed} / {missing}".format(**t["expected_findings"]),
    )
    row(
        "  found at the severity without the expected details (title, actions, evidence)",
        lambda t: t["expected_findings"]["wrong_detail"],
    )
    row("verdicts correct", lambda t: part(t["verdicts"]["correct"], t["verdicts"]["n"]))
    row("false alarms (findings)", lambda t: t["false_alarms"]["findings"])
    row("  forbidden codes firing", lambda t: t["false_alarms"]["forbidden"])
    row(
        "  warning+ on healthy runs (max_warning 0)",
        lambda t: "{warnings_on_healthy_runs} on {healthy_runs_with_warnings} of {healthy_runs} runs".format(
            **t["false_alarms"]
        ),
    )
    row("other warning+ findings (not scored)", lambda t: t["unexpected_warnings"])
    row("remedy contradictions", lambda t: t["remedy_contradictions"]["n"])
    row(
        "  GDPO proposed, gdpo_resolves false / lower weight on a floor channel",
        lambda t: "{gdpo_unresolved} / {lower_floor}".format(**t["remedy_contradictions"]),
    )
    row(
        "  runs whose scan reports no channel state (floor check impossible)",
        lambda t: t["remedy_contradictions"]["runs_without_channel_states"],
    )

    def compared(key: str) -> Callable[[dict[str, Any]], str]:
        def cell(t: dict[str, Any]) -> str:
            return f"{part(t[key]['ok'], t[key]['n'])} ({t[key]['not_reported']})" if t[key]["n"] else "-"

        return cell

    row("channel states matching (not reported)", compared("channel_states"))
    row("signal budget in range (not reported)", compared("signal_budget"))
    row("gdpo_resolves matching (not reported)", compared("gdpo_resolves"))
    row(
        "inferred weights matching",
        lambda t: part(t["weights_inferred"]["ok"], t["weights_inferred"]["n"]) if t["weights_inferred"]["n"] else "-",
    )
    row(
        "run facts matching (not reported)",
        lambda t: (
            f"{part(t['run_facts']['ok'], t['run_facts']['n'])} ({t['run_facts']['not_reported']})"
            if t["run_facts"]["n"]
            else "-"
        ),
    )
    row(
        "onset |error| mean / max (steps)",
        lambda t: (
            f"{_fmt(t['onset']['mean_abs_error'])} / {_fmt(t['onset']['max_abs_error'])} over {t['onset']['n']}"
            if t["onset"]["n"]
            else "-"
        ),
    )
    return table


def targets_table(target: dict[str, dict[str, Any]]) -> Table:
    table = Table("Targets", ["target", "measured", "result"])
    for name, t in target.items():
        table.add(name, t["value"], "PASS" if t["pass"] else "FAIL")
    return table


# ---------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="corpus directory with manifest.json")
    parser.add_argument("--seeds", default="0,1,2", help="simulator seeds (comma-separated)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", help="score only runs whose name contains this text")
    parser.add_argument("--no-corpus", action="store_true", help="skip the TRL corpus")
    parser.add_argument("--no-simulator", action="store_true", help="skip the simulated scenarios")
    parser.add_argument("--no-scalars", action="store_true", help="skip the simulated scalar logs (CD507-CD511)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the full matrix as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown (docs/accuracy.md)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    suites_scores: dict[str, list[dict[str, Any]]] = {}
    if not args.no_corpus:
        suites_scores["corpus"] = corpus_scores(args.corpus, args.device, args.only)
    if not args.no_simulator:
        suites_scores["simulator"] = simulator_scores(args)
    if not args.no_scalars:
        suites_scores["scalars"] = scalar_scores(args)
    everything = [s for scores in suites_scores.values() for s in scores]
    suite_totals = {name: scoring.totals(scores) for name, scores in suites_scores.items()}
    if len(suites_scores) > 1:
        suite_totals["all"] = scoring.totals(everything)
    overall = scoring.totals(everything)
    target = scoring.targets(overall)
    wall = time.perf_counter() - start

    size = f"{args.steps} steps x {args.groups} groups x {args.group_size}"
    sim = f"{len(SCENARIOS)} scenarios x seeds {args.seeds}, {size}"
    scalar_logs = f"{len(SCALAR_SCENARIOS)} scenarios x seeds {args.seeds}, {SCALAR_STEPS} steps"
    header = [
        f"collapse-doctor accuracy: {len(everything)} scans in {wall:.1f} s "
        f"({platform.python_version()}, {platform.machine()}, device {args.device})",
        f"corpus: {args.corpus if not args.no_corpus else 'skipped'}; simulator: "
        f"{sim if not args.no_simulator else 'skipped'}; scalar logs: "
        f"{scalar_logs if not args.no_scalars else 'skipped'}",
        "",
    ]
    classes = {name: per_class(scores) for name, scores in suites_scores.items()}
    out = [*header, totals_table(suite_totals).render(args.markdown), targets_table(target).render(args.markdown)]
    out += [class_table(classes[name], name).render(args.markdown) for name in suites_scores]
    for name, scores in suites_scores.items():
        out.append(f"### {name}\n" if args.markdown else f"######## {name} ########\n")
        out += [t.render(args.markdown, level=4) for t in tables(scores)]
    print("\n".join(out))

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "options": {
                "corpus": None if args.no_corpus else str(args.corpus),
                "simulator": None
                if args.no_simulator
                else {"seeds": args.seeds, "steps": args.steps, "groups": args.groups, "group_size": args.group_size},
                "scalars": None if args.no_scalars else {"seeds": args.seeds, "steps": SCALAR_STEPS},
                "device": args.device,
                "only": args.only,
            },
            "seconds": round(wall, 2),
            "totals": suite_totals,
            "targets": target,
            "per_class": classes,
            "runs": everything,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    missed = [name for name, t in target.items() if not t["pass"]]
    if args.strict and missed:
        print(f"--strict: targets missed: {'; '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
