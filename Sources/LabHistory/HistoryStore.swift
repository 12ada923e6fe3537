import Foundation
import GRDB
import HeraldAnalysis

/// The run history: one row per analysis, in SQLite (`results/history.sqlite`), so trends and
/// baselines survive across nights.
public final class HistoryStore: Sendable {
    public struct Run: Codable, FetchableRecord, PersistableRecord, Sendable {
        public static let databaseTableName = "run"
        public var id: Int64?
        public var recordedAt: String
        public var runId: String
        public var path: String
        public var plan: String
        public var variant: String
        public var devices: Int
        public var detectionPct: Double
        public var continuityPct: Double
        public var heraldContinuityPct: Double
        public var longevity: Double
        public var passed: Bool
        public var reportPath: String
        public var summaryJSON: String
        /// Every setting of the run (plan, variant, sensor, radio, controllers), flattened: runs
        /// are baselines of each other only when these match.
        public var settingsKey: String = ""
        public var testbed: String = ""
        /// Infrastructure faults (partial nodes, gaps, recoveries); empty: none.
        public var infra: String = ""
        /// An operator aborted the run (its manifest says so): it has no verdict, and is in no
        /// trend, arrow or baseline (issue 40).
        public var aborted: Bool = false

        /// `aborted` (no verdict), else `pass` or `fail`.
        public var verdict: String { aborted ? "aborted" : (passed ? "pass" : "fail") }
        /// Neither aborted nor with infrastructure faults: a run trends and arrows compare.
        public var isClean: Bool { !aborted && infra.isEmpty }

        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    /// A regression alert of one plan, variant, settings and testbed (issue 38): opened by the
    /// first night `regress` flags, it keeps every later night flagged (exit 1) until a night
    /// returns to the level before it (`returned`) or an operator accepts the new level
    /// (`accepted`, with who and why). Nights from the one that opened it are not baselines while
    /// it is open, nor after it `returned`; after `accepted` only they are.
    public struct Alert: Codable, FetchableRecord, PersistableRecord, Sendable {
        public static let databaseTableName = "alert"
        public enum State: String, Codable, Sendable { case regressed, returned, accepted }
        public var id: Int64?
        public var plan: String
        public var variant: String
        public var settingsKey: String
        public var testbed: String
        public var state: State
        public var openedAt: String
        /// The run that opened it, and its history row.
        public var openedRun: String
        public var openedRow: Int64
        /// What regressed when it opened.
        public var metrics: String
        public var closedAt: String?
        public var closedRow: Int64?
        public var closedBy: String?
        public var reason: String?
        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    private let db: DatabaseQueue
    /// The database file's path.
    public let path: String

    public init(url: URL) throws {
        path = url.path
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        // Other connections to the same file wait for one another up to 10 s (the dashboard, the metrics and `analyse` open the history while the coordinator records a run),
        // then fail loudly, instead of failing at once with "database is locked".
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        db = try DatabaseQueue(path: url.path, configuration: configuration)
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "run") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("recordedAt", .text).notNull()
                t.column("runId", .text).notNull()
                t.column("path", .text).notNull()
                t.column("plan", .text).notNull()
                t.column("variant", .text).notNull()
                t.column("devices", .integer).notNull()
                t.column("detectionPct", .double).notNull()
                t.column("continuityPct", .double).notNull()
                t.column("heraldContinuityPct", .double).notNull()
                t.column("longevity", .double).notNull()
                t.column("passed", .boolean).notNull()
                t.column("reportPath", .text).notNull()
                t.column("summaryJSON", .text).notNull()
            }
            try db.create(index: "run_plan", on: "run", columns: ["plan", "id"])
        }
        migrator.registerMigration("v2-settings") { db in
            try db.alter(table: "run") { t in
                t.add(column: "settingsKey", .text).notNull().defaults(to: "")
                t.add(column: "testbed", .text).notNull().defaults(to: "")
                t.add(column: "infra", .text).notNull().defaults(to: "")
            }
            // One row per bundle: keep the newest of any duplicates recorded before.
            try db.execute(sql: "DELETE FROM run WHERE id NOT IN (SELECT MAX(id) FROM run GROUP BY path, runId)")
            try db.create(index: "run_bundle", on: "run", columns: ["path", "runId"], unique: true)
        }
        migrator.registerMigration("v3-alerts") { db in
            try db.create(table: "alert") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("plan", .text).notNull()
                t.column("variant", .text).notNull()
                t.column("settingsKey", .text).notNull()
                t.column("testbed", .text).notNull()
                t.column("state", .text).notNull()
                t.column("openedAt", .text).notNull()
                t.column("openedRun", .text).notNull()
                t.column("openedRow", .integer).notNull()
                t.column("metrics", .text).notNull()
                t.column("closedAt", .text)
                t.column("closedRow", .integer)
                t.column("closedBy", .text)
                t.column("reason", .text)
            }
            try db.create(index: "alert_key", on: "alert", columns: ["plan", "variant", "testbed", "state"])
        }
        migrator.registerMigration("v4-aborted") { db in
            try db.alter(table: "run") { t in t.add(column: "aborted", .boolean).notNull().defaults(to: false) }
        }
        try migrator.migrate(db)
    }

    // MARK: Alerts

    /// Alerts of the runs like `r` (same plan, variant, settings and testbed), oldest first.
    public func alerts(like r: AnalysisResult) throws -> [Alert] {
        let key = Self.settingsKey(r)
        return try db.read { db in
            try Alert.filter(Column("plan") == (r.input.plan ?? "") && Column("variant") == (r.input.variant ?? "")
                             && Column("settingsKey") == key && Column("testbed") == (r.input.testbed ?? "")).order(Column("id")).fetchAll(db)
        }
    }

    /// Alerts of a plan, oldest first (every variant, settings and testbed).
    public func alerts(plan: String) throws -> [Alert] {
        try db.read { db in try Alert.filter(Column("plan") == plan).order(Column("id")).fetchAll(db) }
    }

    /// Opens an alert for the runs like `r`, from history row `row`.
    @discardableResult
    public func openAlert(like r: AnalysisResult, row: Int64, metrics: [String], at date: Date = Date()) throws -> Alert {
        var a = Alert(id: nil, plan: r.input.plan ?? "", variant: r.input.variant ?? "", settingsKey: Self.settingsKey(r), testbed: r.input.testbed ?? "",
                      state: .regressed, openedAt: AnalysisTime.format(date.timeIntervalSince1970),
                      openedRun: r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent, openedRow: row,
                      metrics: metrics.joined(separator: ", "))
        a.id = try db.write { db in
            try a.insert(db)
            return db.lastInsertedRowID
        }
        return a
    }

    /// Closes an open alert: the level `returned` (at history row `row`) or an operator `accepted` it.
    public func close(_ alert: Alert, as state: Alert.State, row: Int64?, by who: String?, reason: String?, at date: Date = Date()) throws {
        var a = alert
        a.state = state
        a.closedAt = AnalysisTime.format(date.timeIntervalSince1970)
        a.closedRow = row
        a.closedBy = who
        a.reason = reason
        try db.write { db in try a.update(db) }
    }

    /// An operator accepts the open alerts of `plan` (of one variant and testbed when given):
    /// the level they flagged is the new normal. Returns the alerts accepted.
    public func accept(plan: String, variant: String?, testbed: String?, by who: String, reason: String, at date: Date = Date()) throws -> [Alert] {
        let open = try alerts(plan: plan).filter { $0.state == .regressed && (variant == nil || $0.variant == variant) && (testbed == nil || $0.testbed == testbed) }
        let last = try db.read { db in try Int64.fetchOne(db, sql: "SELECT MAX(id) FROM run") }
        for a in open { try close(a, as: .accepted, row: last, by: who, reason: reason, at: date) }
        return try alerts(plan: plan).filter { a in open.contains { $0.id == a.id } }
    }

    /// The history row of `r`'s bundle, if recorded.
    public func row(of r: AnalysisResult) throws -> Int64? {
        let runId = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        return try db.read { db in try Run.filter(Column("path") == r.input.path && Column("runId") == runId).fetchOne(db)?.id }
    }

    /// The key runs must share to be each other's baseline.
    public static func settingsKey(_ r: AnalysisResult) -> String {
        let s = Comparison.settings(r)
        return s.keys.sorted().map { "\($0)=\(s[$0]!)" }.joined(separator: "\u{1F}")
    }

    @discardableResult
    public func record(_ r: AnalysisResult, reportPath: String, at date: Date = Date()) throws -> Run {
        var run = Run(id: nil, recordedAt: AnalysisTime.format(date.timeIntervalSince1970), runId: r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent,
                      path: r.input.path, plan: r.input.plan ?? "", variant: r.input.variant ?? "", devices: r.devices.count,
                      detectionPct: r.strict.detectionpct, continuityPct: r.strict.continuitypct, heraldContinuityPct: r.herald.continuitypct,
                      longevity: r.strict.longevity, passed: r.passed, reportPath: reportPath,
                      summaryJSON: String(decoding: try ReportWriter.summaryJSON(r), as: UTF8.self),
                      settingsKey: Self.settingsKey(r), testbed: r.input.testbed ?? "", infra: Regression.infrastructure(r).joined(separator: "; "),
                      aborted: r.input.aborted == true)
        // The same bundle analysed again replaces its row (one row per bundle), keeping its place.
        try db.write { db in
            if let old = try Run.filter(Column("path") == run.path && Column("runId") == run.runId).fetchOne(db) {
                run.id = old.id
                try run.update(db)
            } else {
                try run.insert(db)
            }
        }
        return run
    }

    /// The plans in the history, by name.
    public func plans() throws -> [String] {
        try db.read { db in try String.fetchAll(db, sql: "SELECT DISTINCT plan FROM run ORDER BY plan") }
    }

    /// Runs, oldest first, optionally of one plan.
    public func runs(plan: String? = nil) throws -> [Run] {
        try db.read { db in
            var q = Run.order(Column("id"))
            if let plan { q = q.filter(Column("plan") == plan) }
            return try q.fetchAll(db)
        }
    }

    /// The newest earlier run like `r`: the same plan, variant and settings (and testbed), not
    /// `r`'s bundle, recorded before `r` when `r` is in the history, and without infrastructure
    /// faults: a night with a paused node is low and would hide a real drop (issue 38).
    public func latest(like r: AnalysisResult) throws -> Run? {
        try baseline(like: r, last: 1).last
    }

    /// The last `last` runs like `r` (same plan, variant, settings, testbed), oldest first,
    /// recorded before `r` when `r` itself is in the history; runs with infrastructure faults
    /// only when asked.
    public func baseline(like r: AnalysisResult, last: Int, includeInfra: Bool = false) throws -> [Run] {
        let key = Self.settingsKey(r), testbed = r.input.testbed ?? ""
        let path = r.input.path, runId = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        // Nights an alert holds out of the baseline: from its opening while open or after the
        // level returned; before its opening once accepted (the new level is the normal one).
        let alerts = try alerts(like: r)
        func excluded(_ id: Int64) -> Bool {
            alerts.contains { a in
                switch a.state {
                case .regressed: return id >= a.openedRow
                case .returned: return id >= a.openedRow && id < (a.closedRow ?? Int64.max)
                case .accepted: return id < a.openedRow
                }
            }
        }
        let rows: [Run] = try db.read { db in
            var q = Run.filter(Column("plan") == (r.input.plan ?? "") && Column("variant") == (r.input.variant ?? "")
                               && Column("settingsKey") == key && Column("testbed") == testbed && Column("path") != path)
            if let own = try Run.filter(Column("path") == path && Column("runId") == runId).fetchOne(db), let id = own.id {
                q = q.filter(Column("id") < id)
            }
            if !includeInfra { q = q.filter(Column("infra") == "") }
            q = q.filter(Column("aborted") == false)
            return try q.order(Column("id").desc).limit(max(1, last) + 1000).fetchAll(db)
        }
        return Array(rows.filter { !excluded($0.id ?? 0) }.prefix(max(1, last)).reversed())
    }

    /// The nightly series of `r`'s plan, variant, settings and testbed up to and including
    /// history row `row`, without nights with infrastructure faults, the last `last`, oldest
    /// first: what change points are searched in (RegressionMemory).
    public func series(like r: AnalysisResult, upTo row: Int64, last: Int) throws -> [Run] {
        let key = Self.settingsKey(r)
        return try db.read { db in
            try Run.filter(Column("plan") == (r.input.plan ?? "") && Column("variant") == (r.input.variant ?? "") && Column("settingsKey") == key
                           && Column("testbed") == (r.input.testbed ?? "") && Column("infra") == "" && Column("id") <= row)
                .order(Column("id").desc).limit(max(1, last)).fetchAll(db).reversed()
        }
    }

    /// How often a testbed's runs had infrastructure faults (issue 38): of its last `runs`
    /// runs (every plan), how many; `interval` is the 95 % Wilson interval of the rate.
    public struct InfraRate: Sendable, Equatable, Codable {
        public var testbed: String
        public var runs: Int
        public var infra: Int
        public init(testbed: String, runs: Int, infra: Int) { self.testbed = testbed; self.runs = runs; self.infra = infra }
        public var rate: Double { runs > 0 ? Double(infra) / Double(runs) : 0 }
        public var interval: Stats.Interval { Stats.wilson(infra, runs) }
    }

    /// The infrastructure-fault rate of each testbed over its last `last` runs, by testbed name.
    public func infraRates(last: Int = 30) throws -> [InfraRate] {
        let rows = try db.read { db in
            try Row.fetchAll(db, Run.select(Column("testbed"), Column("infra")).order(Column("id").desc))
        }
        var out = [String: InfraRate]()
        for row in rows {
            let testbed: String = row["testbed"], infra: String = row["infra"]
            var r = out[testbed] ?? InfraRate(testbed: testbed, runs: 0, infra: 0)
            guard r.runs < max(1, last) else { continue }
            r.runs += 1
            if !infra.isEmpty { r.infra += 1 }
            out[testbed] = r
        }
        return out.values.sorted { $0.testbed < $1.testbed }
    }

    /// Runs of `plan` whatever their settings (to say why none matched).
    public func count(plan: String) throws -> Int {
        try db.read { db in try Run.filter(Column("plan") == plan).fetchCount(db) }
    }

    public func summary(of run: Run) throws -> AnalysisResult {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try d.decode(AnalysisResult.self, from: Data(run.summaryJSON.utf8))
    }
}
