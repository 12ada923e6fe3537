import Foundation
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

/// Who may do what on the coordinator. The operator (herald-lab commands) holds the operator
/// credential (operator.token in the credentials folder, or the lab token). Each enrolled agent
/// holds its own credential, bound to its name: it may register and heartbeat as that name only,
/// and nothing else. The coordinator calls each enrolled agent with a credential that agent alone
/// knows, so no agent can call another as the coordinator. Revoking an agent refuses its
/// credential at once and drops it from the list.
extension Coordinator {
    /// Enrolled agents, from SQLite: by name, and by the hash of the credential they call with.
    struct Identities {
        var byName: [String: IdentityStore.Credential] = [:]
        var byHash: [String: String] = [:]

        init(_ all: [IdentityStore.Credential]) {
            for c in all { add(c) }
        }

        mutating func add(_ c: IdentityStore.Credential) {
            if let old = byName[c.name] { byHash[old.tokenHash] = nil }
            byName[c.name] = c
            if c.revokedAt == nil { byHash[c.tokenHash] = c.name }
        }
    }

    /// The identities under a lock of their own: the authenticator reads them on every request.
    final class IdentityTable: @unchecked Sendable {
        private var value: Identities
        private let lock = NSLock()
        init(_ v: Identities) { value = v }
        func read<T>(_ body: (Identities) -> T) -> T { lock.withLock { body(value) } }
        func add(_ c: IdentityStore.Credential) { lock.withLock { value.add(c) } }
    }

    /// The service's authenticator: the operator's credential, or an enrolled agent's.
    static func authenticator(operatorToken: String?, identities: IdentityTable) -> HTTPService.Authenticate {
        { given in
            if let operatorToken, HTTPService.constantTimeEqual(given, operatorToken) {
                return HTTPService.Principal(role: .operator, name: "operator")
            }
            // Looked up by hash: the stored hashes are compared, never the secrets.
            let hash = CredentialHash.of(given)
            if let name = identities.read({ $0.byHash[hash] }) {
                return HTTPService.Principal(role: .agent, name: name)
            }
            return nil
        }
    }

    /// Whether `principal` may register or heartbeat as agent `name`: an agent as itself only; the
    /// operator's credential (the shared-token lab) only for names never enrolled.
    func mayActAs(_ name: String, _ principal: HTTPService.Principal?) throws {
        let enrolled = identities.read { $0.byName[name] }
        if let enrolled, enrolled.revokedAt != nil {
            throw HTTPError(.forbidden, "agent \(name) was revoked; enrol it again (herald-lab agents enrol \(name))")
        }
        guard let principal else { return } // --insecure, on loopback only
        switch principal.role {
        case .agent where principal.name == name: return
        case .agent: throw HTTPError(.forbidden, "agent \(principal.name) may not act as agent \(name)")
        case .operator where enrolled == nil: return
        default: throw HTTPError(.forbidden, "agent \(name) is enrolled: only its own credential may register or heartbeat as it")
        }
    }

    /// The credential to call an agent with: its own when it is enrolled, else the lab token.
    func credentialForCalling(_ agent: String) -> String? {
        identities.read { $0.byName[agent].flatMap { $0.revokedAt == nil ? $0.coordinatorToken : nil } } ?? config.token
    }

    /// Enrols `name`: a new credential pair, and a certificate for its `hosts` signed by the lab
    /// CA (which needs ca.pem and ca-key.pem in the coordinator's credentials folder). Enrolling
    /// a name again replaces its credentials (the old ones stop working).
    func enrol(_ request: LabWire.EnrolRequest) throws -> Enrolment {
        guard SafeName.isValid(request.name) else { throw HTTPError(.badRequest, "agent name \"\(HTTPService.escaped(request.name))\" \(SafeName.problem(with: request.name) ?? "")") }
        guard let folder = config.credentials, folder.has("ca.pem"), folder.has("ca-key.pem") else {
            throw HTTPError(.conflict, "the coordinator has no lab CA to issue certificates with: start it with --credentials DIR made by herald-lab ca init")
        }
        guard request.hosts.count <= 16 else { throw HTTPError(.badRequest, "hosts: at most 16 names or addresses") }
        for h in request.hosts {
            guard Self.isHostName(h) else { throw HTTPError(.badRequest, "hosts: \"\(HTTPService.escaped(h))\" is not a host name or an IP address") }
        }
        let days = request.days ?? 825
        guard (1...3650).contains(days) else { throw HTTPError(.badRequest, "days must be between 1 and 3650") }
        let tmp = FileManager.default.temporaryDirectory.appendingPathComponent("heraldlab-enrol-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: tmp) }
        let cert = tmp.appendingPathComponent("cert.pem"), key = tmp.appendingPathComponent("key.pem")
        do {
            try LabCA.issue(caCertificate: folder.path("ca.pem"), caKey: folder.path("ca-key.pem"), commonName: request.name,
                            names: request.hosts, days: days, certificate: cert.path, key: key.path)
        } catch { throw HTTPError(.internalServerError, "cannot issue a certificate for \(request.name): \(error)") }
        let credential = AgentCredential(name: request.name, token: LabToken.generate(), coordinatorToken: LabToken.generate())
        let record = IdentityStore.Credential(name: request.name, tokenHash: CredentialHash.of(credential.token),
                                                 coordinatorToken: credential.coordinatorToken, issuedAt: now, revokedAt: nil)
        guard let identityStore else { throw HTTPError(.conflict, "the coordinator has no credentials folder to keep enrolments in") }
        try identityStore.saveCredential(record)
        identities.add(record)
        log("coordinator: agent \(request.name) enrolled (certificate for \(request.hosts.isEmpty ? "no host names" : request.hosts.joined(separator: ", ")), \(days) days)")
        return Enrolment(credential: credential, coordinator: request.coordinator,
                         ca: try String(contentsOfFile: folder.path("ca.pem"), encoding: .utf8),
                         certificate: try String(contentsOf: cert, encoding: .utf8),
                         key: try String(contentsOf: key, encoding: .utf8))
    }

    /// Revokes `name`: its credential is refused from now on, it leaves the list of agents and is
    /// never selected again until enrolled anew.
    func revoke(_ name: String) throws {
        guard SafeName.isValid(name) else { throw HTTPError(.badRequest, "agent name \(SafeName.problem(with: name) ?? "is invalid")") }
        guard var record = identities.read({ $0.byName[name] }) else { throw HTTPError(.notFound, "agent \(name) was never enrolled") }
        record.revokedAt = now
        guard let identityStore else { throw HTTPError(.notFound, "agent \(name) was never enrolled") }
        try identityStore.saveCredential(record)
        identities.add(record)
        try store.forgetAgent(name)
        withLock { agents[name] = nil }
        log("coordinator: agent \(name) revoked; its credential is refused from now on")
    }

    /// A DNS name or an IP literal, as certificates take them.
    static func isHostName(_ h: String) -> Bool {
        guard !h.isEmpty, h.utf8.count <= 253 else { return false }
        var buf = [UInt8](repeating: 0, count: 16)
        if inet_pton(AF_INET, h, &buf) == 1 || inet_pton(AF_INET6, h, &buf) == 1 { return true }
        return h.unicodeScalars.allSatisfy { ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "-" || $0 == "." }
            && !h.hasPrefix(".") && !h.hasPrefix("-") && !h.contains("..")
    }

    /// The air address an armed node gets: with a ticket for its node name when the lab has an
    /// air key, valid until well after the run's end.
    func airAddress(_ base: LabWire.AirAddress?, for node: String, until end: Double) -> LabWire.AirAddress? {
        guard var air = base else { return nil }
        if let key = config.airKey { air.ticket = NodeTicket.issue(node: node, expires: end + 3600, key: key) }
        return air
    }
}
