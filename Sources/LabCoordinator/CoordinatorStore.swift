import Foundation
import GRDB
import LabPlan

/// What the coordinator keeps in SQLite so that a restart picks up where it was: registered
/// agents and every run with its state.
final class CoordinatorStore: @unchecked Sendable {
    private let db: DatabaseQueue

    init(url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        db = try DatabaseQueue(path: url.path)
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

    /// A dongle's record and new history events, in one transaction.
    func saveDongle(_ d: DongleRecord, events: [LabWire.DongleEvent] = []) throws {
        let json = String(decoding: try JSONEncoder().encode(d), as: UTF8.self)
        let rows = try events.map { (e: LabWire.DongleEvent) in (e, String(decoding: try JSONEncoder().encode(e), as: UTF8.self)) }
        try db.write { db in
            try db.execute(sql: "INSERT INTO dongle(id, name, health, record) VALUES (?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET name = excluded.name, health = excluded.health, record = excluded.record",
                           arguments: [d.id, d.info.name, d.health.rawValue, json])
            for (e, text) in rows {
                try db.execute(sql: "INSERT INTO dongle_event(dongle, at, kind, ok, run, event) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [d.id, e.at, e.kind, e.ok, e.run, text])
            }
        }
    }

    func dongles() throws -> [DongleRecord] {
        try db.read { db in
            try Row.fetchAll(db, sql: "SELECT record FROM dongle ORDER BY id").compactMap { row in
                let json: String = row["record"]
                do { return try JSONDecoder().decode(DongleRecord.self, from: Data(json.utf8)) } catch {
                    throw StoreError("coordinator.sqlite: a dongle record does not decode (\(error)); the store is damaged")
                }
            }
        }
    }

    /// A dongle's history, newest first.
    func dongleEvents(_ id: String, limit: Int) throws -> [LabWire.DongleEvent] {
        try db.read { db in
            try Row.fetchAll(db, sql: "SELECT event FROM dongle_event WHERE dongle = ? ORDER BY seq DESC LIMIT ?", arguments: [id, limit]).compactMap { row in
                let json: String = row["event"]
                do { return try JSONDecoder().decode(LabWire.DongleEvent.self, from: Data(json.utf8)) } catch {
                    throw StoreError("coordinator.sqlite: an event of dongle \(id) does not decode (\(error)); the store is damaged")
                }
            }
        }
    }

    /// The last heartbeat, kept so that a restarted coordinator knows how long ago it was.
    func saveSeen(_ name: String, at t: Double) throws {
        try db.write { db in try db.execute(sql: "UPDATE agent SET lastSeen = ? WHERE name = ?", arguments: [t, name]) }
    }

    /// Several agents' last heartbeats in one transaction (one commit, not one per agent).
    func saveSeen(_ seen: [String: Double]) throws {
        try db.write { db in
            for (name, t) in seen { try db.execute(sql: "UPDATE agent SET lastSeen = ? WHERE name = ?", arguments: [t, name]) }
        }
    }

    /// Drops an agent from the list (a revoked one).
    func forgetAgent(_ name: String) throws {
        try db.write { db in try db.execute(sql: "DELETE FROM agent WHERE name = ?", arguments: [name]) }
    }

    func saveError(_ name: String, _ message: String, at t: Double) throws {
        try db.write { db in try db.execute(sql: "UPDATE agent SET lastError = ?, lastErrorAt = ? WHERE name = ?", arguments: [message, t, name]) }
    }

    func saveAgent(_ info: LabWire.AgentInfo, lastSeen: Double) throws {
        let json = String(decoding: try JSONEncoder().encode(info), as: UTF8.self)
        try db.write { db in
            try db.execute(sql: "INSERT INTO agent(name, info, lastSeen) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET info = excluded.info, lastSeen = excluded.lastSeen",
                           arguments: [info.name, json, lastSeen])
        }
    }

    func agents() throws -> [(info: LabWire.AgentInfo, lastSeen: Double, lastError: String?, lastErrorAt: Double?)] {
        try db.read { db in
            try Row.fetchAll(db, sql: "SELECT name, info, lastSeen, lastError, lastErrorAt FROM agent ORDER BY name").compactMap { row in
                let info: String = row["info"]
                let a: LabWire.AgentInfo
                do { a = try JSONDecoder().decode(LabWire.AgentInfo.self, from: Data(info.utf8)) } catch {
                    let name: String = row["name"] ?? "?"
                    throw StoreError("coordinator.sqlite: agent \(name.debugDescription) does not decode (\(error)); the store is damaged")
                }
                return (a, row["lastSeen"], row["lastError"], row["lastErrorAt"])
            }
        }
    }

    func saveRun(_ r: RunRecord) throws {
        let json = String(decoding: try JSONEncoder().encode(r), as: UTF8.self)
        try db.write { db in
            try db.execute(sql: "INSERT INTO run(id, state, created, record) VALUES (?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET state = excluded.state, record = excluded.record",
                           arguments: [r.id, r.state.rawValue, r.created, json])
        }
    }

    func runs() throws -> [RunRecord] {
        try db.read { db in
            try Row.fetchAll(db, sql: "SELECT id, record FROM run ORDER BY created").map { row in
                let json: String = row["record"]
                do { return try JSONDecoder().decode(RunRecord.self, from: Data(json.utf8)) } catch {
                    let id: String = row["id"] ?? "?"
                    throw StoreError("coordinator.sqlite: run \(id.debugDescription) does not decode (\(error)); the store is damaged")
                }
            }
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
        public var state: String
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
    public var passed: Bool?
    public var headline: String?
    /// Set by an abort request: the run stops early and what exists is gathered.
    public var abortRequested: Bool?
    /// Agents with dongles checked with the chosen ones, each standing in for one that fails its
    /// pre-flight check; and the checks' verdicts.
    public var spares: [Spare]?
    public var preflight: [LabWire.PreflightVerdict]?
    /// When the run ended as failed, whether its agents still hold their copies.
    public var agentsKeepCopies: Bool?
}
