import Foundation
import GRDB
import LabPlan

/// What the coordinator keeps in SQLite so that a restart picks up where it was: registered
/// agents and every run with its state.
final class CoordinatorStore: Sendable {
    private let db: DatabaseQueue

    init(url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        // Other connections to the same file wait for one another up to 10 s (a coordinator restarted on the same results folder, or a second reader),
        // then fail loudly, instead of failing at once with "database is locked".
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        db = try DatabaseQueue(path: url.path, configuration: configuration)
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.create(table: "agent") { t in
                t.primaryKey("name", .text)
                t.column("info", .text).notNull()
                t.column("lastSeen", .double).notNull()
            }
            try db.create(table: "run") { t in
                t.primaryKey("id", .text)
                t.column("state", .text).notNull()
                t.column("created", .double).notNull()
                t.column("record", .text).notNull()
            }
        }
        m.registerMigration("v2") { db in
            try db.alter(table: "agent") { t in
                t.add(column: "lastError", .text)
                t.add(column: "lastErrorAt", .double)
            }
        }
        // Dongles (radio bluez) by their stable identity, their health and their history.
        m.registerMigration("v3") { db in
            try db.create(table: "dongle") { t in
                t.primaryKey("id", .text)
                t.column("name", .text).notNull()
                t.column("health", .text).notNull()
                t.column("record", .text).notNull()
            }
            try db.create(table: "dongle_event") { t in
                t.autoIncrementedPrimaryKey("seq")
                t.column("dongle", .text).notNull().indexed()
                t.column("at", .double).notNull()
                t.column("kind", .text).notNull()
                t.column("ok", .boolean).notNull()
                t.column("run", .text)
                t.column("event", .text).notNull()
            }
        }
        try m.migrate(db)
    }

    // The tables' rows as GRDB records. Each holds the wire type as JSON (`info`, `record`,
    // `event`) beside the columns that are queried; decoding that JSON is the one place a damaged
    // row shows, and it is a `StoreError` naming the row, never a row silently skipped.

    private struct AgentRow: Codable, FetchableRecord, PersistableRecord {
        static let databaseTableName = "agent"
        var name: String
        var info: String
        var lastSeen: Double
        var lastError: String?
        var lastErrorAt: Double?
    }

    private struct RunRow: Codable, FetchableRecord, PersistableRecord {
        static let databaseTableName = "run"
        var id: String
        var state: String
        var created: Double
        var record: String
    }

    private struct DongleRow: Codable, FetchableRecord, PersistableRecord {
        static let databaseTableName = "dongle"
        var id: String
        var name: String
        var health: String
        var record: String
    }

    private struct DongleEventRow: Codable, FetchableRecord, PersistableRecord {
        static let databaseTableName = "dongle_event"
        var seq: Int64?
        var dongle: String
        var at: Double
        var kind: String
        var ok: Bool
        var run: String?
        var event: String
    }

    private static func json<T: Encodable>(_ value: T) throws -> String { String(decoding: try JSONEncoder().encode(value), as: UTF8.self) }

    private static func decode<T: Decodable>(_ type: T.Type, _ json: String, what: @autoclosure () -> String) throws -> T {
        do { return try JSONDecoder().decode(type, from: Data(json.utf8)) } catch {
            throw StoreError("coordinator.sqlite: \(what()) does not decode (\(error)); the store is damaged")
        }
    }

    /// A dongle's record and new history events, in one transaction.
    func saveDongle(_ d: DongleRecord, events: [LabWire.DongleEvent] = []) throws {
        let row = DongleRow(id: d.id, name: d.info.name, health: d.health.rawValue, record: try Self.json(d))
        let rows = try events.map { DongleEventRow(seq: nil, dongle: d.id, at: $0.at, kind: $0.kind.rawValue, ok: $0.ok, run: $0.run, event: try Self.json($0)) }
        try db.write { db in
            try row.upsert(db)
            for r in rows { try r.insert(db) }
        }
    }

    func dongles() throws -> [DongleRecord] {
        try db.read { db in try DongleRow.order(Column("id")).fetchAll(db) }.map {
            try Self.decode(DongleRecord.self, $0.record, what: "dongle \($0.id.debugDescription)")
        }
    }

    /// A dongle's history, newest first.
    func dongleEvents(_ id: String, limit: Int) throws -> [LabWire.DongleEvent] {
        try db.read { db in try DongleEventRow.filter(Column("dongle") == id).order(Column("seq").desc).limit(limit).fetchAll(db) }.map {
            try Self.decode(LabWire.DongleEvent.self, $0.event, what: "an event of dongle \(id.debugDescription)")
        }
    }

    /// The last heartbeat, kept so that a restarted coordinator knows how long ago it was.
    func saveSeen(_ name: String, at t: Double) throws {
        try saveSeen([name: t])
    }

    /// Several agents' last heartbeats in one transaction (one commit, not one per agent).
    func saveSeen(_ seen: [String: Double]) throws {
        try db.write { db in
            for (name, t) in seen { try AgentRow.filter(key: name).updateAll(db, Column("lastSeen").set(to: t)) }
        }
    }

    /// Drops an agent from the list (a revoked one).
    func forgetAgent(_ name: String) throws {
        _ = try db.write { db in try AgentRow.deleteOne(db, key: name) }
    }

    func saveError(_ name: String, _ message: String, at t: Double) throws {
        _ = try db.write { db in
            try AgentRow.filter(key: name).updateAll(db, Column("lastError").set(to: message), Column("lastErrorAt").set(to: t))
        }
    }

    /// An agent's registration; its last error, if any, stays.
    func saveAgent(_ info: LabWire.AgentInfo, lastSeen: Double) throws {
        let json = try Self.json(info)
        try db.write { db in
            if try AgentRow.filter(key: info.name).updateAll(db, Column("info").set(to: json), Column("lastSeen").set(to: lastSeen)) == 0 {
                try AgentRow(name: info.name, info: json, lastSeen: lastSeen, lastError: nil, lastErrorAt: nil).insert(db)
            }
        }
    }

    func agents() throws -> [(info: LabWire.AgentInfo, lastSeen: Double, lastError: String?, lastErrorAt: Double?)] {
        try db.read { db in try AgentRow.order(Column("name")).fetchAll(db) }.map { row in
            (try Self.decode(LabWire.AgentInfo.self, row.info, what: "agent \(row.name.debugDescription)"), row.lastSeen, row.lastError, row.lastErrorAt)
        }
    }

    /// A run's record; its creation time never changes.
    func saveRun(_ r: RunRecord) throws {
        let row = RunRow(id: r.id, state: r.state.rawValue, created: r.created, record: try Self.json(r))
        try db.write { db in
            if try RunRow.filter(key: r.id).updateAll(db, Column("state").set(to: row.state), Column("record").set(to: row.record)) == 0 {
                try row.insert(db)
            }
        }
    }

    func runs() throws -> [RunRecord] {
        try db.read { db in try RunRow.order(Column("created")).fetchAll(db) }.map {
            try Self.decode(RunRecord.self, $0.record, what: "run \($0.id.debugDescription)")
        }
    }
}

/// The coordinator's SQLite holds something it cannot read back.
struct StoreError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A run as the coordinator tracks it (and serves it on GET /v1/runs/:id).
public struct RunRecord: Codable, Sendable {
    /// arming → running → gathering → complete; `aborted` (stopped early on request, what existed
    /// was gathered), `failed` (with `message`), `cancelled` (before the start).
    public enum State: String, Codable, Sendable {
        case arming, running, gathering, complete, aborted, failed, cancelled
        /// No more work will be done on the run (unless it is gathered again).
        public var isFinal: Bool { [.complete, .aborted, .failed, .cancelled].contains(self) }
    }

    /// A node's state as the coordinator tracks it. The raw values are the wire's and the stored
    /// rows' strings; a value outside these does not decode (a named error, not a guess).
    public enum NodeState: String, Codable, Sendable, CaseIterable {
        /// Chosen for the run, not yet armed.
        case selected
        /// The agent's own states, from its heartbeats and status while the run goes on.
        case idle, armed, running, finished, failed
        /// After gathering: every file, some (with gaps or problems said), or none.
        case complete, partial, lost

        public init(agent: LabWire.AgentState) {
            switch agent {
            case .idle: self = .idle
            case .armed: self = .armed
            case .running: self = .running
            case .finished: self = .finished
            case .failed: self = .failed
            }
        }

        /// Its files are in the bundle (all of them, or some).
        public var isGathered: Bool { self == .complete || self == .partial }

        /// What the bundle's manifest says of it: a node not gathered is lost there.
        public var manifestState: Manifest.NodeState {
            switch self {
            case .complete: .complete
            case .partial: .partial
            default: .lost
            }
        }
    }

    public struct Node: Codable, Sendable {
        public var name: String
        public var agent: String
        public var agentURL: String
        public var clockBefore: LabWire.ClockSample?
        public var clockAfter: LabWire.ClockSample?
        /// Coordinator clock.
        public var startedAt: Double?
        public var status: LabWire.AgentStatus?
        /// complete, partial or lost (after gathering), else the agent's state.
        public var state: NodeState
        /// Periods without rows (coordinator clock).
        public var gaps: [LabWire.Gap]?
        /// How late the node started against its instant, in its own clock (seconds).
        public var lateBy: Double?
        /// The agent's own clock reading of its start.
        public var agentStartedAt: Double?
        public var files: [LabWire.FileInfo]
        public var message: String?
        /// The node's dongle (radio bluez) and its health when chosen; what its radio did to
        /// recover it during the run.
        public var dongle: LabWire.DongleInfo?
        public var dongleHealth: LabWire.DongleHealth?
        public var recoveries: [LabWire.Recovery]?
    }

    public struct Spare: Codable, Sendable {
        public var agent: String
        public var agentURL: String
        public var dongle: LabWire.DongleInfo?
        public var dongleHealth: LabWire.DongleHealth?
    }

    public var id: String
    public var plan: String
    public var planText: String
    public var state: State
    public var created: Double
    /// Coordinator clock.
    public var startAt: Double?
    public var duration: Double
    public var warmup: Double
    public var air: LabWire.AirAddress?
    public var nodes: [Node]
    public var message: String?
    public var bundle: String?
    /// SHA-256 of `<id>.tar.gz`, for clients to verify what they fetched.
    public var bundleSha256: String?
    /// The plan's verdict on the analysed bundle; nil while there is none, and for an aborted
    /// run, which has no verdict (issue 40).
    public var passed: Bool?
    public var headline: String?
    /// When the run reached its final state (coordinator clock); nil in records from before.
    public var ended: Double?
    /// The run's infrastructure faults (nodes not complete, gaps, dongle recoveries), as the
    /// analysis found them: a failed verdict of such a run is not counted as a fail.
    public var infra: [String]?
    /// Set by an abort request: the run stops early and what exists is gathered.
    public var abortRequested: Bool?
    /// Agents with dongles checked with the chosen ones, each standing in for one that fails its
    /// pre-flight check; and the checks' verdicts.
    public var spares: [Spare]?
    public var preflight: [LabWire.PreflightVerdict]?
    /// When the run ended as failed, whether its agents still hold their copies.
    public var agentsKeepCopies: Bool?
}
