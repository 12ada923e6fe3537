// The run page's script (served at /static/live.js): renders each server-sent snapshot with DOM
// calls and textContent only, so no outside text is ever parsed as HTML.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const PHASES = ["arming", "armed", "running", "gathering"];
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
function cell(row, text, cls, tag) { const td = document.createElement(tag || "td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); return td; }
function age(s) { return s == null ? "–" : (s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min"); }
function clock(t) { const m = Math.floor(t / 60), s = Math.round(t % 60); return m >= 60 ? Math.floor(m / 60) + ":" + String(m % 60).padStart(2, "0") + ":" + String(s).padStart(2, "0") : m + ":" + String(s).padStart(2, "0"); }
function svg(tag, attrs, parent) { const e = document.createElementNS(SVG, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
function label(parent, x, y, text, anchor, cls) { const t = svg("text", { x: x, y: y, "text-anchor": anchor || "middle", "class": cls || "tick" }, parent); t.textContent = text; return t; }
function nice(v) { if (v <= 0) return 1; const p = Math.pow(10, Math.floor(Math.log10(v))); for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p; return 10 * p; }
// A small line chart over run time: its time axis 0 to the run's duration, labelled in s or min.
function chart(id, title, t, lines, duration, yMax) {
  const W = 420, H = 150, L = 44, R = 8, T = 18, B = 32;
  const box = svg("svg", { id: id, width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "class": "chart" });
  svg("title", {}, box).textContent = title;
  label(box, L, 12, title, "start", "ctitle");
  const top = nice(Math.max(yMax || 0, 1, ...lines.map((l) => Math.max(0, ...l.values))));
  const x = (v) => L + (W - L - R) * Math.min(1, v / Math.max(duration, 1)), y = (v) => H - B - (H - B - T) * v / top;
  svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, "class": "axis" }, box); svg("line", { x1: L, y1: T, x2: L, y2: H - B, "class": "axis" }, box);
  const minutes = duration >= 600, step = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400].find((s) => duration / s <= 6) || 28800;
  for (let v = 0; v <= duration + 1e-9; v += step) { svg("line", { x1: x(v), y1: H - B, x2: x(v), y2: H - B + 4, "class": "axis" }, box); label(box, x(v), H - B + 15, minutes ? Math.round(v / 60) + "" : Math.round(v) + ""); }
  label(box, (L + W - R) / 2, H - 3, "run time (" + (minutes ? "min" : "s") + " from the start)", "middle", "atitle");
  for (const v of [0, top / 2, top]) { svg("line", { x1: L - 4, y1: y(v), x2: L, y2: y(v), "class": "axis" }, box); label(box, L - 6, y(v) + 4, String(Math.round(v * 10) / 10), "end"); }
  lines.forEach((l, i) => {
    const p = svg("polyline", { points: l.values.map((v, k) => x(t[k]) + "," + y(v)).join(" "), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5 }, box);
    svg("title", {}, p).textContent = l.name;
  });
  return box;
}
function renderCharts(d) {
  const c = $("charts"); c.replaceChildren();
  const s = d.series;
  if (!s || !s.t.length) { c.textContent = d.final ? "No counts over time were kept for this run here (the coordinator keeps them in memory while it watches a run); the report has the run over time." : "Waiting for the first heartbeats after the start…"; return; }
  c.appendChild(chart("chartpairs", "pairs detected (payload read), of " + s.pairs, s.t, [{ name: "pairs detected", values: s.detected }], s.duration, s.pairs));
  c.appendChild(chart("chartreads", "payload reads, all nodes", s.t, [{ name: "reads", values: s.reads }], s.duration));
  const rssi = chart("chartrssi", "RSSI rows per minute, per node", s.t, d.nodes.map((n, i) => ({ name: n.name, values: s.rssi[i] || [] })), s.duration);
  c.appendChild(rssi);
  if (d.nodes.length <= 12) {
    const legend = document.createElement("p"); legend.className = "small legend";
    d.nodes.forEach((n, i) => { const sw = document.createElement("span"); sw.className = "sw c" + (i % COLORS.length); legend.appendChild(sw); legend.appendChild(document.createTextNode(n.name)); });
    c.appendChild(legend);
  }
}
function renderProgress(d) {
  const p = d.progress || { phase: d.state, text: d.state, detail: "", fraction: null };
  $("state").textContent = p.phase; $("state").className = p.phase;
  $("left").textContent = d.final ? "" : p.detail;
  const at = d.final ? PHASES.length + 1 : PHASES.indexOf(p.phase);
  document.querySelectorAll("#steps li").forEach((li, i) => {
    li.className = i < at ? "done" : i === at ? "current" : "todo";
    if (li.dataset.phase === "done") { li.textContent = d.final ? d.state : "done"; if (d.final && d.state !== "complete") li.className = "ended"; }
  });
  const bar = $("bar");
  if (p.fraction == null) bar.removeAttribute("value"); else bar.value = p.fraction;
  bar.title = p.text;
}
function renderFiles(d) {
  const f = $("files"); f.replaceChildren();
  if (!d.files || !d.files.length) return;
  f.appendChild(document.createTextNode("Files: "));
  d.files.forEach((name, i) => {
    if (i) f.appendChild(document.createTextNode(" · "));
    const a = document.createElement("a"); a.href = location.pathname + "/files/" + encodeURIComponent(name); a.textContent = name === "bundle.tar.gz" ? "bundle" : name; f.appendChild(a);
  });
}
function renderEvents(d) {
  if (!d.events) return;
  const tb = document.querySelector("#events tbody"); tb.replaceChildren();
  for (const e of d.events) { const tr = document.createElement("tr"); cell(tr, new Date(e.at * 1000).toISOString().slice(0, 19).replace("T", " "), "small"); cell(tr, e.level, e.level); cell(tr, e.text); tb.appendChild(tr); }
}
function render(d) {
  renderProgress(d);
  $("totalreads").textContent = String(d.totalReads);
  $("message").textContent = d.message || "";
  if (d.final && d.aborted) { $("verdict").textContent = "aborted: no verdict" + (d.headline ? ": " + d.headline : ""); $("verdict").className = "noverdict"; }
  else if (d.passed != null) { $("verdict").textContent = (d.passed ? "PASS" : "FAIL") + (d.infra ? " (infra: " + d.infra.join("; ") + ")" : "") + (d.headline ? ": " + d.headline : ""); $("verdict").className = d.passed ? "pass" : (d.infra ? "infra" : "fail"); }
  if (d.final && $("abortform")) $("abortform").remove();
  renderFiles(d);
  const tb = document.querySelector("#nodes tbody"); tb.replaceChildren();
  for (const n of d.nodes) {
    const tr = document.createElement("tr"); tr.dataset.node = n.name;
    cell(tr, n.name); cell(tr, n.agent); cell(tr, n.state + (n.stale ? " (stale)" : ""), n.stale ? "stale" : n.state);
    cell(tr, String(n.peers), "num peers"); cell(tr, String(n.reads), "num reads"); cell(tr, String(n.rssiPerMinute), "num rssi");
    cell(tr, String(n.rssiTotal), "num"); cell(tr, n.gaps + (n.gaps ? " (" + Math.round(n.gapSeconds) + " s)" : ""), "num");
    cell(tr, age(n.heartbeatAge), n.stale ? "num stale" : "num");
    if (n.message) tr.title = n.message;
    tb.appendChild(tr);
  }
  renderCharts(d);
  const m = $("matrix"); m.replaceChildren();
  if (d.matrix) {
    const head = document.createElement("tr"); cell(head, "", null, "th");
    for (const n of d.nodes) cell(head, n.name, "v", "th").title = n.name;
    m.appendChild(head);
    d.matrix.forEach((row, i) => {
      const tr = document.createElement("tr"); cell(tr, d.nodes[i].name, "r", "th");
      row.forEach((v, j) => { const td = cell(tr, "", v === 1 ? "y" : v === -1 ? "s" : "n"); td.title = d.nodes[i].name + " → " + d.nodes[j].name + (v === 1 ? ": detected" : v === 0 ? ": not yet" : ""); });
      m.appendChild(tr);
    });
  }
  const st = $("strip"); st.replaceChildren();
  if (d.strip) {
    const w = d.strip.window;
    $("stripinfo").textContent = "Windows of " + w + " s in which each pair was heard, from " + clock(d.strip.first * w) + " of run time (rolling, last 30 min); the axis is run time (m:ss from the start).";
    // The time axis: a label every minute (10 s windows) or every 5 minutes (60 s windows).
    const every = w < 60 ? Math.max(1, Math.round(60 / w)) : 5;
    const axis = document.createElement("tr"); axis.className = "axis"; cell(axis, "run time", null, "th");
    for (let k = d.strip.first; k < d.strip.first + d.strip.columns;) {
      const span = Math.min(every - (k % every), d.strip.first + d.strip.columns - k);
      const th = cell(axis, k % every === 0 ? clock(k * w) : "", null, "th"); th.colSpan = span; k += span;
    }
    st.appendChild(axis);
    d.strip.pairs.forEach((p, i) => {
      const tr = document.createElement("tr"); cell(tr, p);
      for (const c of d.strip.rows[i]) cell(tr, "", c === "1" ? "y" : "n");
      st.appendChild(tr);
    });
  }
  renderEvents(d);
}
const es = new EventSource(location.pathname + "/events");
es.addEventListener("snapshot", (e) => { $("conn").textContent = "live"; render(JSON.parse(e.data)); });
es.addEventListener("end", () => { $("conn").textContent = "the run is over"; es.close(); });
es.onerror = () => { if (es.readyState !== EventSource.CLOSED) $("conn").textContent = "reconnecting…"; };
