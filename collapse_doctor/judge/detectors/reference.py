"""Generate docs/detectors.md from the detectors' own documentation.

Run ``python -m collapse_doctor.judge.detectors.reference > docs/detectors.md``; a test fails when the file
is out of date.
"""

from __future__ import annotations

from collapse_doctor.judge.detectors import REGISTRY, explain_sections
from collapse_doctor.judge.detectors.base import CURRENT_WINDOW_RULE, EXPLAIN_HEADINGS, threshold_range

JUDGEMENT = f"""\
## How findings are judged

**Verdict levels are defined by harm to the gradient signal the run actually used** (its own aggregation:
detected from the logged advantages, `--algo`, or GRPO when unknown):

- **COLLAPSED** (a critical finding): the signal is collapsing. Evidence that qualifies: most rollouts carry
  zero advantage (CD102 above `critical_share`, 80% by default), tied sums erase most distinctions between
  different reward vectors (CD301 above `critical_share`), outlier groups squeeze most groups (CD201 above
  `outlier_share_critical`), the logged advantages are not what the trainer claims (CD202 critical), or a
  scalar log shows the same (CD5xx critical).
- **AT RISK** (a warning): a precursor: half the rollouts silent, a channel the policy is losing (earned
  before, now at its floor, or its spread fading), a channel drowning the others (CD402), channels that
  double-count or cancel (CD401), ties above `warn_share`, bimodal or heavy-tailed advantages.
- **HEALTHY**: nothing above. Information findings (a channel saturated at its ceiling, a channel never
  earned, a sparse channel) do not change the verdict.
- **INCONCLUSIVE**: no selected detector could judge the run (every one skipped: too few steps, or the data
  it needs is missing, e.g. `--only CD5` on a run without a scalar log). A gate never passes it: exit code 1
  at every `--fail-on` level but `never`. A selection of no detector at all (`--only CD1 --ignore CD1`) is a
  usage error (exit 2).

**A saturated channel is not a collapse.** A channel that is constant within a group adds the same value to
every member's sum: it changes no advantage under GRPO or GDPO. Its cost is the compute and a run that trains
on fewer channels than configured; its harm is in the transition (a lone failure dominating the group's std
under GRPO, measured by CD402). A channel constant at its **ceiling** (run-wide maximum) is learned; one
constant at its **floor** (run-wide minimum) was never earned: too hard, too sparse or a broken reward
function, and lowering its weight would remove the objective. Silent groups are split the same way
(all-pass, all-fail, cancelling), because the fixes are opposite.

**Counterfactuals are computed, never guessed.** Every "under GDPO ..." figure and every `gdpo_resolves`
comes from running the same statistic and the same decision on the other aggregation's recomputed
advantages: `gdpo_resolves` is true when the condition that fired would not fire on the GDPO advantages
(null for a run that already is GDPO, whose messages say what GRPO would do, and for scalar-only runs).
A remedy never proposes switching aggregation when that answer is no. GDPO does not resolve ties or silence
when two channels are affine in each other within a group (B = 1 - A with equal weights: z_B = -z_A, the
fused sum is exactly 0); it does with unequal weights, three or more channels, or groups that also hold other
reward vectors.

**Remedies are data.** A remedy that proposes something concrete carries it as typed actions next to its words
(`findings[].actions` in the JSON: `weight`, `aggregation`, `drop`, `condition`, `recipe`, `trainer_setting`),
and the command or value in the words is taken from the action. `collapse-doctor retrain --from-scan scan.json`
applies the actions and never reads the words, so rewording a remedy changes nothing it does. An action is
emitted only where the remedy proposes it: no aggregation switch where `gdpo_resolves` is false.

**Every statistic carries its support.** Per-step series of counts (groups with two or more values of a
channel, co-observed rollouts of a channel pair, differing pairs, groups) sit next to the values; a detector
does not decide below its stated minimum (`min_groups`, `min_rows`, `min_pairs`, `min_points`) and is listed
as skipped with "not enough data to judge" instead. A rollout detector also needs a run of at least twice the
shortest persistence window (`2 * min_persistence`, 6 steps by default): on a shorter run a condition that
holds throughout is all there is, not a sustained change.

**Severity comes from the current window.** {CURRENT_WINDOW_RULE}
"""


NEEDS_SHOWN = {"channel_series": "rollouts or the TRL callback's channel series"}
"""How the reference's table names a requirement whose code name says less than its words."""


def reference_markdown() -> str:
    """The detector reference: one section per code, from the docstrings and class attributes."""
    lines = [
        "# Detector reference",
        "",
        "Generated from the detectors' docstrings by `python -m collapse_doctor.judge.detectors.reference`;",
        "`collapse-doctor explain CODE` prints the same text. Thresholds can be changed in",
        "`[tool.collapse-doctor.thresholds.CODE]` (see [usage.md](usage.md#configuration)); a value outside its",
        "range (a share of 80 meant as a percent, NaN, a fractional count) is an error naming the key, exit 2.",
        "",
        "| code | name | default severity | needs |",
        "|---|---|---|---|",
    ]
    for code in sorted(REGISTRY):
        detector = REGISTRY[code]
        needs = ", ".join(NEEDS_SHOWN.get(need, need) for need in detector.requires)
        lines.append(f"| [{code}](#{code.lower()}) | {detector.name} | {detector.default_severity.label} | {needs} |")
    lines += ["", *JUDGEMENT.rstrip("\n").split("\n")]
    for code in sorted(REGISTRY):
        detector = REGISTRY[code]
        sections = explain_sections(detector)
        lines += ["", f"## {code}", "", f"**{detector.name}**: {sections['summary']}", ""]
        for heading in EXPLAIN_HEADINGS:
            body = " ".join(sections[heading].split())
            lines += [f"### {heading}", "", body, ""]
        if not detector.graded_on_current_window:
            lines += ["*Keeps its severity after its condition ends (the harm is done while it holds).*", ""]
        if detector.thresholds:
            lines += ["### Thresholds", "", "| name | default | range |", "|---|---|---|"]
            lines += [
                f"| `{name}` | {value:g} | {threshold_range(detector, name)} |"
                for name, value in detector.thresholds.items()
            ]
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(reference_markdown(), end="")
