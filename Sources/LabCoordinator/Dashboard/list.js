// The Lab and Runs pages' script (served at /static/list.js): updates the summary strip, the
// agents' liveness and the runs' states from /events/lab with DOM calls and textContent only.
"use strict";
const $ = (id) => document.getElementById(id);
function set(id, v) { const e = $(id); if (e) e.textContent = String(v); }
function age(s) { return s == null ? "–" : (s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min"); }
const src = new EventSource("/events/lab");
src.addEventListener("snapshot", (ev) => {
  const d = JSON.parse(ev.data), s = d.summary;
  set("s-alive", s.agentsAlive); set("s-busy", s.agentsBusy); set("s-missing", s.agentsMissing); set("s-lost", s.agentsLost);
  set("s-arming", s.arming); set("s-running", s.running); set("s-gathering", s.gathering); set("s-refused", s.refusedToday);
  const dongles = Object.keys(s.dongles).sort().map((k) => k + " " + s.dongles[k]).join(", ");
  set("s-dongles", dongles || "none");
  const v = $("s-verdicts");
  if (v) {
    v.textContent = "";
    s.lastVerdicts.forEach((p, i) => {
      if (i) v.appendChild(document.createTextNode(", "));
      v.appendChild(document.createTextNode(p.plan + " "));
      const a = document.createElement("a"); a.href = "/runs/" + encodeURIComponent(p.run); a.className = p.verdict; a.textContent = p.verdict; v.appendChild(a);
    });
    if (!s.lastVerdicts.length) v.textContent = "none yet";
  }
  for (const a of d.agents) {
    const row = document.querySelector('tr[data-agent="' + CSS.escape(a.name) + '"]');
    if (!row) continue;
    const st = row.querySelector(".liveness"); if (st) { st.textContent = a.state; st.className = "liveness " + a.state; }
    const ag = row.querySelector(".age"); if (ag) ag.textContent = age(a.heartbeatAge);
  }
  const table = $("runs");
  if (table) {
    let unknown = false;
    for (const r of d.runs) {
      const row = table.querySelector('tr[data-run="' + CSS.escape(r.id) + '"]');
      if (!row) { unknown = true; continue; }
      const st = row.querySelector(".state"); if (st && st.textContent !== r.state) { st.textContent = r.state; st.className = "state " + r.state; }
      if (row.dataset.verdict !== r.verdict) unknown = true;  // a verdict arrived: the row is drawn again
    }
    if (unknown && table.dataset.first === "1") location.reload();
    else if (unknown && d.runs.some((r) => { const row = table.querySelector('tr[data-run="' + CSS.escape(r.id) + '"]'); return row && row.dataset.verdict !== r.verdict; })) location.reload();
  }
  set("conn", "live");
});
src.addEventListener("error", () => set("conn", "reconnecting…"));
