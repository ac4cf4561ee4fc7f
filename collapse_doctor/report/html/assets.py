"""Style sheet and script of the HTML report (kept in Python so they ship with the package)."""

from __future__ import annotations

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #e3e6ec; --bg: #f6f7f9; --card: #ffffff;
        --critical: #b22222; --warning: #b8860b; --info: #2f6db5; --error: #8e44ad; --ok: #2e7d32; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 1400px; margin: 0 auto; padding: 0 24px 48px; }
header.top { background: var(--card); border-bottom: 1px solid var(--line); }
header.top .inner { max-width: 1400px; margin: 0 auto; padding: 20px 24px 12px; }
h1 { font-size: 22px; margin: 0 0 6px; display: flex; gap: 12px; align-items: center; flex-wrap: wrap; }
h2 { font-size: 18px; margin: 32px 0 4px; padding-top: 8px; }
h3 { font-size: 14px; margin: 0 0 2px; }
.verdict { font-size: 14px; font-weight: 700; padding: 3px 10px; border-radius: 4px; color: #fff;
           letter-spacing: .04em; }
.verdict.healthy { background: var(--ok); } .verdict.at_risk { background: var(--warning); }
.verdict.collapsed { background: var(--critical); } .verdict.inconclusive { background: #7a4fa0; }
.muted { color: var(--muted); }
h1 .budget { font-size: 17px; font-weight: 600; }
nav { position: sticky; top: 0; z-index: 10; background: var(--card); border-bottom: 1px solid var(--line);
      box-shadow: 0 1px 3px rgba(0, 0, 0, .04); }
nav .inner { max-width: 1400px; margin: 0 auto; padding: 6px 24px; display: flex; gap: 8px 24px; flex-wrap: wrap;
             align-items: center; justify-content: space-between; }
nav .links, nav .toggles { display: flex; gap: 4px 16px; flex-wrap: wrap; align-items: center; }
nav a { color: var(--info); text-decoration: none; font-size: 13px; border-bottom: 2px solid transparent; }
nav a:hover { text-decoration: underline; }
nav a.current { color: var(--fg); border-bottom-color: var(--info); }
nav .toggles { font-size: 12px; }
nav label.shade { cursor: pointer; white-space: nowrap; display: inline-flex; align-items: center; gap: 2px; }
nav label.shade .swatch { margin: 0 3px 0 2px; }
section { scroll-margin-top: 44px; }
#findings > h2 { margin-top: 16px; }
.findings { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; margin-top: 8px; }
.cards { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 16px; margin-top: 8px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px;
        overflow-x: auto; }
/* long channel names wrap, columns stay in view */
td.name { min-width: 16ch; max-width: 32ch; overflow-wrap: anywhere; }
td.decides { max-width: 48ch; overflow-wrap: anywhere; }
.card td code:not(.path) { word-break: break-all; }
code.path { white-space: normal; word-break: normal; overflow-wrap: normal; }
code.path .seg { white-space: nowrap; }  /* a path breaks after a "/", never inside a name */
details.inputs > summary { color: var(--fg); }
ul.files { margin: 4px 0 0; padding-left: 18px; max-height: 260px; overflow: auto; }
td.state { white-space: nowrap; }
td.state.ceiling, td.state.floor, td.state.sparse, td.state.clipped { color: var(--warning); font-weight: 600; }
ul.flat { color: var(--muted); margin: 8px 0 0; padding-left: 18px; font-size: 13px; }
details.skipped { color: var(--muted); font-size: 13px; margin-top: 8px; }
details.skipped ul { margin: 4px 0; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.finding { border-left: 4px solid var(--line); margin: 0; }
.finding .headline .swatch { vertical-align: -1px; }
.finding.critical { border-left-color: var(--critical); } .finding.warning { border-left-color: var(--warning); }
.finding.info { border-left-color: var(--info); } .finding.error { border-left-color: var(--error); }
.sev { font-size: 11px; font-weight: 700; text-transform: uppercase; padding: 1px 6px; border-radius: 3px;
       color: #fff; }
.sev.critical { background: var(--critical); } .sev.warning { background: var(--warning); }
.sev.info { background: var(--info); } .sev.error { background: var(--error); }
.finding .where { color: var(--muted); font-size: 12px; margin-left: 8px; }
.finding p { margin: 6px 0; }
.finding .remedy { color: var(--ok); }
.finding .actions { color: var(--ok); margin: 0 0 6px; padding-left: 20px; font-size: 13px; }
.evidence { font-size: 12px; color: var(--muted); }
.evidence span { display: inline-block; margin-right: 14px; }
details > summary { cursor: pointer; color: var(--info); }
pre.explain { white-space: pre-wrap; background: var(--bg); padding: 8px 12px; border-radius: 4px; font-size: 12px; }
code { background: #eef0f4; padding: 0 3px; border-radius: 3px; font-size: 12px; }
.grid { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 16px; margin-top: 12px; }
.chart { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px 4px;
         margin: 0; }
.chart .note { color: var(--muted); font-size: 12px; margin: 0 0 4px; min-height: 18px; }
.plot { width: 100%; min-height: 380px; }
.slider { display: flex; gap: 12px; align-items: center; font-size: 13px; }
.slider input { flex: 1; }
.examples td.text { max-width: 520px; white-space: pre-wrap; word-break: break-word; }
.examples tr.group th { background: var(--bg); color: var(--fg); font-size: 13px; }
.examples details > summary { color: var(--fg); }
.examples details[open] > summary { color: var(--muted); }
.section-intro { color: var(--muted); max-width: 1000px; margin: 0; }
.missing { color: var(--muted); font-style: italic; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
.examples-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(400px, 1fr)); gap: 16px; }
.examples-grid.text { grid-template-columns: repeat(2, minmax(0, 1fr)); }
.examples-grid h3 { font-weight: 600; }
@media (max-width: 1000px) {
  .grid, .cards, .findings, .examples-grid.text { grid-template-columns: minmax(0, 1fr); }
  .grid > .chart { grid-column: 1 / -1 !important; }
}
"""

SCRIPT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  var stepPlots = [];
  window.__chartMs = {};
  // Charts on the first screen first (the page may open scrolled), then the rest in page order.
  function onScreen(chart) {
    var box = document.getElementById(chart.id).getBoundingClientRect();
    return box.bottom > 0 && box.top < window.innerHeight;
  }
  var firstScreen = data.charts.filter(onScreen);
  var queue = firstScreen.concat(data.charts.filter(function (c) { return !onScreen(c); }));
  var drawn = 0;

  // One chart per task, in page order: the first screen shows while the rest is still drawing.
  function drawNext() {
    var chart = queue.shift();
    if (!chart) { finish(); return; }
    if (window.__firstScreenMs === undefined && firstScreen.length === 0) {
      window.__firstScreenMs = performance.now();  // nothing but header and findings on the first screen
    }
    var el = document.getElementById(chart.id);
    var started = performance.now();
    placeOnsets(chart, el);
    Plotly.newPlot(el, chart.data, chart.layout, config).then(function () {
      window.__chartMs[chart.id] = performance.now() - started;
      if (chart.steps) { stepPlots.push(el); }
      if (window.__firstChartMs === undefined) { window.__firstChartMs = performance.now(); }
      drawn += 1;
      if (drawn >= firstScreen.length && window.__firstScreenMs === undefined) {
        window.__firstScreenMs = performance.now();
      }
      setTimeout(drawNext, 0);
    }, function (error) {
      console.error("chart " + chart.id + " failed: " + error);
      setTimeout(drawNext, 0);
    });
  }

  // Onset labels sit above the plot; where two would overlap at this chart's width, the later one moves up a row.
  var measure = document.createElement("canvas").getContext("2d");
  function placeOnsets(chart, el) {
    var notes = (chart.layout.annotations || []).filter(function (a) { return /^onset-/.test(a.name || ""); });
    if (!chart.xspan || !notes.length) { return; }
    var margin = chart.layout.margin || {};
    var plotWidth = el.clientWidth - (margin.l || 80) - (margin.r || 80);
    var span = Math.max(chart.xspan[1] - chart.xspan[0], 1e-9);
    var ends = [];
    notes.slice().sort(function (a, b) { return a.x - b.x; }).forEach(function (note) {
      var font = note.font || {};
      measure.font = (font.size || 10) + "px " + ((chart.layout.font || {}).family || "sans-serif");
      var width = measure.measureText(note.text).width + 8;
      var left = (note.x - chart.xspan[0]) / span * plotWidth;
      note.xanchor = left + width > plotWidth ? "right" : "left";
      if (note.xanchor === "right") { left -= width; }
      var row = 0;
      while (row < ends.length && ends[row] + 4 > left) { row += 1; }
      ends[row] = left + width;
      note.yshift = 2 + ROW * row;
    });
    var top = Math.max(margin.t || 0, 8 + ROW * ends.length);
    // the plot keeps its height: the rows of labels add to the chart's
    chart.layout.height = (chart.layout.height || 380) + top - (margin.t || 0);
    margin.t = top;
    chart.layout.margin = margin;
  }
  var ROW = 17;

  // One shading per finding on every step chart, turned on and off by its box in the table of contents.
  function shade(index, on) {
    var name = "shade-" + index;
    data.charts.forEach(function (chart) {  // charts not drawn yet start with the choice
      (chart.layout.shapes || []).forEach(function (s) { if (s.name === name) { s.visible = on; } });
    });
    stepPlots.forEach(function (el) {
      var update = {};
      ((el.layout || {}).shapes || []).forEach(function (s, j) {
        if (s.name === name) { update["shapes[" + j + "].visible"] = on; }
      });
      if (Object.keys(update).length) { Plotly.relayout(el, update); }
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("input.shade-toggle"), function (box) {
    box.addEventListener("change", function () { shade(box.getAttribute("data-shade"), box.checked); });
  });

  // The table of contents marks the section in view.
  var links = Array.prototype.slice.call(document.querySelectorAll("nav a[href^='#']"));
  var targets = links.map(function (a) { return document.getElementById(a.getAttribute("href").slice(1)); });
  var nav = document.querySelector("nav");
  var pending = false;
  function markCurrent() {
    pending = false;
    var top = (nav ? nav.getBoundingClientRect().bottom : 0) + 16;
    var current = -1;
    targets.forEach(function (el, i) { if (el && el.getBoundingClientRect().top <= top) { current = i; } });
    links.forEach(function (a, i) { a.classList.toggle("current", i === current); });
  }
  window.addEventListener("scroll", function () {
    if (!pending) { pending = true; window.requestAnimationFrame(markCurrent); }
  }, { passive: true });
  markCurrent();

  var syncing = false;
  function shareZoom(source, event) {
    if (syncing) { return; }
    var update = null;
    if (event["xaxis.range[0]"] !== undefined) {
      update = { "xaxis.range": [event["xaxis.range[0]"], event["xaxis.range[1]"]] };
    } else if (event["xaxis.range"]) {
      update = { "xaxis.range": event["xaxis.range"] };
    } else if (event["xaxis.autorange"]) {
      update = { "xaxis.autorange": true };
    }
    if (!update) { return; }
    syncing = true;
    var others = stepPlots.filter(function (el) { return el !== source; });
    Promise.all(others.map(function (el) { return Plotly.relayout(el, update); }))
      .then(function () { syncing = false; }, function () { syncing = false; });
  }

  var hist = data.histograms;
  var slider = document.getElementById("hist-slider");
  if (hist && slider) {
    var label = document.getElementById("hist-step");
    slider.addEventListener("input", function () {
      if (!document.getElementById("chart-hist-step").data) { return; }  // not drawn yet
      var i = Number(slider.value);
      label.textContent = String(hist.steps[i]);
      Plotly.restyle("chart-hist-step", { y: [hist.grpo[i], hist.gdpo[i]] }, [0, 1]);
    });
  }

  function finish() {
    stepPlots.forEach(function (el) { el.on("plotly_relayout", function (ev) { shareZoom(el, ev); }); });
    window.__reportReadyMs = performance.now();
    window.__reportReady = true;
    document.body.setAttribute("data-ready", "1");
  }

  drawNext();
})();
"""
