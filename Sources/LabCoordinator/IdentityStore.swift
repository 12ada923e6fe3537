import Foundation
import GRDB
#if canImport(Glibc)
import Glibc
#endif

/// Enrolled agents, kept in SQLite beside the lab CA in the coordinator's credentials folder
/// (agents.sqlite, mode 0600): identities belong to the lab, not to one results folder, and
/// hold secrets (the credential the coordinator calls each agent with). Agents' own credentials
/// are kept only as SHA-256.
final class IdentityStore: @unchecked Sendable {
    private let db: DatabaseQueue

    init(url: URL) throws {
        let fresh = !FileManager.default.fileExists(atPath: url.path)
        if fresh {
            let fd = open(url.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: url.path]) }
            close(fd)
        }
        db = try DatabaseQueue(path: url.path)
        chmod(url.path, 0o600)
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.create(table: "credential") { t in
                t.primaryKey("name", .text)
                t.column("tokenHash", .text).notNull()
                t.column("coordinatorToken", .text).notNull()
                t.column("issuedAt", .double).notNull()
                t.column("revokedAt", .double)
            }
        }
        // The host names and addresses each agent's certificate was issued for: in a TLS lab an
        // agent registers only an https URL on one of them.
        m.registerMigration("v2") { db in
            try db.alter(table: "credential") { t in t.add(column: "hosts", .text).notNull().defaults(to: "") }
        }
        try m.migrate(db)
    }

    struct Credential: Sendable {
        var name: String
        var tokenHash: String
        var coordinatorToken: String
        var issuedAt: Double
        var revokedAt: Double?
        var hosts: [String] = []
    }

    func credentials() throws -> [Credential] {
        try db.read { db in
            try Row.fetchAll(db, sql: "SELECT name, tokenHash, coordinatorToken, issuedAt, revokedAt, hosts FROM credential ORDER BY name").map { row in
                let hosts: String = row["hosts"]
                return Credential(name: row["name"], tokenHash: row["tokenHash"], coordinatorToken: row["coordinatorToken"], issuedAt: row["issuedAt"], revokedAt: row["revokedAt"],
                                  hosts: hosts.split(separator: ",").map(String.init))
            }
        }
    }

    /// Enrols (or re-enrols, replacing the old credential) an agent name.
    func saveCredential(_ c: Credential) throws {
        try db.write { db in
            try db.execute(sql: "INSERT INTO credential(name, tokenHash, coordinatorToken, issuedAt, revokedAt, hosts) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET tokenHash = excluded.tokenHash, coordinatorToken = excluded.coordinatorToken, issuedAt = excluded.issuedAt, revokedAt = excluded.revokedAt, hosts = excluded.hosts",
                           arguments: [c.name, c.tokenHash, c.coordinatorToken, c.issuedAt, c.revokedAt, c.hosts.joined(separator: ",")])
        }
    }

    /// Revokes an agent: its credential is refused from now on and it is no longer listed.
    func revoke(_ name: String, at t: Double) throws {
        try db.write { db in
            try db.execute(sql: "UPDATE credential SET revokedAt = ? WHERE name = ?", arguments: [t, name])
        }
    }

}
