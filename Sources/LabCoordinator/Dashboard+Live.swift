import Foundation
import Hummingbird
import Synchronization
import HeraldCore
import LabHTTP
import LabPlan

/// The windows each ordered pair of a live run was heard in (the dashboard's pairs x time
/// strip), from the peers each node's heartbeat says it heard in the last 10 s. Windows are
/// 10 s for runs up to 30 min and 60 s beyond; only the last 30 minutes are kept (rolling), for
/// at most `maxRuns` runs of up to `maxNodes` nodes.
final class LiveStrips: Sendable {
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

    /// The runs' strips, and their nodes' shortNames, under one lock.
    private struct Kept {
        var tracks: [String: Track] = [:]
        var shortNames: [String: [String: String]] = [:]
    }
    private let kept = Mutex(Kept())

    static func window(duration: Double) -> Double { duration <= 1800 ? 10 : 60 }

    /// Records what a node heard, at coordinator time `t`.
    func note(_ r: RunRecord, node: String, recent: [String], at t: Double) {
        guard let startAt = r.startAt, t >= startAt, r.nodes.count <= Self.maxNodes else { return }
        kept.withLock { k in
            var track: Track
            if let existing = k.tracks[r.id] { track = existing } else {
                var names = [String: String]()
                if let plan = try? Plan.parse(yaml: r.planText, source: r.plan) { for n in plan.nodes { names[n.shortName] = n.name } }
                track = Track(window: Self.window(duration: r.duration), startAt: startAt, names: names, touched: t)
                if k.tracks.count >= Self.maxRuns, let oldest = k.tracks.min(by: { $0.value.touched < $1.value.touched }) { k.tracks[oldest.key] = nil }
            }
            let w = Saturating.int((t - startAt) / track.window)
            for short in recent {
                guard let peer = track.names[short], peer != node else { continue }
                track.hits["\(node)\u{1F}\(peer)", default: []].insert(w)
            }
            let oldest = w &- Saturating.int(Self.keptSeconds / track.window)
            for k in track.hits.keys { track.hits[k] = track.hits[k]!.filter { $0 > oldest } }
            track.touched = t
            k.tracks[r.id] = track
        }
    }

    func track(_ id: String) -> Track? { kept.withLock { $0.tracks[id] } }

    /// Each node's payload shortName, by node name, parsed from the run's plan once (the live
    /// page asks every second; the last 16 runs are kept).
    func shortNames(_ r: RunRecord) -> [String: String] {
        if let known = kept.withLock({ $0.shortNames[r.id] }) { return known }
        var names = [String: String]()
        if let plan = try? Plan.parse(yaml: r.planText, source: r.plan) { for n in plan.nodes { names[n.name] = n.shortName } }
        kept.withLock { k in
            if k.shortNames.count >= 16 { k.shortNames.removeAll() }
            k.shortNames[r.id] = names
        }
        return names
    }
}

/// A live run's counts over run time, for the live page's charts: per node, the last heartbeat's
/// peers detected (payload read), reads and RSSI rows in the last minute, in buckets of a round
/// width that keeps at most `maxPoints` of them over the run; for at most `maxRuns` runs of up to
/// `LiveStrips.maxNodes` nodes.
final class LiveSeries: Sendable {
    static let maxPoints = 360
    static let maxRuns = 8

    struct Sample: Equatable { var peers: Int; var reads: Int; var rssiPerMinute: Int }
    struct Track {
        var step: Double
        var startAt: Double
        /// Bucket index -> node name -> its last sample in that bucket.
        var buckets: [Int: [String: Sample]] = [:]
        var touched: Double
    }

    private let tracks = Mutex<[String: Track]>([:])

    /// A round width (s) for `duration`: at least 5 s, at most `maxPoints` buckets.
    static func step(duration: Double) -> Double {
        let need = duration / Double(maxPoints)
        return [5.0, 10, 15, 20, 30, 60, 120, 300, 600, 1800, 3600].first { $0 >= need } ?? max(3600, need.rounded(.up))
    }

    func note(_ r: RunRecord, node: String, _ sample: Sample, at t: Double) {
        guard let startAt = r.startAt, t >= startAt, r.nodes.count <= LiveStrips.maxNodes, r.duration.isFinite else { return }
        tracks.withLock { tracks in
            var track = tracks[r.id] ?? Track(step: Self.step(duration: r.duration), startAt: startAt, touched: t)
            if tracks[r.id] == nil, tracks.count >= Self.maxRuns, let oldest = tracks.min(by: { $0.value.touched < $1.value.touched }) { tracks[oldest.key] = nil }
            let k = min(Saturating.int((t - startAt) / track.step), Self.maxPoints)
            track.buckets[k, default: [:]][node] = sample
            track.touched = t
            tracks[r.id] = track
        }
    }

    func track(_ id: String) -> Track? { tracks.withLock { $0[id] } }
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
    /// Where the run is, from its state and its nodes' (`RunProgress`).
    var progress: RunProgress?
    /// The run's files the dashboard serves (`DashboardRoutes.runFileNames`), once it has them.
    var files: [String]?
    /// Counts over run time (s from the start): pairs detected (payload read) and reads over all
    /// nodes, RSSI rows in the last minute per node (in `nodes` order).
    var series: Series?
    /// The coordinator's log lines of this run (the last 100).
    var events: [RunEvents.Event]?

    struct Series: Codable {
        var step: Double
        var duration: Double
        var pairs: Int
        var t: [Double]
        var detected: [Int]
        var reads: [Int]
        var rssi: [[Int]]
    }
}

/// Where a run is, as its nodes say (issue 40: a run whose nodes are armed is not running yet):
/// the phase (arming, armed, running, gathering, then the run's final state), a sentence, and how
/// far into the phase (0-1) when that is known. The dashboard and `herald-lab run` say the same.
public struct RunProgress: Codable, Sendable, Equatable {
    public static let phases = ["arming", "armed", "running", "gathering"]
    public var phase: String
    /// `phase: detail` (what `herald-lab run` prints), and the detail alone (what the page puts
    /// beside the phase).
    public var text: String
    public var detail: String
    public var fraction: Double?

    public init(_ r: RunRecord, now t: Double) {
        let n = r.nodes.count
        let count = { (states: [RunRecord.NodeState]) in r.nodes.filter { states.contains($0.state) }.count }
        func s(_ v: Double) -> String { String(format: "%.0f s", max(0, v)) }
        switch r.state {
        case .arming:
            let armed = count([.armed])
            phase = "arming"
            detail = "\(armed) of \(n) nodes armed"
            fraction = n > 0 ? Double(armed) / Double(n) : nil
        case .running:
            let running = count([.running]), finished = count([.finished, .failed])
            let startAt = r.startAt ?? t
            if t < startAt || (running == 0 && finished == 0) {
                phase = "armed"
                detail = "\(count([.armed])) of \(n) nodes armed, " + (t < startAt ? "starting in \(s(startAt - t))" : "starting (no node says it runs yet)")
                fraction = nil
            } else {
                let elapsed = min(r.duration, t - startAt)
                phase = "running"
                detail = "\(s(elapsed)) of \(s(r.duration)), \(s(r.duration - elapsed)) left; \(running) of \(n) nodes running" + (finished > 0 ? ", \(finished) finished" : "")
                fraction = r.duration > 0 ? max(0, min(1, elapsed / r.duration)) : nil
            }
        case .gathering:
            let gathered = count([.complete, .partial, .lost])
            phase = "gathering"
            detail = "\(gathered) of \(n) nodes gathered"
            fraction = n > 0 ? Double(gathered) / Double(n) : nil
        default:
            phase = r.state.rawValue
            detail = ""
            fraction = 1
        }
        text = detail.isEmpty ? phase : "\(phase): \(detail)"
    }
}

extension Dashboard {
    /// Heartbeats older than this mark a node stale (three missed at the agents' 1 s).
    var staleAfter: Double { min(3, config.missingAfter) }

    /// A heartbeat's peers for the strip (from `heartbeat`).
    func noteLive(_ agent: String, _ status: LabWire.AgentStatus, at t: Double) {
        guard let id = status.runId, let recent = status.recentPeers, let r = run(id), r.state == .running, r.nodes.count <= LiveStrips.maxNodes,
              let node = r.nodes.first(where: { $0.agent == agent })?.name else { return }
        dashboard.strips.note(r, node: node, recent: recent, at: t)
        dashboard.series.note(r, node: node, LiveSeries.Sample(peers: status.peersDetected, reads: status.payloadsRead, rssiPerMinute: status.rssiLastMinute), at: t)
    }

    func liveSnapshot(_ r: RunRecord) -> LiveSnapshot {
        let t = now
        let seen = registry.seen
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
        snap.progress = RunProgress(r, now: t)
        if r.state.isFinal { snap.files = runFiles(r) }
        if let track = dashboard.series.track(r.id) { snap.series = Self.series(track, r) }
        snap.events = Array(runEvents(r).suffix(100))
        return snap
    }

    /// The charts' points: each bucket up to the newest, a node without a sample in a bucket
    /// keeping its last one.
    static func series(_ track: LiveSeries.Track, _ r: RunRecord) -> LiveSnapshot.Series {
        let n = r.nodes.count
        var out = LiveSnapshot.Series(step: track.step, duration: r.duration, pairs: n * max(0, n - 1), t: [], detected: [], reads: [], rssi: Array(repeating: [], count: n))
        guard let last = track.buckets.keys.max() else { return out }
        // The start: nothing detected, read or measured yet.
        out.t.append(0)
        out.detected.append(0)
        out.reads.append(0)
        for i in out.rssi.indices { out.rssi[i].append(0) }
        var current = [String: LiveSeries.Sample]()
        for k in 0...last {
            if let b = track.buckets[k] { current.merge(b) { _, new in new } }
            out.t.append(min(r.duration, Double(k + 1) * track.step))
            out.detected.append(current.values.reduce(0) { $0 + $1.peers })
            out.reads.append(current.values.reduce(0) { $0 + $1.reads })
            for (i, node) in r.nodes.enumerated() { out.rssi[i].append(current[node.name]?.rssiPerMinute ?? 0) }
        }
        return out
    }

    /// The run's lines of the coordinator's log; after a restart (or for a run whose lines were
    /// dropped), what its record says.
    func runEvents(_ r: RunRecord) -> [RunEvents.Event] {
        let kept = dashboard.events.of(r.id)
        if !kept.isEmpty { return kept }
        var out = [RunEvents.Event(at: r.created, level: "info", text: "submitted: \(r.nodes.count) nodes (from the run's record; this coordinator has no log lines of it)")]
        if let s = r.startAt { out.append(RunEvents.Event(at: s, level: "info", text: "start instant")) }
        if let e = r.ended { out.append(RunEvents.Event(at: e, level: r.state == .complete ? "notice" : "warning", text: "\(r.state.rawValue)\(r.message.map { ": " + OutsideText.line($0) } ?? "")")) }
        return out
    }

    /// `text/event-stream`: a `snapshot` event at once and every second while the run lasts, an
    /// `end` event when it is over; the stream stops when the session ends (sign-out, expiry).
    func events(_ s: DashboardSession, id: String) throws -> Response {
        guard run(id) != nil else { throw LabRefusal(.notFound, "no run \(id)") }
        return try sessionStream(s, every: 1) { c in
            guard let r = c.run(id) else { return nil }
            let snapshot = Self.sseEvent("snapshot", try LabJSON.encoder.encode(c.liveSnapshot(r)))
            return r.state.isFinal ? ([snapshot, Self.sseEvent("end", Data("{}".utf8))], true) : ([snapshot], false)
        }
    }

    /// One server-sent event.
    static func sseEvent(_ name: String, _ json: Data) -> Data {
        var event = Data("event: \(name)\ndata: ".utf8)
        event.append(json)
        event.append(contentsOf: "\n\n".utf8)
        return event
    }

    /// `text/event-stream` for a signed-in session (the run page's, the Lab and Runs pages'):
    /// at most `DashboardSessions.streamsPerSession` at once per session (a further one ends at
    /// once saying why; its browser retries in 10 s), then `next`'s events every `every` seconds
    /// while the session lasts, until `next` gives nil or says its events were the last.
    func sessionStream(_ s: DashboardSession, every seconds: Double,
                       next: @escaping @Sendable (Dashboard) throws -> (events: [Data], last: Bool)?) throws -> Response {
        let sessions = dashboard.sessions
        let cookie = "\(DashboardSessions.cookieName)=\(s.id)"
        let session = s.id
        return try .stream(headers: ["Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"]) { [weak self] write in
            guard sessions.openStream(session) else {
                try await write(Data("retry: 10000\nevent: refused\ndata: {\"reason\": \"this session has \(DashboardSessions.streamsPerSession) live views open; close one\"}\n\n".utf8))
                return
            }
            defer { sessions.closeStream(session) }
            try await write(Data("retry: 2000\n\n".utf8))
            while let self, sessions.find(cookieHeader: cookie, now: self.now) != nil, let (events, last) = try next(self) {
                for e in events { try await write(e) }
                if last { return }
                try await self.config.clock.sleep(for: seconds)
            }
        }
    }

    func livePage(_ s: DashboardSession, id: String) throws -> Response {
        guard let r = run(id) else {
            return messagePage("No such run", s, active: "Runs", text: "No run \(id).", status: .notFound)
        }
        let progress = RunProgress(r, now: now)
        let events = runEvents(r).suffix(100).map { e in
            ["at": HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: e.at)), "level": e.level, "text": e.text]
        }
        let files = Self.fileLinks(r.id, r.state.isFinal ? runFiles(r) : [])
        let context = mustacheContext([
            "plan": r.plan, "nodeCount": r.nodes.count, "duration": Saturating.int(r.duration), "phase": progress.phase, "detail": progress.detail,
            "steps": RunProgress.phases + ["done"], "fraction": progress.fraction.map { String(format: "%.3f", $0) },
            "final": r.state.isFinal, "verdict": Self.verdictContext(r), "hasFiles": !files.isEmpty, "files": files,
            "abort": r.state.isFinal ? nil : ["action": "/runs/\(Self.segment(r.id))/abort"] as [String: String],
            "thresholds": thresholdsLine(r), "tooMany": r.nodes.count > LiveStrips.maxNodes, "maxNodes": LiveStrips.maxNodes, "events": Array(events),
        ])
        return page("run", "Run \(r.id)", s, active: "Runs", context, script: "live.js")
    }

    /// Links to the run's files (names from `runFileNames` only), for a template.
    static func fileLinks(_ id: String, _ names: [String]) -> [[String: Any]] {
        names.compactMap { name in
            runFileNames.first { $0.name == name }.map { ["href": "/runs/\(segment(id))/files/\(name)", "label": $0.label] }
        }
    }

    /// The plan's thresholds (the run's pass/fail, `Verdict.checks`), from its stored plan.
    func thresholdsLine(_ r: RunRecord) -> String {
        guard let plan = try? Plan.parse(yaml: r.planText, source: r.plan) else { return "The plan's thresholds: the stored plan does not parse." }
        let t = plan.thresholds
        let f = { (v: Double) in String(format: "%g", v) }
        return "The plan's thresholds: detection ≥ \(f(t.detectionPct)) % · continuity ≥ \(f(t.continuityPct)) % · each pair's continuity ≥ \(f(t.pairContinuityPct)) %"
            + " · first detection ≤ \(f(t.timeToFirstDetection)) s · first read ≤ \(f(t.timeToFirstRead)) s · regression tolerance \(f(t.regressionTolerancePct)) %"
    }
}
