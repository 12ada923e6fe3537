import Foundation
import HeraldCore
import LabHTTP
import LabPlan

/// The windows each ordered pair of a live run was heard in (the dashboard's pairs x time
/// strip), from the peers each node's heartbeat says it heard in the last 10 s. Windows are
/// 10 s for runs up to 30 min and 60 s beyond; only the last 30 minutes are kept (rolling), for
/// at most `maxRuns` runs of up to `maxNodes` nodes.
final class LiveStrips: @unchecked Sendable {
    static let maxNodes = 64
    static let maxRuns = 8
    static let keptSeconds = 1800.0

    struct Track {
        var window: Double
        var startAt: Double
        /// Node name by payload shortName.
        var names: [String: String]
        /// "observer\u{1F}observed" -> window indexes hit.
        var hits: [String: Set<Int>] = [:]
        var touched: Double
    }

    private let lock = NSLock()
    private var tracks: [String: Track] = [:]

    static func window(duration: Double) -> Double { duration <= 1800 ? 10 : 60 }

    /// Records what a node heard, at coordinator time `t`.
    func note(_ r: RunRecord, node: String, recent: [String], at t: Double) {
        guard let startAt = r.startAt, t >= startAt, r.nodes.count <= Self.maxNodes else { return }
        lock.withLock {
            var track: Track
            if let existing = tracks[r.id] { track = existing } else {
                var names = [String: String]()
                if let plan = try? Plan.parse(yaml: r.planText, source: r.plan) { for n in plan.nodes { names[n.shortName] = n.name } }
                track = Track(window: Self.window(duration: r.duration), startAt: startAt, names: names, touched: t)
                if tracks.count >= Self.maxRuns, let oldest = tracks.min(by: { $0.value.touched < $1.value.touched }) { tracks[oldest.key] = nil }
            }
            let w = Saturating.int((t - startAt) / track.window)
            for short in recent {
                guard let peer = track.names[short], peer != node else { continue }
                track.hits["\(node)\u{1F}\(peer)", default: []].insert(w)
            }
            let oldest = w &- Saturating.int(Self.keptSeconds / track.window)
            for k in track.hits.keys { track.hits[k] = track.hits[k]!.filter { $0 > oldest } }
            track.touched = t
            tracks[r.id] = track
        }
    }

    func track(_ id: String) -> Track? { lock.withLock { tracks[id] } }

    private var shortNames: [String: [String: String]] = [:]

    /// Each node's payload shortName, by node name, parsed from the run's plan once (the live
    /// page asks every second; the last 16 runs are kept).
    func shortNames(_ r: RunRecord) -> [String: String] {
        if let known = lock.withLock({ shortNames[r.id] }) { return known }
        var names = [String: String]()
        if let plan = try? Plan.parse(yaml: r.planText, source: r.plan) { for n in plan.nodes { names[n.name] = n.shortName } }
        lock.withLock {
            if shortNames.count >= 16 { shortNames.removeAll() }
            shortNames[r.id] = names
        }
        return names
    }
}

/// What the live page shows of a run, sent as one server-sent event a second.
struct LiveSnapshot: Codable {
    struct Node: Codable {
        var name: String
        var agent: String
        var state: String
        var peers: Int
        var reads: Int
        var rssiPerMinute: Int
        var rssiTotal: Int
        var gaps: Int
        var gapSeconds: Double
        /// Seconds since the agent's last heartbeat; `stale` after missed heartbeats.
        var heartbeatAge: Double?
        var stale: Bool
        var message: String?
    }
    struct Strip: Codable {
        var window: Double
        /// The first window shown (seconds from the start = first * window) and how many.
        var first: Int
        var columns: Int
        var pairs: [String]
        /// One string of "1" (heard), "0" (not), "-" (not yet) per pair.
        var rows: [String]
    }
    var id: String
    var plan: String
    var state: String
    var final: Bool
    var secondsLeft: Double?
    var elapsed: Double?
    var message: String?
    var nodes: [Node]
    /// nodes x nodes: 1 detected, 0 not yet, -1 the node itself, null unknown.
    var matrix: [[Int?]]?
    var strip: Strip?
    var passed: Bool?
    var headline: String?
    var totalReads: Int
    /// An operator aborted it: no verdict (issue 40).
    var aborted: Bool?
    /// Infrastructure faults the analysis found (its verdict is not the protocol's).
    var infra: [String]?
}

extension Coordinator {
    /// Heartbeats older than this mark a node stale (three missed at the agents' 1 s).
    var staleAfter: Double { min(3, config.missingAfter) }

    /// A heartbeat's peers for the strip (from `heartbeat`).
    func noteLive(_ agent: String, _ status: LabWire.AgentStatus, at t: Double) {
        guard let id = status.runId, let recent = status.recentPeers, let r = run(id), r.state == .running, r.nodes.count <= LiveStrips.maxNodes,
              let node = r.nodes.first(where: { $0.agent == agent })?.name else { return }
        dashboard.strips.note(r, node: node, recent: recent, at: t)
    }

    func liveSnapshot(_ r: RunRecord) -> LiveSnapshot {
        let t = now
        let seen = withLock { Dictionary(agents.map { ($0.key, ($0.value.lastSeen, $0.value.status)) }, uniquingKeysWith: { a, _ in a }) }
        let shortOf = r.nodes.count <= LiveStrips.maxNodes ? dashboard.strips.shortNames(r) : [:]
        var peersOf = [String: Set<String>]()
        let nodes = r.nodes.map { n -> LiveSnapshot.Node in
            // The newest heartbeat of this run, else what the run recorded.
            let (lastSeen, beat) = seen[n.agent] ?? (nil, nil)
            let s = beat?.runId == r.id ? beat : n.status
            if let p = s?.peers { peersOf[n.name] = Set(p) }
            let gaps = s?.gaps ?? n.gaps ?? []
            let age = lastSeen.map { t - $0 }
            return LiveSnapshot.Node(name: n.name, agent: n.agent, state: n.state.rawValue, peers: s?.peersDetected ?? 0, reads: s?.payloadsRead ?? 0,
                                     rssiPerMinute: s?.rssiLastMinute ?? 0, rssiTotal: s?.rssiTotal ?? 0, gaps: gaps.count,
                                     gapSeconds: gaps.reduce(0.0) { $0 + max(0, $1.to - $1.from) }, heartbeatAge: age,
                                     stale: !r.state.isFinal && (age ?? .infinity) > staleAfter, message: n.message ?? s?.message)
        }
        var snap = LiveSnapshot(id: r.id, plan: r.plan, state: r.state.rawValue, final: r.state.isFinal,
                                secondsLeft: r.startAt.map { r.state == .running ? max(0, $0 + r.duration - t) : 0 },
                                elapsed: r.startAt.map { max(0, min(r.duration, t - $0)) }, message: r.message, nodes: nodes,
                                passed: r.passed, headline: r.headline, totalReads: nodes.reduce(0) { $0 + $1.reads },
                                aborted: r.state == .aborted || r.abortRequested == true ? true : nil, infra: r.infra)
        if r.nodes.count <= LiveStrips.maxNodes {
            snap.matrix = r.nodes.map { a in
                r.nodes.map { b -> Int? in
                    if a.name == b.name { return -1 }
                    guard let peers = peersOf[a.name], let short = shortOf[b.name] else { return nil }
                    return peers.contains(short) ? 1 : 0
                }
            }
        }
        // Before its start (a start far ahead, a clock that stepped) a run has no strip yet.
        if let track = dashboard.strips.track(r.id), let startAt = r.startAt, t >= startAt {
            let current = min(Saturating.int((min(t, startAt + r.duration) - startAt) / track.window), 10_000_000)
            let columns = max(1, min(current + 1, Saturating.int(LiveStrips.keptSeconds / track.window)))
            let first = current + 1 - columns
            var pairs = [String](), rows = [String]()
            for a in r.nodes { for b in r.nodes where a.name != b.name {
                let hit = track.hits["\(a.name)\u{1F}\(b.name)"] ?? []
                pairs.append("\(a.name) → \(b.name)")
                rows.append(String((first...current).map { hit.contains($0) ? "1" : "0" }))
            } }
            snap.strip = LiveSnapshot.Strip(window: track.window, first: first, columns: columns, pairs: Array(pairs.prefix(400)), rows: Array(rows.prefix(400)))
        }
        return snap
    }

    /// `text/event-stream`: a `snapshot` event at once and every second while the run lasts, an
    /// `end` event when it is over; the stream stops when the session ends (sign-out, expiry).
    func events(_ s: DashboardSession, id: String) throws -> HTTPResponse {
        guard run(id) != nil else { throw HTTPError(.notFound, "no run \(id)") }
        let sessions = dashboard.sessions
        let cookie = "\(DashboardSessions.cookieName)=\(s.id)"
        var response = HTTPResponse(.ok, headers: ["Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"])
        let session = s.id
        response.body = .stream { [weak self] write in
            // At most streamsPerSession at once per session: a further one ends at once, saying
            // why (its browser retries in 10 s), and holds none of the service's places.
            guard sessions.openStream(session) else {
                try await write(Data("retry: 10000\nevent: refused\ndata: {\"reason\": \"this session has \(DashboardSessions.streamsPerSession) live views open; close one\"}\n\n".utf8))
                return
            }
            defer { sessions.closeStream(session) }
            try await write(Data("retry: 2000\n\n".utf8))
            while let self, sessions.find(cookieHeader: cookie, now: self.now) != nil, let r = self.run(id) {
                let json = try LabJSON.encoder.encode(self.liveSnapshot(r))
                var event = Data("event: snapshot\ndata: ".utf8)
                event.append(json)
                event.append(contentsOf: "\n\n".utf8)
                try await write(event)
                if r.state.isFinal {
                    try await write(Data("event: end\ndata: {}\n\n".utf8))
                    return
                }
                try await Task.sleep(nanoseconds: 1_000_000_000)
            }
        }
        return response
    }

    func livePage(_ s: DashboardSession, id: String) throws -> HTTPResponse {
        guard let r = run(id) else {
            return page("No such run", s, active: "Runs", body: "<p>No run \(Self.h(id)).</p>", status: .notFound)
        }
        let abort = r.state.isFinal ? "" : "<form method=\"post\" action=\"/runs/\(Self.segment(r.id))/abort\" id=\"abortform\"><input type=\"hidden\" name=\"csrf\" value=\"\(s.csrf)\"><button id=\"abort\">Abort the run</button></form>"
        let body = """
        <p>Plan <b>\(Self.h(r.plan))</b>, \(r.nodes.count) nodes for \(Saturating.int(r.duration)) s. State: <b id="state" class="\(r.state.rawValue)">\(r.state.rawValue)</b>
        <span id="left"></span> · reads in all: <b id="totalreads">–</b> · <span id="conn" class="small">connecting…</span></p>
        <p id="message" class="small"></p><p id="verdict"></p>\(abort)
        <h2>Nodes</h2><table id="nodes"><thead><tr><th>node</th><th>agent</th><th>state</th><th>peers</th><th>reads</th><th>RSSI/min</th><th>RSSI rows</th><th>gaps</th><th>last heartbeat</th></tr></thead><tbody></tbody></table>
        \(r.nodes.count > LiveStrips.maxNodes ? "<p class=\"small\">The matrix and the strip are drawn for runs of up to \(LiveStrips.maxNodes) nodes; the report has every pair.</p>" : "")
        <h2>Detection matrix</h2><p class="small">Row: the node that detects; column: the node detected. Green: detected so far.</p><table class="m" id="matrix"></table>
        <h2>Pairs × time</h2><p class="small" id="stripinfo">Windows in which each pair was heard (rolling, last 30 min).</p><table class="strip" id="strip"></table>
        <p class="small"><a href="/runs">All runs</a></p>
        """
        return page("Run \(r.id)", s, active: "Runs", body: body, script: Self.liveScript)
    }

    /// Renders each snapshot with DOM calls and `textContent` only: no outside text is ever parsed as HTML.
    static let liveScript = """
    "use strict";
    const $ = (id) => document.getElementById(id);
    function cell(row, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); return td; }
    function age(s) { return s == null ? "–" : (s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min"); }
    function render(d) {
      $("state").textContent = d.state; $("state").className = d.state;
      $("left").textContent = d.secondsLeft != null && d.state === "running" ? "(" + Math.round(d.secondsLeft) + " s left)" : "";
      $("totalreads").textContent = String(d.totalReads);
      $("message").textContent = d.message || "";
      if (d.final && d.aborted) { $("verdict").textContent = "aborted: no verdict" + (d.headline ? ": " + d.headline : ""); $("verdict").className = "noverdict"; }
      else if (d.passed != null) { $("verdict").textContent = (d.passed ? "PASS" : "FAIL") + (d.infra ? " (infra: " + d.infra.join("; ") + ")" : "") + (d.headline ? ": " + d.headline : ""); $("verdict").className = d.passed ? "pass" : (d.infra ? "infra" : "fail"); }
      if (d.final && $("abortform")) $("abortform").remove();
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
      const m = $("matrix"); m.replaceChildren();
      if (d.matrix) {
        const head = document.createElement("tr"); cell(head, "");
        for (const n of d.nodes) cell(head, n.name.slice(0, 3)).title = n.name;
        m.appendChild(head);
        d.matrix.forEach((row, i) => {
          const tr = document.createElement("tr"); cell(tr, d.nodes[i].name);
          row.forEach((v, j) => { const td = cell(tr, "", v === 1 ? "y" : v === -1 ? "s" : "n"); td.title = d.nodes[i].name + " → " + d.nodes[j].name + (v === 1 ? ": detected" : v === 0 ? ": not yet" : ""); });
          m.appendChild(tr);
        });
      }
      const st = $("strip"); st.replaceChildren();
      if (d.strip) {
        $("stripinfo").textContent = "Windows of " + d.strip.window + " s in which each pair was heard, from " + Math.round(d.strip.first * d.strip.window) + " s (rolling, last 30 min).";
        d.strip.pairs.forEach((p, i) => {
          const tr = document.createElement("tr"); cell(tr, p);
          for (const c of d.strip.rows[i]) cell(tr, "", c === "1" ? "y" : "n");
          st.appendChild(tr);
        });
      }
    }
    const es = new EventSource(location.pathname + "/events");
    es.addEventListener("snapshot", (e) => { $("conn").textContent = "live"; render(JSON.parse(e.data)); });
    es.addEventListener("end", () => { $("conn").textContent = "the run is over"; es.close(); });
    es.onerror = () => { if (es.readyState !== EventSource.CLOSED) $("conn").textContent = "reconnecting…"; };
    """
}
