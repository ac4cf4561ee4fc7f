"""Plotly figures of the HTML report, built as plain dicts from a Diagnosis (and the report extras).

Figures show the per-step series as they are, thinned for display on long runs (:func:`display_index`
keeps each bucket's minimum and maximum, so spikes survive), and the pre-binned histograms of
:mod:`collapse_doctor.report.html.collect`. The only arithmetic is that thinning, the correlation pooled from
the per-step sums the series carry, and counting the steps each channel dominates. Every string that comes from the
logs (channel names) is HTML-escaped before it reaches plotly, which renders names as SVG text and
would otherwise interpret tags in them.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_doctor.core.series import RECOMPUTATIONS

if TYPE_CHECKING:
    from collapse_doctor.core.findings import Finding
    from collapse_doctor.core.result import Diagnosis
    from collapse_doctor.report.html.collect import AdvantageHistograms, LoggedSample, ReportExtras

MAX_POINTS = 1200
"""Points per line before a series is thinned for display (pairs of bucket min and max)."""
CHANNEL_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#aec7e8",
)
ALGO_COLORS = {"grpo": "#d62728", "gdpo": "#222222"}
ALGO_DASH = {"grpo": "solid", "gdpo": "dot"}
STEP_PICK_COLORS = ("#9ecae1", "#3182bd", "#08306b")
FINDING_COLORS = ("#d62728", "#7b4fb8", "#1a8f8f", "#b8860b", "#c2459b", "#5b7f1e")
"""One colour per marked finding: its onset line, its label, its shading (at :data:`SHADE_ALPHA`) and its toggle."""
SHADE_ALPHA = 0.11
MAX_MARKED = 6
"""Findings with an onset marked on the step charts (the most severe first)."""
ONSET_ROW_PX = 17
"""Height of one row of onset labels above a step chart."""
WHOLE_RUN = 0.75
"""A finding whose steps cover this share of the run starts with its shading off: it would tint the whole chart."""
ADV_STD_BAND = (0.3, 1.5)
"""Healthy band of the advantage std (DESIGN.md defaults)."""
COLLINEAR = ("CD401", "warn_rho")
"""The threshold drawn on the correlation chart: CD401's configured |rho| (the run's config, else the default)."""
MAX_SLIDER_STEPS = 400
"""Steps the histogram slider offers on a long run (each is 2 x 64 numbers in the page)."""


@dataclass
class Chart:
    """One chart container of the page: a plotly figure and the text around it."""

    id: str
    title: str
    """Plain text (escaped when rendered); strings inside ``data``/``layout`` are already escaped."""
    data: list[dict[str, Any]]
    layout: dict[str, Any]
    note: str = ""
    """Plain text under the title (escaped when rendered)."""
    span: int = 3
    """Columns of the page's 6-column grid it takes (6 = full width)."""
    steps_axis: bool = True
    """Its x axis is training steps (zoom is shared with the other step charts)."""

    def x_span(self) -> list[float] | None:
        """The steps its x axis covers when autoranged (its lines, onset lines and shading), for placing the onset
        labels before it is drawn; ``None`` off the step axis or without data."""
        if not self.steps_axis:
            return None
        xs = [v for t in self.data for v in (t.get("x") or [])[:1] + (t.get("x") or [])[-1:] if v is not None]
        xs += [s[k] for s in self.layout.get("shapes", ()) if s.get("xref") == "x" for k in ("x0", "x1")]
        return [float(min(xs)), float(max(xs))] if xs else None


@dataclass
class Section:
    id: str
    title: str
    intro: str
    charts: list[Chart] = field(default_factory=list)
    missing: str = ""
    """Shown instead of charts when the data for the section does not exist."""
    short: str = ""
    """Its name in the table of contents (default: the title)."""
    flat: list[str] = field(default_factory=list)
    """One line (plain text) per chart left out because every series on it is constant."""
    not_redrawn: str = ""
    """One line (plain text) naming series left out because another section already draws them."""


def esc(text: str) -> str:
    """Escape text for HTML (element content and attribute values)."""
    return html.escape(str(text), quote=True)


def plot_text(text: str) -> str:
    """Escape text for plotly, which decodes ``&lt; &gt; &amp;`` but shows ``&quot;`` as it is."""
    return html.escape(str(text), quote=False)


def channel_color(k: int) -> str:
    return CHANNEL_COLORS[k % len(CHANNEL_COLORS)]


def numbers(values: np.ndarray | Sequence[float]) -> list[float | None]:
    """JSON numbers with 4 significant digits, NaN and inf as null (a gap in the line)."""
    out: list[float | None] = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        out.append(float(f"{v:.4g}") if math.isfinite(v) else None)
    return out


def display_index(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of the points to draw: all of them, or each bucket's min and max (in order) on long series.

    >>> display_index(np.arange(10.0), 100).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> display_index(np.array([0.0, 5.0, 1.0, 1.0, -3.0, 1.0, 2.0, 2.0]), 4).tolist()
    [0, 1, 4, 6, 7]
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    size = math.ceil(n / buckets)
    pad = buckets * size - n
    grid = np.concatenate([values.astype(np.float64), np.full(pad, np.nan)]).reshape(buckets, size)
    finite = np.isfinite(grid)
    low = np.argmin(np.where(finite, grid, np.inf), axis=1)  # a bucket without a finite value keeps its first
    high = np.argmax(np.where(finite, grid, -np.inf), axis=1)
    base = np.arange(buckets) * size
    keep = np.unique(np.concatenate([base + low, base + high, [0, n - 1]]))
    return keep[keep < n]


class StepFigures:
    """Builds the step-axis traces of one Diagnosis (display thinning, onset markers, common layout)."""

    def __init__(self, diagnosis: Diagnosis, *, max_points: int = MAX_POINTS) -> None:
        self.diagnosis = diagnosis
        self.series = diagnosis.series
        self.steps = diagnosis.series.steps
        self.max_points = max_points
        self.thinned = len(self.steps) > max_points
        self._marked: list[tuple[int, Finding]] | None = None

    # -- traces -------------------------------------------------------------------------------
    def line(
        self,
        values: np.ndarray,
        name: str,
        color: str,
        *,
        dash: str = "solid",
        group: str | None = None,
        show_legend: bool = True,
        width: float = 1.8,
        yaxis: str = "y",
        keep: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """A line over the steps; ``keep`` picks the points to draw (default: :func:`display_index`)."""
        if keep is None:
            keep = display_index(values, self.max_points)
        trace: dict[str, Any] = {
            "type": "scatter",
            "mode": "lines",
            "x": self.steps[keep].tolist(),
            "y": numbers(values[keep]),
            "name": name,
            "line": {"color": color, "dash": dash, "width": width},
            "showlegend": show_legend,
            "yaxis": yaxis,
        }
        if group is not None:
            trace["legendgroup"] = group
        return trace

    def level(self, y: float, name: str, color: str, *, dash: str = "dash") -> dict[str, Any]:
        """A horizontal reference line across the run (as a two-point trace, so it has a legend entry)."""
        x = [int(self.steps[0]), int(self.steps[-1])] if len(self.steps) else [0, 1]
        return {
            "type": "scatter",
            "mode": "lines",
            "x": x,
            "y": [y, y],
            "name": name,
            "line": {"color": color, "dash": dash, "width": 1},
            "hoverinfo": "skip",
        }

    def threshold_level(self, code: str, name: str, value_format: str = ".0%") -> dict[str, Any]:
        """A detector's threshold from the run's config as a reference line, labelled ``CODE level VALUE``."""
        value = float(self.diagnosis.config.threshold(code, name))
        return self.level(value, f"{code} level {value:{value_format}}", "#b22222")

    # -- layout -------------------------------------------------------------------------------
    def layout(
        self,
        y_title: str,
        *,
        y_range: list[float] | None = None,
        percent: bool = False,
        log: bool = False,
        steps: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Step-axis layout with each marked finding's onset (a dashed line labelled with its code) and its steps
        (a shaded band the reader toggles); ``steps``: the chart's first and last step (default: the run's)."""
        yaxis: dict[str, Any] = {"title": {"text": y_title}, "zeroline": False}
        if y_range is not None:
            yaxis["range"] = y_range
        if percent:
            yaxis["tickformat"] = ".0%"
        if log:
            yaxis["type"] = "log"
            yaxis["exponentformat"] = "power"
        marked = self.marked()
        return base_layout(
            xaxis={"title": {"text": "training step"}},
            yaxis=yaxis,
            shapes=self.finding_shapes(steps),
            annotations=self.finding_annotations(),
            hovermode="x unified",
            # one row of onset labels above the plot; the page script adds rows where labels would overlap
            margin={"l": 64, "r": 16, "t": ONSET_ROW_PX + 8 if marked else 16, "b": 90},
        )

    def marked(self) -> list[tuple[int, Finding]]:
        """The findings marked on the step charts, with their index into :data:`FINDING_COLORS`."""
        if self._marked is None:
            onsets = [f for f in self.diagnosis.findings if f.onset_step is not None][:MAX_MARKED]
            self._marked = list(enumerate(onsets))
        return self._marked

    def shade_on(self, finding: Finding) -> bool:
        """Whether a finding's shading starts visible: not when it covers (nearly) the whole run."""
        run = self.diagnosis.run
        if finding.step_range is None:
            return False
        if run.first_step is not None and run.last_step is not None:
            first, last = int(run.first_step), int(run.last_step)  # a scalar-only run has no step series
        elif len(self.steps):
            first, last = int(self.steps[0]), int(self.steps[-1])
        else:
            return True
        covered = min(finding.step_range[1], last) - max(finding.step_range[0], first)
        return last <= first or covered < WHOLE_RUN * (last - first)

    def finding_shapes(self, steps: tuple[int, int] | None = None) -> list[dict[str, Any]]:
        """Per marked finding: a band over its steps (clipped to ``steps``, named ``shade-K`` for the toggles) and a
        dashed line at its onset (``onset-K``), in its colour."""
        if steps is None:
            steps = (int(self.steps[0]), int(self.steps[-1])) if len(self.steps) else (0, 0)
        shapes: list[dict[str, Any]] = []
        for k, finding in self.marked():
            color = FINDING_COLORS[k]
            if finding.step_range is not None:
                x0, x1 = max(finding.step_range[0], steps[0]), min(finding.step_range[1], steps[1])
                if x0 <= x1:
                    shapes.append(
                        {
                            "type": "rect",
                            "name": f"shade-{k}",
                            "xref": "x",
                            "yref": "paper",
                            "x0": x0,
                            "x1": x1,
                            "y0": 0,
                            "y1": 1,
                            "fillcolor": _rgba(color, SHADE_ALPHA),
                            "line": {"width": 0},
                            "layer": "below",
                            "visible": self.shade_on(finding),
                        }
                    )
            shapes.append(
                {
                    "type": "line",
                    "name": f"onset-{k}",
                    "xref": "x",
                    "yref": "paper",
                    "x0": finding.onset_step,
                    "x1": finding.onset_step,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": color, "width": 1.4, "dash": "dash"},
                }
            )
        return shapes

    def finding_annotations(self) -> list[dict[str, Any]]:
        """One label per onset line, above the plot; the page script stacks labels that would overlap into rows
        (``yshift``) before the chart is drawn, when it knows the chart's width."""
        return [
            {
                "name": f"onset-{k}",
                "x": finding.onset_step,
                "xref": "x",
                "y": 1.0,
                "yref": "paper",
                "yshift": 2,
                "text": plot_text(finding.code),
                "hovertext": plot_text(f"{finding.code} onset, step {finding.onset_step}: {finding.title}"),
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"size": 10, "color": FINDING_COLORS[k]},
                "bgcolor": "rgba(255,255,255,0.85)",
            }
            for k, finding in self.marked()
        ]

    def note(self) -> str:
        if not self.thinned:
            return ""
        return (
            f"{len(self.steps):,} steps, thinned for display: each bucket of steps shows its minimum and maximum, "
            "so spikes stay visible."
        )


def _rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` as ``rgba(r,g,b,alpha)``.

    >>> _rgba("#d62728", 0.1)
    'rgba(214,39,40,0.1)'
    """
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha:g})"


def base_layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "height": 380,
        "margin": {"l": 64, "r": 16, "t": 16, "b": 90},
        "legend": {"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0, "font": {"size": 11}},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "modebar": {"bgcolor": "rgba(255,255,255,0)", "color": "#b0b6c2", "activecolor": "#2f6db5"},
        "xaxis": {"gridcolor": "#eeeeee"},
        "yaxis": {"gridcolor": "#eeeeee"},
    }
    for key, value in extra.items():
        if key in ("xaxis", "yaxis"):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


# -- sections --------------------------------------------------------------------------------------
def signal_section(fig: StepFigures) -> Section:
    d = fig.diagnosis
    s = fig.series
    section = Section(
        "signal",
        "Reward signal per channel",
        "rel_gain: how much a channel still separates the completions of one prompt (mean within-group max - min). "
        "A channel whose rel_gain falls to a small part of its peak no longer ranks samples (CD101).",
    )
    warn = float(d.config.threshold("CD101", "warn_ratio"))
    traces = []
    for k, channel in enumerate(s.channels):
        name = plot_text(channel)
        traces.append(fig.line(s["rel_gain"][:, k], name, channel_color(k), group=name))
    for k, row in enumerate(d.channel_table()):
        peak = row["rel_gain_peak"]
        if peak is not None and math.isfinite(peak):
            line = fig.level(
                warn * peak, f"{plot_text(row['channel'])}: {warn:.0%} of peak", channel_color(k), dash="dot"
            )
            line["legendgroup"] = plot_text(row["channel"])
            traces.append(line)
    weights = weights_chart(fig)
    section.charts.append(
        Chart(
            "chart-rel-gain",
            "rel_gain per channel (reward units)",
            traces,
            fig.layout("rel_gain (reward units)"),
            note=" ".join(
                filter(
                    None,
                    [
                        f"Healthy: above the dotted line ({warn:.0%} of the channel's peak, the CD101 warning level).",
                        fig.note(),
                    ],
                )
            ),
            span=4 if weights is not None else 6,
        )
    )
    if weights is not None:
        section.charts.append(weights)
    else:
        listed = ", ".join(f"{c} {_weight(fig, c, k):g}" for k, c in enumerate(s.channels))
        section.flat.append(f"Channel weights, constant over the run (not drawn): {listed}.")
    return section


def _weight(fig: StepFigures, channel: str, k: int) -> float:
    if "channel_weight" in fig.series:
        finite = fig.series["channel_weight"][:, k][np.isfinite(fig.series["channel_weight"][:, k])]
        if len(finite):
            return float(finite[0])
    return float(fig.diagnosis.run.weights.get(channel, 1.0))


def weights_chart(fig: StepFigures) -> Chart | None:
    """The channel weights over the steps when the run logs weights that change (dynamic weights), else ``None``:
    constant weights are one line of text (and the channel table's weight column)."""
    s = fig.series
    if "channel_weight" not in s or all(constant_value(s["channel_weight"][:, k]) for k in range(len(s.channels))):
        return None
    traces = [fig.line(s["channel_weight"][:, k], plot_text(c), channel_color(k)) for k, c in enumerate(s.channels)]
    return Chart("chart-weights", "Channel weights over steps", traces, fig.layout("weight"), note=fig.note(), span=2)


def constant_value(values: Sequence[float | None] | np.ndarray) -> tuple[float] | tuple[()] | None:
    """``(v,)`` when every finite value is ``v``, ``()`` when none is finite, else ``None`` (the series varies).

    >>> constant_value([1.0, None, 1.0]), constant_value(np.array([np.nan])), constant_value([0.0, 0.5])
    ((1.0,), (), None)
    """
    array = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    finite = array[np.isfinite(array)]
    if not len(finite):
        return ()
    first = float(finite[0])
    return (first,) if bool(np.all(finite == first)) else None


def flat_line(chart: Chart) -> str | None:
    """What replaces a step chart whose every series is constant (or has no value): ``"constant at 0"`` (one
    series), ``"GRPO 1, GDPO 1"`` (several); ``None`` when a series varies.

    Reference lines (thresholds, bands: traces without hover) do not count as series.
    """
    if not chart.steps_axis:
        return None
    series = [t for t in chart.data if t.get("hoverinfo") != "skip"]
    values = [constant_value(t.get("y") or []) for t in series]
    if not series or any(v is None for v in values):
        return None
    percent = chart.layout.get("yaxis", {}).get("tickformat") == ".0%"
    shown = [(f"{v[0]:.0%}" if percent else f"{v[0]:.3g}") if v else None for v in values]
    if not any(shown):
        return "no values"
    if len(series) == 1:
        return f"constant at {shown[0]}"
    names = [html.unescape(str(t.get("name") or "")) for t in series]
    if len(set(shown)) == 1:
        return f"{', '.join(names)}: all {shown[0]}"
    return ", ".join(f"{n} {v or 'no values'}".strip() for n, v in zip(names, shown, strict=True))


def flat_lines(flat: list[tuple[str, str]]) -> list[str]:
    """One line per kind of flat chart: titles of single series with one value grouped.

    >>> flat_lines([("clip_ratio", "constant at 0"), ("kl", "no values"), ("clip_ratio_low", "constant at 0")])
    ['clip_ratio, clip_ratio_low: constant at 0 over the run (not drawn).', 'kl: no values (not drawn).']
    """
    grouped: dict[str, list[str]] = {}
    for title, detail in flat:
        grouped.setdefault(detail, []).append(title)
    out = []
    for detail, titles in grouped.items():
        if detail.startswith("constant at"):
            out.append(f"{', '.join(titles)}: {detail} over the run (not drawn).")
        elif detail == "no values":
            out.append(f"{', '.join(titles)}: no values (not drawn).")
        else:
            out += [f"{t}: constant over the run (not drawn): {detail}." for t in titles]
    return out


def share_section(fig: StepFigures) -> Section:
    s = fig.series
    section = Section(
        "share",
        "Which channel drives the advantage",
        "Signal share: each channel's part of the within-group variance of the combined advantage. Under GRPO a "
        "high-variance channel can drown the others (CD402); GDPO normalises each channel first.",
    )
    for algo in ("grpo", "gdpo"):
        values = s[f"signal_share_{algo}"]
        traces = []
        # Stacked traces need the same steps: plotly stacks a step that one trace lacks as 0.
        shared = np.unique(
            np.concatenate([display_index(values[:, j], fig.max_points) for j in range(values.shape[1])])
        )
        for k, channel in enumerate(s.channels):
            trace = fig.line(values[:, k], plot_text(channel), channel_color(k), group=plot_text(channel), keep=shared)
            trace.update({"stackgroup": algo, "line": {"color": channel_color(k), "width": 0.5}})
            traces.append(trace)
        layout = fig.layout("share of within-group variance", y_range=[0, 1], percent=True)
        for shape in layout["shapes"]:
            shape["layer"] = "above"  # the stacked areas fill the plot: shading below them would not show
        section.charts.append(
            Chart(
                f"chart-share-{algo}",
                f"Signal share per channel, {algo.upper()} (stacked)",
                traces,
                layout,
                note=fig.note(),
                span=2,
            )
        )
    section.charts.append(dominance_chart(fig))
    return section


def dominance_chart(fig: StepFigures) -> Chart:
    s = fig.series
    channels = list(s.channels)
    counts: dict[str, np.ndarray] = {}
    for algo in ("grpo", "gdpo"):
        dom = s[f"dominance_{algo}"]
        decided = np.isfinite(dom).any(axis=1)
        winner = np.argmax(np.where(np.isfinite(dom), dom, -1.0), axis=1)
        counts[algo] = np.bincount(winner[decided], minlength=len(channels))
    data = [
        {
            "type": "bar",
            "x": ["GRPO", "GDPO"],
            "y": [int(counts["grpo"][k]), int(counts["gdpo"][k])],
            "name": plot_text(c),
            "legendgroup": plot_text(c),
            "marker": {"color": channel_color(k)},
        }
        for k, c in enumerate(channels)
    ]
    layout = base_layout(
        xaxis={"title": {"text": "aggregation"}},
        yaxis={"title": {"text": "steps"}},
        barmode="stack",
    )
    return Chart(
        "chart-dominance",
        "Dominant channel: steps where it decides the most advantage signs",
        data,
        layout,
        note="Per step, the channel whose contribution decides the sign of the largest share of the advantages.",
        span=2,
        steps_axis=False,
    )


def distribution_section(fig: StepFigures, extras: ReportExtras | None) -> Section:
    s = fig.series
    d = fig.diagnosis
    section = Section(
        "advantages",
        "Advantage distributions",
        "The recomputed GRPO and GDPO advantages of every rollout, binned per step. Outlier groups make the "
        "distribution bimodal or heavy-tailed (CD201); a collapsing run piles advantages up at 0.",
    )
    hist = extras.histograms if extras is not None else None
    if hist is not None and len(hist.steps):
        section.charts.extend(histogram_charts(d, hist))
    band = [
        fig.level(ADV_STD_BAND[0], f"healthy band {ADV_STD_BAND[0]}-{ADV_STD_BAND[1]}", "#2ca02c", dash="dot"),
        fig.level(ADV_STD_BAND[1], "", "#2ca02c", dash="dot"),
    ]
    band[1]["showlegend"] = False
    std_layout = fig.layout("std of advantages")
    std_layout["yaxis"]["rangemode"] = "tozero"
    std_layout["shapes"] = [
        *std_layout["shapes"],
        {
            "type": "rect",
            "xref": "paper",
            "yref": "y",
            "x0": 0,
            "x1": 1,
            "y0": ADV_STD_BAND[0],
            "y1": ADV_STD_BAND[1],
            "fillcolor": "rgba(44,160,44,0.07)",
            "line": {"width": 0},
            "layer": "below",
        },
    ]
    section.charts.append(
        Chart(
            "chart-adv-std",
            "Advantage std over steps (groups with signal)",
            [*_algo_lines(fig, "adv_std_{}"), *band],
            std_layout,
            note=" ".join(filter(None, ["Green band: healthy std (0.3-1.5).", fig.note()])),
            span=2,
        )
    )
    section.charts.append(
        Chart(
            "chart-adv-kurtosis",
            "Excess kurtosis of the advantages",
            [*_algo_lines(fig, "adv_kurtosis_{}"), fig.threshold_level("CD201", "excess_kurtosis", "g")],
            fig.layout("excess kurtosis (0 = normal)"),
            note=fig.note(),
            span=2,
        )
    )
    section.charts.append(
        Chart(
            "chart-outliers",
            "Outlier-dominated groups",
            [
                fig.line(s["outlier_group_share"], "outlier-dominated share of groups", "#8c564b"),
                fig.threshold_level("CD201", "outlier_share"),
            ],
            fig.layout("share of groups", percent=True),
            note="A group whose most extreme total sits far (8 stds of the rest) from the others. " + fig.note(),
            span=2,
        )
    )
    if "logged_mae_grpo" in s:
        section.charts.extend(logged_charts(fig, extras.logged_sample if extras is not None else None))
    return section


def _algo_lines(fig: StepFigures, key: str) -> list[dict[str, Any]]:
    return [
        fig.line(fig.series[key.format(a)], a.upper(), ALGO_COLORS[a], dash=ALGO_DASH[a])
        for a in ("grpo", "gdpo")
        if key.format(a) in fig.series
    ]


def histogram_steps(diagnosis: Diagnosis, hist: AdvantageHistograms) -> list[tuple[int, str]]:
    """Up to three histogram rows to compare: the main finding's onset, early, middle, late (in step order)."""
    main = next((f for f in diagnosis.findings if f.onset_step is not None), None)
    last = len(hist.steps) - 1
    candidates = []
    if main is not None and main.onset_step is not None:
        candidates.append((hist.nearest(main.onset_step), f"onset of {main.code}"))
    candidates += [(0, "early"), (last, "late"), (last // 2, "middle")]
    chosen: dict[int, str] = {}
    for index, label in candidates:
        if len(chosen) < 3:
            chosen.setdefault(index, label)
    return sorted(chosen.items())


def _shares(counts: np.ndarray) -> list[float | None]:
    total = counts.sum()
    return numbers(counts / total) if total > 0 else [None] * len(counts)


def _histogram_layout(hist: AdvantageHistograms) -> dict[str, Any]:
    """Layout of an advantage histogram: bins over the histogram's range, y as a share of the rollouts."""
    return base_layout(
        xaxis={"title": {"text": "advantage"}, "range": [float(hist.edges[0]), float(hist.edges[-1])]},
        yaxis={"title": {"text": "share of rollouts"}, "tickformat": ".0%"},
        hovermode="x unified",
    )


def histogram_charts(diagnosis: Diagnosis, hist: AdvantageHistograms) -> list[Chart]:
    centers = numbers((hist.edges[:-1] + hist.edges[1:]) / 2)
    width = float(hist.edges[1] - hist.edges[0])
    picks = histogram_steps(diagnosis, hist)
    charts = []
    for algo in ("grpo", "gdpo"):
        counts = getattr(hist, algo)
        data = [
            {
                "type": "scatter",
                "mode": "lines",
                "line": {"shape": "hvh", "color": STEP_PICK_COLORS[k % 3], "width": 2},
                "x": centers,
                "y": _shares(counts[index]),
                "name": f"step {int(hist.steps[index])} ({label})",
            }
            for k, (index, label) in enumerate(picks)
        ]
        layout = _histogram_layout(hist)
        charts.append(
            Chart(
                f"chart-hist-{algo}",
                f"{algo.upper()} advantages at chosen steps",
                data,
                layout,
                note=f"Bins of width {width:g}; values beyond ±{float(hist.edges[-1]):g} are counted in the end bins.",
                span=2,
                steps_axis=False,
            )
        )
    rows = slider_rows(diagnosis, hist)
    every = "every step" if hist.stride == 1 and len(rows) == len(hist.steps) else "steps spread evenly over the run"
    last = len(hist.steps) - 1
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "x": centers,
            "y": _shares(hist.grpo[last]),
            "name": "GRPO",
            "line": {"shape": "hvh", "color": ALGO_COLORS["grpo"], "width": 1.5},
            "fill": "tozeroy",
            "fillcolor": "rgba(214,39,40,0.18)",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "x": centers,
            "y": _shares(hist.gdpo[last]),
            "name": "GDPO",
            "line": {"shape": "hvh", "color": ALGO_COLORS["gdpo"], "width": 2},
        },
    ]
    layout = _histogram_layout(hist)
    charts.append(
        Chart(
            "chart-hist-step",
            "GRPO vs GDPO advantages at any step",
            data,
            layout,
            note=f"Move the slider to pick a step ({len(rows):,} steps: {every}).",
            span=2,
            steps_axis=False,
        )
    )
    return charts


def slider_rows(diagnosis: Diagnosis, hist: AdvantageHistograms) -> np.ndarray:
    """The histogram rows the slider offers: all, or :data:`MAX_SLIDER_STEPS` spread evenly plus the chosen ones."""
    n = len(hist.steps)
    if n <= MAX_SLIDER_STEPS:
        return np.arange(n)
    even = np.round(np.linspace(0, n - 1, MAX_SLIDER_STEPS)).astype(np.int64)
    picked = [index for index, _ in histogram_steps(diagnosis, hist)]
    return np.unique(np.concatenate([even, picked]))


def histogram_payload(diagnosis: Diagnosis, hist: AdvantageHistograms) -> dict[str, Any]:
    """The per-step shares the slider switches between (one list of bins per offered step and algorithm)."""
    rows = slider_rows(diagnosis, hist)
    return {
        "steps": hist.steps[rows].tolist(),
        "grpo": [_shares(hist.grpo[i]) for i in rows],
        "gdpo": [_shares(hist.gdpo[i]) for i in rows],
    }


def logged_charts(fig: StepFigures, sample: LoggedSample | None) -> list[Chart]:
    s = fig.series
    names = RECOMPUTATIONS
    colors = {"grpo": ALGO_COLORS["grpo"], "grpo_batch": "#ff9896", "grpo_none": "#c49c94", "gdpo": ALGO_COLORS["gdpo"]}
    traces = [fig.line(s[f"logged_mae_{k}"], v, colors[k]) for k, v in names.items() if f"logged_mae_{k}" in s]
    charts = [
        Chart(
            "chart-logged-mae",
            "Logged advantage vs recomputations: mean absolute difference",
            traces,
            fig.layout("mean |logged - recomputed|", log=True),
            note="The recomputation that matches (lowest line) identifies the aggregation the trainer used. "
            + fig.note(),
            span=2,
        )
    ]
    bound = [
        fig.line(s["logged_abs_max"], "max |logged advantage|", "#1f77b4"),
        fig.line(s["logged_bound"], "(n-1)/sqrt(n) bound", "#b22222", dash="dash"),
    ]
    charts.append(
        Chart(
            "chart-logged-bound",
            "Logged advantages against the group z-score bound",
            bound,
            fig.layout("|advantage|"),
            note="A logged advantage above the bound means the trainer did not use the statistics it claims "
            "(CD202). " + fig.note(),
            span=2,
        )
    )
    if sample is not None and len(sample.logged):
        data = [
            {
                "type": "scatter",
                "mode": "markers",
                "x": numbers(getattr(sample, algo)),
                "y": numbers(sample.logged),
                "name": f"recomputed {algo.upper()}",
                "marker": {"color": ALGO_COLORS[algo], "size": 4, "opacity": 0.5},
            }
            for algo in ("gdpo", "grpo")
        ]
        low = float(np.nanmin([sample.logged.min(), sample.grpo.min(), sample.gdpo.min()]))
        high = float(np.nanmax([sample.logged.max(), sample.grpo.max(), sample.gdpo.max()]))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [low, high],
                "y": [low, high],
                "name": "logged = recomputed",
                "line": {"color": "#888888", "dash": "dash", "width": 1},
                "hoverinfo": "skip",
            }
        )
        layout = base_layout(
            xaxis={"title": {"text": "recomputed advantage"}}, yaxis={"title": {"text": "logged advantage"}}
        )
        charts.append(
            Chart(
                "chart-logged-scatter",
                "Logged vs recomputed advantage (sample of rollouts)",
                data,
                layout,
                note=f"{len(sample.logged):,} rollouts spread evenly over the run.",
                span=2,
                steps_axis=False,
            )
        )
    return charts


def resolution_section(fig: StepFigures) -> Section:
    s = fig.series
    section = Section(
        "ties",
        "Tied-sum resolution",
        "Different reward vectors with the same weighted sum get the same GRPO advantage: (1, 0) and (0, 1) "
        "cannot be told apart (CD301). GDPO keeps them apart when the channels' within-group spreads differ.",
    )
    section.charts.append(
        Chart(
            "chart-tied",
            "Tied pairs: different reward vectors, equal sum",
            [
                fig.line(s["tied_pair_share"], "tied share of differing pairs", "#9467bd"),
                fig.threshold_level("CD301", "warn_share"),
            ],
            fig.layout("share of pairs", percent=True),
            note="Pairs of completions in one group whose reward vectors differ. " + fig.note(),
        )
    )
    section.charts.append(
        Chart(
            "chart-distinct",
            "Distinct advantage values per group",
            _algo_lines(fig, "distinct_ratio_{}"),
            fig.layout("distinct values / group size", y_range=[0, 1.05], percent=True),
            note="1 = every completion of a group gets its own advantage. " + fig.note(),
        )
    )
    return section


def correlation_section(fig: StepFigures) -> Section:
    s = fig.series
    rho = float(fig.diagnosis.config.threshold(*COLLINEAR))
    section = Section(
        "correlation",
        "Channel correlation",
        "Correlation of the channels within groups (rewards minus their group mean). Two channels above "
        f"|rho| = {rho:g} count the same signal twice (CD401).",
    )
    if not s.pairs or "corr_sxy" not in s:
        section.missing = (
            "One reward channel: no pairs to correlate."
            if len(s.channels) < 2
            else "The callback's series carry no within-group correlation: it needs the rollouts."
        )
        return section
    channels = list(s.channels)
    sxy, sxx, syy = (np.nansum(s[k], axis=0) for k in ("corr_sxy", "corr_sxx", "corr_syy"))
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = sxy / np.sqrt(sxx * syy)
    matrix = np.full((len(channels), len(channels)), np.nan)  # the diagonal (1) stays blank
    for p, (a, b) in enumerate(s.pairs):
        i, j = channels.index(a), channels.index(b)
        matrix[i, j] = matrix[j, i] = pooled[p]
    labels = [plot_text(c) for c in channels]
    text = [[("" if not math.isfinite(v) else f"{v:.2f}") for v in row] for row in matrix.tolist()]
    heat = {
        "type": "heatmap",
        "z": [numbers(row) for row in matrix],
        "x": labels,
        "y": labels,
        "zmin": -1,
        "zmax": 1,
        "colorscale": "RdBu",
        "reversescale": True,
        "text": text,
        "texttemplate": "%{text}",
        "colorbar": {"title": {"text": "rho"}},
        "hovertemplate": "%{y} / %{x}: %{text}<extra></extra>",
    }
    layout = base_layout(xaxis={"title": {"text": ""}}, yaxis={"title": {"text": ""}, "autorange": "reversed"})
    section.charts.append(
        Chart(
            "chart-corr-heatmap",
            "Within-group reward correlation (whole run)",
            [heat],
            layout,
            note="Pooled over all steps from the per-step sums.",
            steps_axis=False,
        )
    )
    strongest = int(np.nanargmax(np.where(np.isfinite(pooled), np.abs(pooled), -1.0)))
    a, b = s.pairs[strongest]
    section.charts.append(
        Chart(
            "chart-corr-steps",
            f"Strongest pair over steps: {a} / {b}",
            [
                fig.line(s["within_corr"][:, strongest], f"rho({plot_text(a)}, {plot_text(b)})", "#1f77b4"),
                fig.level(rho, f"|rho| = {rho:g}", "#b22222"),
                fig.level(-rho, "", "#b22222"),
            ],
            fig.layout("within-group correlation", y_range=[-1.05, 1.05]),
            note=fig.note(),
        )
    )
    section.charts[-1].data[-1]["showlegend"] = False
    return section


def zero_variance_section(fig: StepFigures) -> Section:
    s = fig.series
    section = Section(
        "zero-variance",
        "Groups without signal",
        "A group whose combined reward is the same for every completion has advantage 0 everywhere: no gradient "
        "(CD102). Per channel: groups where that channel is constant.",
    )
    traces = [
        fig.line(s["zero_var_share"], "combined reward constant (GRPO)", ALGO_COLORS["grpo"], width=2.4),
    ]
    if "gdpo_zero_var_share" in s:
        traces.append(
            fig.line(s["gdpo_zero_var_share"], "all channels constant (GDPO)", ALGO_COLORS["gdpo"], dash="dot")
        )
    for k, channel in enumerate(s.channels):
        traces.append(
            fig.line(s["channel_zero_var_share"][:, k], f"{plot_text(channel)} constant", channel_color(k), dash="dash")
        )
    section.charts.append(
        Chart(
            "chart-zero-var",
            "Zero-variance group share",
            traces,
            fig.layout("share of groups", y_range=[-0.02, 1.02], percent=True),
            note=fig.note(),
            span=6,
        )
    )
    return section


CALLBACK_TAG = re.compile(r"(?:train/)?collapse_doctor/")
"""Tags CollapseDoctorCallback (and ``retrain``'s monitor) log: the same statistics the report draws from rollouts."""
DRAWN_FROM_ROLLOUTS = {
    "advantage_std": "adv_std_grpo",
    "frac_reward_zero_std": "zero_var_share",
    "channel_rel_gain": "rel_gain",
    "channel_signal_share": "signal_share_grpo",
    "channel_zero_var_share": "channel_zero_var_share",
    "channel_weight": "rel_gain",  # the weights of the signal section
}
"""Scalar panel -> the per-step series whose chart shows the same quantity (a callback's copy is not redrawn)."""
SCALAR_HEIGHT = 320


def scalar_section(fig: StepFigures) -> Section | None:
    """One chart per scalar the trainer logged (``channel_mean/a``, ``channel_mean/b``... share one chart), with the
    findings marked as on every step chart; the callback's copies of series drawn from the rollouts are left out."""
    diagnosis = fig.diagnosis
    scalars = diagnosis.scalars
    if scalars is None or not scalars.series:
        return None
    section = Section(
        "scalars",
        "Scalar logs",
        "What the trainer logged itself (KL, entropy, advantage std, reward statistics...), each on its own steps.",
        short="Scalars",
    )
    panels: dict[str, list[str]] = {}
    again: list[str] = []
    for name in sorted(scalars.series):
        panel = name.split("/", 1)[0]
        drawn = DRAWN_FROM_ROLLOUTS.get(panel)
        if drawn is not None and drawn in diagnosis.series and CALLBACK_TAG.match(scalars.tags.get(name, "")):
            again.append(scalars.tags[name])
            continue
        panels.setdefault(panel, []).append(name)
    if again:
        shown = sorted({re.sub(r"/[^/]+$", "/*", t) if t.count("/") > 1 else t for t in again})
        section.not_redrawn = (
            f"Not drawn again: {', '.join(shown)} ({len(again)} series the callback logged; the charts above draw "
            "the same quantities from the rollouts)."
        )
    channels = list(diagnosis.run.channels)
    for k, (panel, names) in enumerate(panels.items()):
        traces = []
        thinned = False
        first, last = None, None
        for j, name in enumerate(names):
            points = scalars.series[name]
            keep = display_index(points.values)
            thinned = thinned or len(keep) < len(points.values)
            label = name.split("/", 1)[1] if "/" in name else name
            color = channel_color(channels.index(label)) if label in channels else channel_color(j)
            if len(points.steps):
                first = int(points.steps[0]) if first is None else min(first, int(points.steps[0]))
                last = int(points.steps[-1]) if last is None else max(last, int(points.steps[-1]))
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": points.steps[keep].tolist(),
                    "y": numbers(points.values[keep]),
                    "name": plot_text(label),
                    "line": {"color": color, "width": 1.8},
                }
            )
        raw = ", ".join(sorted({scalars.tags.get(n, n) for n in names}))
        note = f"Logged as {raw}." + (
            " Thinned for display: each bucket keeps its minimum and maximum." if thinned else ""
        )
        layout = fig.layout(plot_text(panel), steps=(first, last) if first is not None and last is not None else None)
        layout["height"] = SCALAR_HEIGHT if len(traces) > 1 else SCALAR_HEIGHT - 40
        if len(traces) == 1:  # no legend under it
            layout["margin"]["b"] = 50
        section.charts.append(Chart(f"chart-scalar-{k}", panel, traces, layout, note=note, span=2))
    return section


SECTION_KEYS = {
    "signal": "rel_gain",
    "share": "signal_share_grpo",
    "advantages": "adv_std_grpo",
    "ties": "tied_pair_share",
    "correlation": "rel_gain",  # shown for every rollout run (a single channel says why it is empty)
    "zero-variance": "zero_var_share",
}
"""The series each rollout section needs; a scalar-only run has none of them."""


SHORT_TITLES = {
    "signal": "Signal",
    "share": "Drivers",
    "advantages": "Advantages",
    "ties": "Ties",
    "correlation": "Correlation",
    "zero-variance": "No signal",
}
"""Each section's name in the table of contents."""


def sections(diagnosis: Diagnosis, extras: ReportExtras | None) -> list[Section]:
    """Every chart section of the page, in order (a section appears only when its data exists); a step chart whose
    series are all constant becomes one line of its section (:attr:`Section.flat`)."""
    fig = StepFigures(diagnosis)
    builders: dict[str, Any] = {
        "signal": signal_section,
        "share": share_section,
        "advantages": lambda f: distribution_section(f, extras),
        "ties": resolution_section,
        "correlation": correlation_section,
        "zero-variance": zero_variance_section,
    }
    out = []
    if diagnosis.series.num_steps:
        for key, build in builders.items():
            if SECTION_KEYS[key] in diagnosis.series:
                out.append(build(fig))
    scalars = scalar_section(fig)
    if scalars is not None:
        out.append(scalars)
    for section in out:
        section.short = section.short or SHORT_TITLES.get(section.id, section.title)
        kept, flat = [], []
        for chart in section.charts:
            detail = flat_line(chart)
            if detail is None:
                kept.append(chart)
            else:
                flat.append((chart.title, detail))
        section.charts = kept
        section.flat += flat_lines(flat)
        if section.id == "signal" and len(kept) == 1:
            kept[0].span = 6
    return out
