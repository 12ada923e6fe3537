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
        try migrator.migrate(db)
    }

    @discardableResult
    public func record(_ r: AnalysisResult, reportPath: String, at date: Date = Date()) throws -> Run {
        var run = Run(id: nil, recordedAt: AnalysisTime.format(date.timeIntervalSince1970), runId: r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent,
                      path: r.input.path, plan: r.input.plan ?? "", variant: r.input.variant ?? "", devices: r.devices.count,
                      detectionPct: r.strict.detectionpct, continuityPct: r.strict.continuitypct, heraldContinuityPct: r.herald.continuitypct,
                      longevity: r.strict.longevity, passed: r.passed, reportPath: reportPath,
                      summaryJSON: String(decoding: try ReportWriter.summaryJSON(r), as: UTF8.self))
        try db.write { db in try run.insert(db) }
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

    /// The newest run of `plan` whose bundle is not `excludingPath`.
    public func latest(plan: String, excludingPath: String) throws -> Run? {
        try db.read { db in
            try Run.filter(Column("plan") == plan && Column("path") != excludingPath).order(Column("id").desc).fetchOne(db)
        }
    }

    public func summary(of run: Run) throws -> AnalysisResult {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try d.decode(AnalysisResult.self, from: Data(run.summaryJSON.utf8))
    }
}
