import Foundation
import Hummingbird
import Synchronization
import HeraldCore
import LabHTTP
import LabPlan

/// Submissions the coordinator refused, kept a day with their reason (issue 40): the Lab and
/// Runs pages show them, so a study that could not start leaves a trace. In memory, at most
/// `capacity`, the oldest going first.
final class Refusals: Sendable {
    struct Refusal: Codable, Sendable, Equatable {
        var at: Double
        var source: String
        var reason: String
    }
    static let keptFor = 86_400.0
    static let capacity = 200
    private let kept = Mutex<[Refusal]>([])

    func note(source: String, reason: String, at t: Double) {
        kept.withLock { kept in
            kept.append(Refusal(at: t, source: String(source.prefix(200)), reason: String(reason.prefix(500))))
            if kept.count > Self.capacity { kept.removeFirst(kept.count - Self.capacity) }
        }
    }

    /// The refusals of the last day, newest first.
    func recent(now t: Double) -> [Refusal] {
        kept.withLock { kept in
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

extension Dashboard {
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
        let records = withLock { s in Array(s.runs.values) }
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
        let newest = withLock { s in s.runs.values.sorted { $0.created > $1.created }.prefix(Self.runsPerPage) }
        return LabSnapshot(summary: labSummary(), agents: agents, runs: newest.map { LabSnapshot.Run(id: $0.id, state: $0.state.rawValue, verdict: Self.verdictWord($0)) })
    }

    /// The strip atop the Lab and Runs pages (summary.mustache; each figure has an id list.js updates).
    func summaryContext(_ sum: LabSummary) -> [String: Any] {
        [
            "agentsAlive": sum.agentsAlive, "agentsBusy": sum.agentsBusy, "agentsMissing": sum.agentsMissing, "missingBad": sum.agentsMissing > 0,
            "agentsLost": sum.agentsLost, "lostBad": sum.agentsLost > 0, "arming": sum.arming, "running": sum.running, "gathering": sum.gathering,
            "dongles": sum.dongles.keys.sorted().map { ["health": $0, "count": sum.dongles[$0] ?? 0] as [String: Any] },
            "refusedToday": sum.refusedToday, "refusedBad": sum.refusedToday > 0,
            "lastVerdicts": sum.lastVerdicts.map { ["plan": $0.plan, "verdict": $0.verdict, "href": "/runs/\(Self.segment($0.run))"] },
        ]
    }

    /// `text/event-stream` for the Lab and Runs pages: a `snapshot` every 2 s while the session
    /// lasts (`sessionStream`, the same per-session cap as a run's events).
    func labEvents(_ s: DashboardSession) throws -> Response {
        try sessionStream(s, every: 2) { c in ([Self.sseEvent("snapshot", try LabJSON.encoder.encode(c.labSnapshot()))], false) }
    }

    static let runsPerPage = 50
}
