import Foundation
import HeraldCore
import LabHTTP
import LabPlan

/// Submissions the coordinator refused, kept a day with their reason (issue 40): the Lab and
/// Runs pages show them, so a study that could not start leaves a trace. In memory, at most
/// `capacity`, the oldest going first.
final class Refusals: @unchecked Sendable {
    // Invariant: `kept` is read and written under `lock` only.
    struct Refusal: Codable, Sendable, Equatable {
        var at: Double
        var source: String
        var reason: String
    }
    static let keptFor = 86_400.0
    static let capacity = 200
    private let lock = NSLock()
    private var kept: [Refusal] = []

    func note(source: String, reason: String, at t: Double) {
        lock.withLock {
            kept.append(Refusal(at: t, source: String(source.prefix(200)), reason: String(reason.prefix(500))))
            if kept.count > Self.capacity { kept.removeFirst(kept.count - Self.capacity) }
        }
    }

    /// The refusals of the last day, newest first.
    func recent(now t: Double) -> [Refusal] {
        lock.withLock {
            kept.removeAll { $0.at < t - Self.keptFor }
            return kept.reversed()
        }
    }
}

/// The lab at a glance, the strip atop the Lab and Runs pages and their live events.
struct LabSummary: Codable, Sendable, Equatable {
    var agentsAlive = 0, agentsBusy = 0, agentsMissing = 0, agentsLost = 0
    var dongles: [String: Int] = [:]
    var arming = 0, running = 0, gathering = 0
    /// Each plan's last ended run: its verdict (pass, fail, infra, aborted, none) and id.
    var lastVerdicts: [PlanVerdict] = []
    var refusedToday = 0

    struct PlanVerdict: Codable, Sendable, Equatable {
        var plan: String
        var run: String
        var verdict: String
    }
}

/// What a live Lab or Runs page updates without a reload.
struct LabSnapshot: Codable, Sendable {
    var summary: LabSummary
    struct Agent: Codable, Sendable { var name: String; var state: String; var heartbeatAge: Double?; var run: String? }
    struct Run: Codable, Sendable { var id: String; var state: String; var verdict: String }
    var agents: [Agent]
    /// The newest runs (what the first page of Runs lists).
    var runs: [Run]
}

extension Coordinator {
    /// A run's verdict in one word: pass, fail, infra (failed with infrastructure faults),
    /// aborted, or none (not analysed, or not ended).
    static func verdictWord(_ r: RunRecord) -> String {
        if r.state == .aborted || (r.abortRequested == true && r.bundle != nil) { return "aborted" }
        guard r.state.isFinal, let passed = r.passed else { return "none" }
        if passed { return "pass" }
        return r.infra == nil ? "fail" : "infra"
    }

    func labSummary() -> LabSummary {
        var sum = LabSummary()
        for a in agentViews {
            switch a.state {
            case .alive:
                sum.agentsAlive += 1
                if let s = a.status, s.state == .armed || s.state == .running { sum.agentsBusy += 1 }
            case .missing: sum.agentsMissing += 1
            case .lost: sum.agentsLost += 1
            default: break
            }
        }
        for d in dongleViews(history: 0) { sum.dongles[d.health.rawValue, default: 0] += 1 }
        let records = withLock { Array(runs.values) }
        sum.arming = records.filter { $0.state == .arming }.count
        sum.running = records.filter { $0.state == .running }.count
        sum.gathering = records.filter { $0.state == .gathering }.count
        var last = [String: RunRecord]()
        for r in records where r.state.isFinal {
            if let l = last[r.plan], l.created >= r.created { continue }
            last[r.plan] = r
        }
        sum.lastVerdicts = last.values.sorted { $0.plan < $1.plan }.map { LabSummary.PlanVerdict(plan: $0.plan, run: $0.id, verdict: Self.verdictWord($0)) }
        sum.refusedToday = dashboard.refusals.recent(now: now).count
        return sum
    }

    func labSnapshot() -> LabSnapshot {
        let t = now
        let agents = agentViews.map { a in
            LabSnapshot.Agent(name: a.info.name, state: a.state.rawValue, heartbeatAge: a.lastSeen.map { max(0, t - $0) }, run: a.status?.runId)
        }
        let newest = withLock { runs.values.sorted { $0.created > $1.created }.prefix(Self.runsPerPage) }
        return LabSnapshot(summary: labSummary(), agents: agents, runs: newest.map { LabSnapshot.Run(id: $0.id, state: $0.state.rawValue, verdict: Self.verdictWord($0)) })
    }

    /// The strip atop the Lab and Runs pages; each figure has an id the live script updates.
    func summaryStrip(_ sum: LabSummary) -> String {
        func item(_ id: String, _ label: String, _ value: Int, _ cls: String = "") -> String {
            "<span class=\"sum \(cls)\">\(label) <b id=\"\(id)\">\(value)</b></span>"
        }
        var s = "<div id=\"summary\" class=\"summary\">"
        s += item("s-alive", "agents alive", sum.agentsAlive) + item("s-busy", "busy", sum.agentsBusy)
        s += item("s-missing", "missing", sum.agentsMissing, sum.agentsMissing > 0 ? "fail" : "") + item("s-lost", "lost", sum.agentsLost, sum.agentsLost > 0 ? "fail" : "")
        s += " · " + item("s-arming", "runs arming", sum.arming) + item("s-running", "running", sum.running) + item("s-gathering", "gathering", sum.gathering)
        s += " · dongles <span id=\"s-dongles\">" + (sum.dongles.isEmpty ? "none" : sum.dongles.keys.sorted().map { "\(Self.h($0)) \(sum.dongles[$0]!)" }.joined(separator: ", ")) + "</span>"
        s += " · " + item("s-refused", "refused today", sum.refusedToday, sum.refusedToday > 0 ? "fail" : "")
        s += "<br><span class=\"small\">last verdict per plan: <span id=\"s-verdicts\">"
        s += sum.lastVerdicts.isEmpty ? "none yet" : sum.lastVerdicts.map {
            "\(Self.h($0.plan)) <a class=\"\($0.verdict)\" href=\"/runs/\(Self.segment($0.run))\">\(Self.h($0.verdict))</a>"
        }.joined(separator: ", ")
        s += "</span></span> <span id=\"conn\" class=\"small\">connecting…</span></div>"
        return s
    }

    /// The refusals of the last day as a table (Runs page), or nothing.
    func refusalsTable() -> String {
        let kept = dashboard.refusals.recent(now: now)
        guard !kept.isEmpty else { return "" }
        var s = "<h2>Refused submissions (the last 24 h)</h2><table id=\"refused\"><tr><th>when</th><th>plan</th><th>why</th></tr>"
        for r in kept.prefix(50) { s += "<tr><td class=\"small\">\(Self.time(r.at))</td><td>\(Self.h(r.source))</td><td>\(Self.h(r.reason))</td></tr>" }
        return s + "</table>"
    }

    /// `text/event-stream` for the Lab and Runs pages: a `snapshot` every 2 s while the session
    /// lasts (`sessionStream`, the same per-session cap as a run's events).
    func labEvents(_ s: DashboardSession) -> HTTPResponse {
        sessionStream(s, every: 2) { c in ([Self.sseEvent("snapshot", try LabJSON.encoder.encode(c.labSnapshot()))], false) }
    }

    static let runsPerPage = 50

    /// Updates the strip, the agents' liveness and the runs' states from each snapshot with DOM
    /// calls and `textContent` only; a run the page does not list yet reloads the first page.
    static let listScript = """
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
    """
}
