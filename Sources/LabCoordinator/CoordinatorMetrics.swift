import Foundation
import Hummingbird
import Synchronization
import HeraldCore
import HeraldAnalysis
import LabHTTP
import LabHistory
import LabMetrics
import LabPlan
import Logging

/// `GET /metrics`: the lab in Prometheus's text format, for the operator's credential or the scrape
/// credential (`scrape.token`), which opens this route and no other. Each scrape brings the
/// families up to date from what the coordinator keeps anyway (agents, dongles, run records, each
/// ended run's summary.json, read once), so no run, gather or heartbeat path carries metric code.
/// Labels stay low in cardinality: state, health, result, plan, agent and node, never a pair.
///
/// A read-model over the services: it reads the runs (RunController), the agents (AgentRegistry)
/// and the dongles (DongleService) it is given, with the clock, when a scrape asks.
final class CoordinatorMetrics: Sendable {
    let metrics = LabMetrics(service: "coordinator")
    private let runs: RunController
    private let registry: AgentRegistry
    private let dongles: DongleService
    private let results: URL
    private let clock: any LabClock
    private let logger: Logger

    init(runs: RunController, registry: AgentRegistry, dongles: DongleService, results: URL, clock: any LabClock, logger: Logger) {
        self.runs = runs
        self.registry = registry
        self.dongles = dongles
        self.results = results
        self.clock = clock
        self.logger = logger
    }
    /// Runs whose start delay and duration were recorded, and each ended run's analysis counts.
    private struct Seen {
        var observed: Set<String> = []
        var counts: [String: Counts] = [:]
    }
    private let seen = Mutex(Seen())

    struct Counts {
        var plan: String
        var windows = 0, windowsHit = 0, pairs = 0, pairsDetected = 0, rssiRows = 0
    }

    /// The counts of a run's summary.json (strict mode), read once; nil while it has none.
    func counts(of r: RunRecord) -> Counts? {
        if let c = seen.withLock({ $0.counts[r.id] }) { return c }
        guard let bundle = r.bundle else { return nil }
        let url = URL(fileURLWithPath: bundle).appendingPathComponent("report/summary.json")
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        var c = Counts(plan: r.plan)
        do {
            let s = try ReportWriter.readSummary(url)
            c.windows = s.strict.maxwindows
            c.windowsHit = s.strict.achievedwindows
            c.pairs = s.strict.maxpairs
            c.pairsDetected = s.strict.achieveddetections
            c.rssiRows = s.pairs.reduce(0) { $0 + max(0, $1.rssiSamples) }
        } catch {
            return nil // counted once it can be read (analysis still writing, or a damaged file, which the run's report says)
        }
        seen.withLock { $0.counts[r.id] = c }
        return c
    }

    /// True the first time it is asked for `id`.
    func firstTime(_ id: String) -> Bool { seen.withLock { $0.observed.insert(id).inserted } }
}

extension CoordinatorMetrics {
    /// Runs per testbed the infra rate counts (metrics and Trends).
    static let infraWindow = 30
    static let runStates: [RunRecord.State] = [.arming, .running, .gathering, .complete, .aborted, .failed, .cancelled]

    /// Ended runs by what `heraldlab_run_verdicts_total` and `heraldlab_runs_without_verdict_total`
    /// count them as (issue 40): `pass`, `fail`, `aborted` (no verdict, whatever an older record
    /// says) or `infra` (a failed verdict with infrastructure faults: not the protocol's fail).
    /// Runs without an analysed bundle are in none.
    static func verdictCounts(_ ended: [RunRecord]) -> [String: Int] {
        var out = [String: Int]()
        for r in ended {
            let key: String
            if r.state == .aborted || (r.abortRequested == true && r.bundle != nil) { key = "aborted" }
            else if let passed = r.passed { key = passed ? "pass" : ((r.infra ?? []).isEmpty ? "fail" : "infra") }
            else { continue }
            out[key, default: 0] += 1
        }
        return out
    }

    /// Brings every family up to date.
    func collect() {
        let m = metrics
        let t = clock.now()
        let views = registry.views
        for state in [Coordinator.Liveness.alive, .missing, .lost, .unknown] {
            m.gauge("heraldlab_agents", "Agents the coordinator knows, by liveness.", ["state": state.rawValue])
                .record(views.filter { $0.state == state }.count)
        }
        for v in views {
            if let seen = v.lastSeen {
                m.gauge("heraldlab_agent_heartbeat_age_seconds", "Seconds since the agent's last heartbeat.", ["agent": v.info.name]).record(max(0, t - seen))
            }
        }
        let records = runs.withLock { s in Array(s.runs.values) }
        let dongleHealth = dongles.healths
        for h in LabWire.DongleHealth.allCases {
            m.gauge("heraldlab_dongles", "Dongles the coordinator knows, by health.", ["health": h.rawValue]).record(dongleHealth.filter { $0 == h }.count)
        }
        for s in Self.runStates {
            m.gauge("heraldlab_runs", "Runs the coordinator keeps, by state.", ["state": s.rawValue]).record(records.filter { $0.state == s }.count)
        }
        let ended = records.filter { $0.state.isFinal }
        for s in Self.runStates where s.isFinal {
            m.mirror("heraldlab_runs_ended_total", "Runs that ended, by how.", ["result": s.rawValue], to: Int64(ended.filter { $0.state == s }.count))
        }
        let verdicts = Self.verdictCounts(ended)
        for verdict in ["pass", "fail"] {
            m.mirror("heraldlab_run_verdicts_total", "Ended runs whose bundle was analysed, by the plan's verdict; aborted runs have none, and runs with infrastructure faults are not counted as fails (heraldlab_runs_without_verdict_total).", ["verdict": verdict],
                     to: Int64(verdicts[verdict] ?? 0))
        }
        for reason in ["aborted", "infra"] {
            m.mirror("heraldlab_runs_without_verdict_total", "Ended runs with a bundle and no counted verdict: aborted by an operator, or failed with infrastructure faults (nodes not complete, gaps, dongle recoveries).", ["reason": reason],
                     to: Int64(verdicts[reason] ?? 0))
        }
        let gathered = ended.filter { $0.bundle != nil }.flatMap(\.nodes).flatMap(\.files).reduce(Int64(0)) { $0 + max(0, $1.bytes) }
        m.mirror("heraldlab_gather_bytes_total", "Bytes of node logs gathered into bundles.", to: gathered)
        for r in records.sorted(by: { $0.created < $1.created }) {
            guard let start = r.startAt, r.state.isFinal, firstTime(r.id) else { continue }
            m.timer("heraldlab_run_start_delay_seconds", "From a run's submission to its nodes' common start: arming, pre-flight and the barrier.",
                    buckets: [.seconds(1), .seconds(2), .seconds(5), .seconds(10), .seconds(30), .seconds(60), .seconds(300)])
                .recordNanoseconds(Saturating.nanoseconds(start - r.created))
            // The actual duration: from the nodes' common start to the run's end (gathered),
            // whatever its result; records from before `ended` was kept give the planned one.
            m.timer("heraldlab_run_duration_seconds", "From a run's common start to its end (nodes stopped and gathered), of the runs that started.",
                    buckets: [.seconds(60), .seconds(600), .seconds(3600), .seconds(4 * 3600), .seconds(12 * 3600), .seconds(24 * 3600)])
                .recordNanoseconds(Saturating.nanoseconds(max(0, (r.ended ?? start + r.duration) - start)))
        }
        // Every plan the coordinator has a run of has its series from its first submission, at
        // 0 until a run is analysed, so that `increase()` over a new nightly plan is 0, not NaN.
        var byPlan: [String: CoordinatorMetrics.Counts] = [:]
        for r in records { byPlan[r.plan] = CoordinatorMetrics.Counts(plan: r.plan) }
        var lastSuccess: [String: Double] = [:]
        // Each plan's last analysed run: its headline figures and verdict as gauges.
        var lastRun: [String: (RunRecord, CoordinatorMetrics.Counts)] = [:]
        for r in ended.sorted(by: { $0.created < $1.created }) {
            if let c = counts(of: r) { lastRun[r.plan] = (r, c) }
        }
        for (plan, (r, c)) in lastRun {
            let l = ["plan": plan]
            if c.pairs > 0 { m.gauge("heraldlab_plan_last_run_detection_ratio", "Of the plan's last analysed run: ordered pairs detected over pairs (strict).", l).record(Double(c.pairsDetected) / Double(c.pairs)) }
            if c.windows > 0 { m.gauge("heraldlab_plan_last_run_continuity_ratio", "Of the plan's last analysed run: 30-s windows hit over windows (strict).", l).record(Double(c.windowsHit) / Double(c.windows)) }
            if let passed = r.passed { m.gauge("heraldlab_plan_last_run_passed", "Of the plan's last analysed run: 1 if it passed its thresholds, 0 if not.", l).record(passed ? 1 : 0) }
            if let end = r.ended ?? r.startAt.map({ $0 + r.duration }) { m.gauge("heraldlab_plan_last_run_end_timestamp_seconds", "End of the plan's last analysed run (Unix time).", l).record(end) }
        }
        for r in ended {
            if r.passed == true, let start = r.startAt { lastSuccess[r.plan] = max(lastSuccess[r.plan] ?? 0, start + r.duration) }
            guard let c = counts(of: r) else { continue }
            var sum = byPlan[c.plan] ?? CoordinatorMetrics.Counts(plan: c.plan)
            sum.windows += c.windows; sum.windowsHit += c.windowsHit; sum.pairs += c.pairs; sum.pairsDetected += c.pairsDetected; sum.rssiRows += c.rssiRows
            byPlan[c.plan] = sum
        }
        for (plan, c) in byPlan {
            let l = ["plan": plan]
            m.mirror("heraldlab_windows_total", "30-s windows of ordered pairs in analysed runs (strict): the continuity denominator.", l, to: Int64(c.windows))
            m.mirror("heraldlab_windows_hit_total", "30-s windows of ordered pairs with at least one RSSI row (strict).", l, to: Int64(c.windowsHit))
            m.mirror("heraldlab_pairs_total", "Ordered pairs in analysed runs: the detection denominator.", l, to: Int64(c.pairs))
            m.mirror("heraldlab_pairs_detected_total", "Ordered pairs that detected each other (strict).", l, to: Int64(c.pairsDetected))
            m.mirror("heraldlab_rssi_rows_total", "RSSI rows in the contact events of analysed runs.", l, to: Int64(c.rssiRows))
        }
        for (plan, at) in lastSuccess {
            m.gauge("heraldlab_last_nightly_success_timestamp_seconds", "End of the plan's last run that passed its thresholds (Unix time).", ["plan": plan]).record(at)
        }
        // Infrastructure faults per testbed over its last 30 analysed runs (issue 38): the
        // ratio of the two gauges is the infra rate Grafana plots.
        let history = results.appendingPathComponent("history.sqlite")
        if FileManager.default.fileExists(atPath: history.path) {
            do {
                for rate in try HistoryStore(url: history).infraRates(last: Self.infraWindow) {
                    let l = ["testbed": rate.testbed]
                    m.gauge("heraldlab_testbed_recent_runs", "Analysed runs of the testbed counted for its infra rate (its last 30).", l).record(rate.runs)
                    m.gauge("heraldlab_testbed_recent_infra_runs", "Of those, runs with infrastructure faults (a node not complete, gaps, dongle recoveries).", l).record(rate.infra)
                }
            } catch {
                logger.warning("metrics: the history cannot be read for the infra rate: \(error)")
            }
        }
        // Running nodes' clock offsets, labelled with their run and plan; a series goes with its run.
        var offsets = [[String: String]]()
        for r in records where r.state == .running {
            for n in r.nodes {
                guard let offset = n.clockBefore?.offset else { continue }
                let l = ["node": n.name, "agent": n.agent, "run": r.id, "plan": r.plan]
                m.gauge("heraldlab_node_clock_offset_seconds", "A running node's clock offset from the coordinator's, as measured at arming.", l).record(offset)
                offsets.append(l)
            }
        }
        m.pruneGauges("heraldlab_node_clock_offset_seconds", keep: offsets)
    }
}
