import Foundation
import GRDB
import HeraldAnalysis

/// The run history: one row per analysis, in SQLite (`results/history.sqlite`), so trends and
/// baselines survive across nights.
public final class HistoryStore {
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

        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    private let db: DatabaseQueue

    public init(url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        db = try DatabaseQueue(path: url.path)
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
        try migrator.migrate(db)
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
                      settingsKey: Self.settingsKey(r), testbed: r.input.testbed ?? "", infra: Regression.infrastructure(r).joined(separator: "; "))
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
        return try db.read { db in
            var q = Run.filter(Column("plan") == (r.input.plan ?? "") && Column("variant") == (r.input.variant ?? "")
                               && Column("settingsKey") == key && Column("testbed") == testbed && Column("path") != path)
            if let own = try Run.filter(Column("path") == path && Column("runId") == runId).fetchOne(db), let id = own.id {
                q = q.filter(Column("id") < id)
            }
            if !includeInfra { q = q.filter(Column("infra") == "") }
            return try q.order(Column("id").desc).limit(max(1, last)).fetchAll(db).reversed()
        }
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
