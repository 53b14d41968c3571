// The master's status page (`/` on its metrics port): plain HTML and a little JavaScript of our
// own, no framework and no fetch but `/api/status` on the same port (docs/operations.md).
#include "fluxon/master/status_page.hpp"

namespace fluxon {

const char* status_page_html() {
  return R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Fluxon status</title>
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px 20px; color: #1d2330; background: #fafbfc; }
h1 { font-size: 18px; margin: 0 0 4px; }
h2 { font-size: 14px; margin: 18px 0 6px; }
#sub { color: #5a6272; }
#alerts div { color: #fff; background: #c62828; padding: 4px 8px; margin: 4px 0; border-radius: 3px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #dde1e7; padding: 2px 6px; text-align: right; white-space: nowrap; font-size: 12px; }
th { background: #eef1f5; font-weight: 600; }
td.l, th.l { text-align: left; }
tr.stale td { color: #c62828; }
td.err { color: #c62828; font-weight: 600; }
#charts { display: flex; flex-wrap: wrap; gap: 10px; }
.chart { background: #fff; border: 1px solid #dde1e7; padding: 4px 8px; width: 250px; }
.chart .v { float: right; font-weight: 600; }
.chart svg { display: block; width: 250px; height: 48px; }
.chart polyline { fill: none; stroke: #1565c0; stroke-width: 1.5; }
.chart.bad polyline { stroke: #c62828; }
</style>
</head>
<body>
<h1>Fluxon <span id="cluster"></span></h1>
<div id="sub">loading&hellip;</div>
<div id="alerts"></div>
<h2>Owners</h2>
<table id="owners"><thead><tr>
<th class="l">node</th><th class="l">role</th><th>generation</th><th>segment</th><th>page</th>
<th>slots free</th><th>in use</th><th>committed</th><th>grants</th>
<th>resident</th><th>hot tier</th><th>pending reclaim</th>
<th>data served</th><th>keys put</th><th>keys read (hit)</th><th>errors</th><th>report</th>
</tr></thead><tbody></tbody></table>
<h2>Master</h2>
<table id="master"><tbody></tbody></table>
<h2>Rates (per second, last two minutes)</h2>
<div id="charts"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
function bytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function num(n) {
  if (n === null || n === undefined) return "";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n * 10) / 10);
}
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
let lastErrors = {};
function renderOwners(owners) {
  const body = $("owners").tBodies[0];
  body.textContent = "";
  for (const o of owners) {
    const r = o.report || {};
    const tr = document.createElement("tr");
    tr.id = "owner-" + o.node;
    if (o.stale) tr.className = "stale";
    cell(tr, String(o.node), "l");
    cell(tr, o.role, "l");
    cell(tr, o.generation);
    cell(tr, bytes(o.segment_bytes));
    cell(tr, bytes(r.segment_page_bytes));
    cell(tr, num(r.slots_free));
    cell(tr, num((r.slots_prepared || 0) + (r.slots_pending || 0) + (r.slots_pending_local_visible || 0)));
    cell(tr, num(r.slots_committed));
    cell(tr, num(r.grants));
    cell(tr, bytes(r.resident_bytes));
    cell(tr, bytes(r.hot_bytes));
    cell(tr, bytes(r.pending_eviction_reclaim_bytes) + (r.reclaims ? " (" + r.reclaims + " in flight)" : ""));
    cell(tr, bytes(r.data_served_bytes_total));
    cell(tr, num(r.put_keys_total));
    const got = r.get_keys_total || 0;
    cell(tr, num(got) + (got ? " (" + Math.round((100 * (r.get_hit_keys_total || 0)) / got) + "%)" : ""));
    const errs = r.errors_total || 0;
    const prev = lastErrors[o.node + ":" + o.generation];
    cell(tr, num(errs), errs > 0 && prev !== undefined && errs > prev ? "err" : "");
    lastErrors[o.node + ":" + o.generation] = errs;
    cell(tr, o.report_age_ms === null ? "none yet" : (o.report_age_ms / 1000).toFixed(1) + " s ago", o.stale ? "err" : "");
    body.appendChild(tr);
  }
}
function renderMaster(m) {
  const body = $("master").tBodies[0];
  body.textContent = "";
  const rows = [["routes", num(m.routes)], ["replicas", num(m.replicas)], ["owners", num(m.owners)],
                ["in-flight gets", num(m.inflight_gets)], ["replica tasks queued", num(m.replica_tasks_queued)],
                ["reclaims", num(m.reclaims)], ["reclaim fences", num(m.reclaim_fences)],
                ["tombstones", num(m.tombstones)], ["KV events kept", num(m.kv_events)],
                ["errors", num(m.errors_total)], ["malformed", num(m.malformed_total)]];
  for (const [k, v] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.className = "l";
    th.textContent = k;
    tr.appendChild(th);
    cell(tr, v, (k === "errors" || k === "malformed") && m[k === "errors" ? "errors_total" : "malformed_total"] > 0 ? "err" : "");
    body.appendChild(tr);
  }
}
function renderCharts(series) {
  const box = $("charts");
  box.textContent = "";
  const ns = "http://www.w3.org/2000/svg";
  for (const name of Object.keys(series)) {
    const v = series[name];
    const div = document.createElement("div");
    div.className = "chart" + (name.startsWith("errors") && v.some((x) => x > 0) ? " bad" : "");
    div.id = "chart-" + name;
    const label = document.createElement("span");
    label.textContent = name.replace(/_per_s$/, "").replace(/_/g, " ");
    const val = document.createElement("span");
    val.className = "v";
    const last = v.length ? v[v.length - 1] : 0;
    val.textContent = name.indexOf("bytes") >= 0 ? bytes(Math.round(last)) + "/s" : num(last) + "/s";
    div.appendChild(val);
    div.appendChild(label);
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 250 48");
    svg.setAttribute("preserveAspectRatio", "none");
    const max = Math.max(1, ...v);
    const pts = v.map((x, i) => (v.length < 2 ? 0 : (i * 250) / (v.length - 1)).toFixed(1) + "," + (46 - (x / max) * 44).toFixed(1));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
    div.appendChild(svg);
    box.appendChild(div);
  }
}
function renderAlerts(list) {
  const box = $("alerts");
  box.textContent = "";
  for (const a of list) {
    const d = document.createElement("div");
    d.textContent = a;
    box.appendChild(d);
  }
}
async function refresh() {
  try {
    const r = await fetch("/api/status", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    $("cluster").textContent = s.cluster;
    $("sub").textContent = "master " + s.master_address + " (" + (s.leading ? "leader" : "standby") +
        (s.term ? ", term " + s.term : "") + ") - version " + s.version + " - up " + s.uptime_s + " s - updated " +
        new Date(s.now_ms).toLocaleTimeString();
    renderAlerts(s.alerts);
    renderOwners(s.owners);
    renderMaster(s.master);
    renderCharts(s.history.series);
    document.body.dataset.updated = String(s.now_ms);
  } catch (e) {
    renderAlerts(["cannot read /api/status: " + e.message]);
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";
}

}  // namespace fluxon
