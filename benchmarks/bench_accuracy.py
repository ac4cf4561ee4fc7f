"""Accuracy benchmark: scan every labelled run and score the diagnosis against what the run should get.

Run:  .venv/bin/python benchmarks/bench_accuracy.py [--markdown] [--json OUT] [--strict]

Two suites. The TRL corpus (``tests/data/trl_corpus/*/``, one scan per run directory, expectations in its
``manifest.json``, reasoned from the reward math) and the simulator (``collapse_doctor.simulate``, each scenario
for a few seeds, expectations from the ground truth in the file's metadata). Every scan uses the default options
on the CPU and is read through ``Diagnosis.to_dict()``, the JSON users see. Scoring: ``accuracy_scoring.py`` (shared
with ``tests/e2e/test_corpus.py``); method: ``docs/accuracy.md``.

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

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_scoring as scoring  # benchmarks/ is not a package: found through sys.path above

from collapse_doctor.options import ScanOptions
from collapse_doctor.pipeline import diagnose
from collapse_doctor.simulate import GROUND_TRUTH_KEY, SCENARIOS, write_simulation

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
    return [runs, errors, expect, alarms, crashes, unexpected, states, budget, gdpo, weights, contradictions]


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
    everything = [s for scores in suites_scores.values() for s in scores]
    suite_totals = {name: scoring.totals(scores) for name, scores in suites_scores.items()}
    if len(suites_scores) > 1:
        suite_totals["all"] = scoring.totals(everything)
    overall = scoring.totals(everything)
    target = scoring.targets(overall)
    wall = time.perf_counter() - start

    size = f"{args.steps} steps x {args.groups} groups x {args.group_size}"
    sim = f"{len(SCENARIOS)} scenarios x seeds {args.seeds}, {size}"
    header = [
        f"collapse-doctor accuracy: {len(everything)} scans in {wall:.1f} s "
        f"({platform.python_version()}, {platform.machine()}, device {args.device})",
        f"corpus: {args.corpus if not args.no_corpus else 'skipped'}; simulator: "
        f"{sim if not args.no_simulator else 'skipped'}",
        "",
    ]
    out = [*header, totals_table(suite_totals).render(args.markdown), targets_table(target).render(args.markdown)]
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
                "device": args.device,
                "only": args.only,
            },
            "seconds": round(wall, 2),
            "totals": suite_totals,
            "targets": target,
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
