import Foundation
import HeraldAnalysis
import LabHistory
import PostgresNIO

/// Reading across labs (issue 41 item 4): the shared store as a HistoryReading (`history`,
/// `compare`, the dashboard's Trends), each lab's regression judged against its own nights
/// (SharedRegressionMemory). Every value is a bound parameter.
extension SharedResultsStore: HistoryReading {
    public nonisolated var historyName: String { location.description }
    public nonisolated var namesLabs: Bool { true }

    /// The labs with runs, by name.
    public func historyLabs() async throws -> [String] {
        try await using { c in
            var out = [String]()
            for try await (lab) in try await c.query("SELECT DISTINCT lab FROM lab_run ORDER BY lab", logger: Self.quiet).decode(String.self) { out.append(lab) }
            return out
        }
    }

    /// The plans with runs of these labs (every lab's when empty), by name.
    public func historyPlans(labs: [String]) async throws -> [String] {
        try await using { c in
            var out = [String]()
            let q: PostgresQuery = "SELECT DISTINCT plan FROM lab_run WHERE \(labs.isEmpty) OR lab = ANY(\(labs)) ORDER BY plan"
            for try await (plan) in try await c.query(q, logger: Self.quiet).decode(String.self) { out.append(plan) }
            return out
        }
    }

    public func historyRuns(labs: [String], plan: String?, last: Int?) async throws -> [LabRun] {
        try await runs(labs: labs, plan: plan, last: last).map(Self.labRun)
    }

    /// Each testbed's infra rate: by testbed for one lab, as `lab/testbed` for several or all.
    public func historyInfraRates(labs: [String], last: Int) async throws -> [HistoryStore.InfraRate] {
        if labs.count == 1 { return try await infraRates(lab: labs[0], last: last) }
        return try await using { c in
            let q: PostgresQuery = """
                SELECT lab || '/' || testbed, count(*), count(*) FILTER (WHERE infra <> '')
                FROM (SELECT lab, testbed, infra, row_number() OVER (PARTITION BY lab, testbed ORDER BY id DESC) AS k
                      FROM lab_run WHERE \(labs.isEmpty) OR lab = ANY(\(labs))) t
                WHERE k <= \(Int64(max(1, last)))
                GROUP BY 1 ORDER BY 1
                """
            var out = [HistoryStore.InfraRate]()
            for try await (testbed, runs, infra) in try await c.query(q, logger: Self.quiet).decode((String, Int64, Int64).self) {
                out.append(.init(testbed: testbed, runs: Int(runs), infra: Int(infra)))
            }
            return out
        }
    }

    /// A shared row as the local history's readers see it: recorded at its UTC time, its
    /// bundle's URL where the local history has its report.
    public static func labRun(_ r: SharedRun) -> LabRun {
        LabRun(lab: r.lab, run: HistoryStore.Run.make(
            id: r.id, recordedAt: AnalysisTime.format(r.recordedAt.timeIntervalSince1970), runId: r.runId, path: r.path, plan: r.plan,
            variant: r.variant, devices: r.devices, detectionPct: r.detectionPct, continuityPct: r.continuityPct,
            heraldContinuityPct: r.heraldContinuityPct, longevity: r.longevity, passed: r.passed, reportPath: r.bundleURL,
            summaryJSON: r.summaryJSON, settingsKey: r.settingsKey, testbed: r.testbed, infra: r.infra, aborted: r.verdict == "aborted"),
            dongleMake: r.dongleMake)
    }

    // MARK: Regression of one lab

    /// `lab`'s runs of `plan` whatever their settings (to say why none matched).
    public func count(lab: String, plan: String) async throws -> Int {
        try await using { c in
            var n: Int64 = 0
            for try await (x) in try await c.query("SELECT count(*) FROM lab_run WHERE lab = \(lab) AND plan = \(plan)", logger: Self.quiet).decode(Int64.self) { n = x }
            return Int(n)
        }
    }

    /// `lab`'s nightly series like `r` (plan, variant, settings, testbed) up to and including
    /// store row `row`, without nights with infrastructure faults, the last `last`, oldest first.
    public func series(like r: AnalysisResult, lab: String, upTo row: Int64, last: Int) async throws -> [SharedRun] {
        let key = HistoryStore.settingsKey(r)
        let rows = try await fetchRuns("""
            SELECT \(unescaped: Self.runColumns) FROM lab_run
            WHERE lab = \(lab) AND plan = \(r.input.plan ?? "") AND variant = \(r.input.variant ?? "") AND settings_key = \(key)
              AND testbed = \(r.input.testbed ?? "") AND infra = '' AND id <= \(row)
            ORDER BY id DESC LIMIT \(Int64(max(1, last)))
            """)
        return rows.reversed()
    }

    /// `lab`'s alerts of the runs like `r`, oldest first.
    public func alerts(like r: AnalysisResult, lab: String) async throws -> [Alert] {
        let key = HistoryStore.settingsKey(r)
        return try await alerts(lab: lab, plan: r.input.plan ?? "").filter {
            $0.variant == (r.input.variant ?? "") && $0.settingsKey == key && $0.testbed == (r.input.testbed ?? "")
        }
    }

    /// Closes an open alert: the level `returned` (at store row `row`). Needs the operators'
    /// role (UPDATE on lab_alert).
    public func closeAlert(_ id: Int64, as state: HistoryStore.Alert.State, row: Int64?, by who: String?, reason: String?, at date: Date = Date()) async throws {
        try await transaction { c in
            let q: PostgresQuery = """
                UPDATE lab_alert SET state = \(state.rawValue), closed_at = \(date), closed_row = \(row), closed_by = \(who), reason = \(reason)
                WHERE id = \(id) AND state = 'regressed'
                """
            try await c.query(q, logger: Self.quiet)
        }
    }
}

/// `regress --baseline history --history postgres://…` (issue 41): `current` of `lab` judged
/// against that lab's own earlier nights like it (plan, variant, settings, testbed), never
/// another lab's; alerts opened, kept and closed per lab as RegressionMemory does in the local
/// history. The run is stored first (as lab `lab`) when the coordinator's writer has not yet.
public enum SharedRegressionMemory {
    public static func judge(current: AnalysisResult, lab: String, store: SharedResultsStore, last: Int, tolerancePct: Double,
                             at date: Date = Date()) async throws -> Regression.Judgement {
        let runId = current.input.runId ?? URL(fileURLWithPath: current.input.path).lastPathComponent
        let row: Int64
        if let stored = try await store.run(lab: lab, runId: runId)?.id { row = stored } else {
            row = try await store.record(try SharedRun(current, lab: lab, at: date)).id
        }
        let alerts = try await store.alerts(like: current, lab: lab)
        let open = alerts.last { $0.state == .regressed && $0.openedRow < row }
        let history = try await store.baseline(like: current, lab: lab, last: last).map { try $0.summary() }
        var j = Regression.judge(current: current, history: history, tolerancePct: tolerancePct)
        let flagged = j.findings.filter(\.regressed).map(\.label)
        let plan = current.input.plan ?? "PLAN"
        switch (j.verdict, open) {
        case (.regression, nil):
            if alerts.contains(where: { $0.openedRow == row }) {
                j.alert = "regressed: this night opened lab \(lab)'s alert (judged again)"
            } else {
                try await store.openAlert(lab: lab, like: current, row: row, metrics: flagged, at: date)
                j.alert = "regressed: opened by this night of lab \(lab) (\(flagged.joined(separator: ", "))). Confirm with an interleaved A/B of the previous and the new build, 3 runs each; it stays flagged every night until the level returns or an operator accepts it (`herald-lab regress accept \(plan)`)"
            }
        case (.regression, let a?):
            j.alert = "regressed since \(a.openedRun) (\(a.metrics)); still below lab \(lab)'s level before it"
        case (.none, let a?):
            try await store.closeAlert(a.id, as: .returned, row: row, by: nil, reason: "the level returned", at: date)
            j.alert = "returned: back to lab \(lab)'s level before \(a.openedRun); the alert is closed and its nights stay out of the baseline"
        case (.inconclusive, let a?), (.infra, let a?):
            j.reasons.append("an alert of lab \(lab) is open since \(a.openedRun) (\(a.metrics)): still regressed until a night returns to the level before it or an operator accepts it")
            j.verdict = .regression
            j.alert = "regressed since \(a.openedRun); this night could not be judged on its own"
        default:
            break
        }
        // Change points over the lab's last healthy nights, as RegressionMemory searches them.
        let runs = try await store.series(like: current, lab: lab, upTo: row, last: RegressionMemory.changeWindow)
        var points = [String]()
        if runs.count >= 2 * ChangePoints.minimumSize {
            let results = try runs.map { try $0.summary() }
            let alpha = ChangePoints.alpha / Double(Metric.allCases.count)
            for (i, m) in Metric.allCases.enumerated() {
                let series = results.map { Regression.value($0, m) ?? .nan }
                for c in ChangePoints.find(series, alpha: alpha, permutations: 499, seed: UInt64(i + 1)) {
                    points.append("\(m.label): from run \(runs[c.index].runId) (night \(c.index + 1) of \(runs.count)) \(Format.number(c.before)) → \(Format.number(c.after)) (E-Divisive, p \(String(format: "%.3f", c.p)))")
                }
            }
        }
        j.changePoints = points
        return j
    }

    /// Whether `lab` has an open alert for runs like `current`.
    public static func alertOpen(current: AnalysisResult, lab: String, store: SharedResultsStore) async throws -> Bool {
        try await store.alerts(like: current, lab: lab).contains { $0.state == .regressed }
    }
}
