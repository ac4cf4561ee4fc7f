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
nav { position: sticky; top: 0; z-index: 10; background: var(--card); border-bottom: 1px solid var(--line); }
nav .inner { max-width: 1400px; margin: 0 auto; padding: 6px 24px; display: flex; gap: 16px; flex-wrap: wrap; }
nav a { color: var(--info); text-decoration: none; font-size: 13px; }
nav a:hover { text-decoration: underline; }
.cards { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 16px; margin-top: 16px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px;
        overflow-x: auto; }
td.name { max-width: 32ch; overflow-wrap: anywhere; }  /* long channel names wrap, columns stay in view */
.card td code { word-break: break-all; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.finding { border-left: 4px solid var(--line); margin: 12px 0; }
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
.examples-grid.text { grid-template-columns: minmax(0, 1fr); }
.examples-grid h3 { font-weight: 600; }
@media (max-width: 1000px) {
  .grid, .cards { grid-template-columns: minmax(0, 1fr); }
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
