import Foundation
import GRDB
#if canImport(Glibc)
import Glibc
#endif

/// Enrolled agents, kept in SQLite beside the lab CA in the coordinator's credentials folder
/// (agents.sqlite, mode 0600): identities belong to the lab, not to one results folder, and
/// hold secrets (the credential the coordinator calls each agent with). Agents' own credentials
/// are kept only as SHA-256.
final class IdentityStore: Sendable {
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

    /// A row of table `credential` (GRDB record; the hosts joined by commas).
    private struct CredentialRow: Codable, FetchableRecord, PersistableRecord {
        static let databaseTableName = "credential"
        var name: String
        var tokenHash: String
        var coordinatorToken: String
        var issuedAt: Double
        var revokedAt: Double?
        var hosts: String

        init(_ c: Credential) {
            name = c.name; tokenHash = c.tokenHash; coordinatorToken = c.coordinatorToken
            issuedAt = c.issuedAt; revokedAt = c.revokedAt; hosts = c.hosts.joined(separator: ",")
        }

        var credential: Credential {
            Credential(name: name, tokenHash: tokenHash, coordinatorToken: coordinatorToken, issuedAt: issuedAt, revokedAt: revokedAt,
                       hosts: hosts.split(separator: ",").map(String.init))
        }
    }

    /// Every credential, by name. A row that does not decode is an error naming the store, never
    /// a credential that silently goes missing.
    func credentials() throws -> [Credential] {
        do {
            return try db.read { db in try CredentialRow.order(Column("name")).fetchAll(db).map(\.credential) }
        } catch let e as DatabaseError {
            throw e
        } catch {
            throw StoreError("agents.sqlite: a credential does not decode (\(error)); the store is damaged")
        }
    }

    /// Enrols (or re-enrols, replacing the old credential) an agent name.
    func saveCredential(_ c: Credential) throws {
        try db.write { db in try CredentialRow(c).upsert(db) }
    }

    /// Revokes an agent: its credential is refused from now on and it is no longer listed.
    func revoke(_ name: String, at t: Double) throws {
        _ = try db.write { db in try CredentialRow.filter(key: name).updateAll(db, Column("revokedAt").set(to: t)) }
    }
}
