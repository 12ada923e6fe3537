import Foundation
import Synchronization
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// Who may do what on the coordinator. The operator (herald-lab commands) holds the operator
/// credential (operator.token in the credentials folder, or the lab token). Each enrolled agent
/// holds its own credential, bound to its name: it may register and heartbeat as that name only,
/// and nothing else. The coordinator calls each enrolled agent with a credential that agent alone
/// knows, so no agent can call another as the coordinator. Revoking an agent refuses its
/// credential at once and drops it from the list.
///
/// The service owns the enrolled identities (agents.sqlite, and their table in memory under a
/// `Mutex` of its own: the authenticator reads it on every request). Where a revoked agent is
/// refused is one function, `refusal(of:chosenAt:)`: the authenticator (a revoked credential
/// opens nothing), `mayActAs` (register, heartbeat), `credentialForCalling` (no call goes to it)
/// and the coordinator's notice to the air (its tickets attach nothing) all take its answer.
final class IdentityService: Sendable {
    /// Enrolled agents: by name, and by the hash of the credential they call with (those not
    /// refused only).
    struct Identities {
        var byName: [String: IdentityStore.Credential] = [:]
        var byHash: [String: String] = [:]

        init(_ all: [IdentityStore.Credential]) {
            for c in all { add(c) }
        }

        mutating func add(_ c: IdentityStore.Credential) {
            if let old = byName[c.name] { byHash[old.tokenHash] = nil }
            byName[c.name] = c
            if IdentityService.refusal(of: c, chosenAt: nil) == nil { byHash[c.tokenHash] = c.name }
        }
    }

    /// Why an enrolled agent is refused: revoked (nothing of it is taken and nothing goes to it),
    /// or enrolled again after the run that chose it (that run does not call the new enrolment).
    enum Refusal: Equatable, Sendable {
        case revoked(at: Double)
        case enrolledAgain(issuedAt: Double)
    }

    /// THE rule refusing an agent: `credential` revoked, or (for a run or check that chose the
    /// agent at `chosenAt`) issued after it. nil: the agent is not refused.
    static func refusal(of credential: IdentityStore.Credential, chosenAt: Double?) -> Refusal? {
        if let at = credential.revokedAt { return .revoked(at: at) }
        if let chosenAt, credential.issuedAt > chosenAt { return .enrolledAgain(issuedAt: credential.issuedAt) }
        return nil
    }

    /// Enrolled agents' credentials in SQLite, when the coordinator has a credentials folder.
    let store: IdentityStore?
    private let table: Mutex<Identities>
    private let operatorToken: String?
    private let credentials: CredentialsFolder?
    private let tlsLab: Bool
    private let clock: any LabClock
    private let logger: Logger

    init(store: IdentityStore?, operatorToken: String?, credentials: CredentialsFolder?, tlsLab: Bool, clock: any LabClock, logger: Logger) throws {
        self.store = store
        table = Mutex(Identities(try store?.credentials() ?? []))
        self.operatorToken = operatorToken
        self.credentials = credentials
        self.tlsLab = tlsLab
        self.clock = clock
        self.logger = logger
    }

    func read<T>(_ body: (Identities) -> T) -> T { table.withLock { body($0) } }
    func add(_ c: IdentityStore.Credential) { table.withLock { $0.add(c) } }

    /// Why `agent` is refused for a run that chose it at `chosenAt` (nil: any time), nil when it
    /// is not (or was never enrolled).
    func refusal(of agent: String, chosenAt: Double?) -> Refusal? {
        read { $0.byName[agent] }.flatMap { Self.refusal(of: $0, chosenAt: chosenAt) }
    }

    /// The service's authenticator: the operator's credential, or an enrolled agent's.
    static func authenticator(operatorToken: String?, identities: IdentityService) -> HTTPService.Authenticate {
        { given in
            if let operatorToken, HTTPService.constantTimeEqual(given, operatorToken) {
                return HTTPService.Principal(role: .operator, name: "operator")
            }
            // Looked up by hash: the stored hashes are compared, never the secrets; a refused
            // agent's hash is not in the table (`Identities.add`).
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
        let enrolled = read { $0.byName[name] }
        if let enrolled, Self.refusal(of: enrolled, chosenAt: nil) != nil {
            throw LabRefusal(.forbidden, "agent \(name) was revoked; enrol it again (herald-lab agents enrol \(name))")
        }
        guard let principal else { return } // --insecure, on loopback only
        switch principal.role {
        case .agent where principal.name == name: return
        case .agent: throw LabRefusal(.forbidden, "agent \(principal.name) may not act as agent \(name)")
        case .operator where enrolled == nil: return
        default: throw LabRefusal(.forbidden, "agent \(name) is enrolled: only its own credential may register or heartbeat as it")
        }
    }

    /// Why an agent is not called at all: no credential of any kind is sent to it.
    struct NotCallable: Error, CustomStringConvertible {
        var agent: String
        var reason: String
        var description: String { reason }
    }

    /// The credential to call `agent` with, for a run (or check) that chose it at `chosenAt`: an
    /// enrolled agent's own, and nothing else; the lab token only for a name never enrolled (a
    /// shared-token lab, where the token is everyone). A refused agent (`refusal(of:chosenAt:)`)
    /// is not called at all.
    func credentialForCalling(_ agent: String, chosenAt: Double? = nil) throws -> String? {
        guard let enrolled = read({ $0.byName[agent] }) else { return operatorToken }
        switch Self.refusal(of: enrolled, chosenAt: chosenAt) {
        case .revoked(let at)?:
            throw NotCallable(agent: agent, reason: "revoked: agent \(agent) was revoked at \(HeraldTimestamp.iso8601(Date(timeIntervalSince1970: at))) and is not called again; \(Self.recovery(agent))")
        case .enrolledAgain?:
            throw NotCallable(agent: agent, reason: "revoked: agent \(agent) was enrolled again after the run chose it, and the run does not call the new enrolment; \(Self.recovery(agent))")
        case nil:
            return enrolled.coordinatorToken
        }
    }

    /// Why `agent` is not called for a run that chose it at `chosenAt` (nil: it is).
    func notCalled(_ agent: String, chosenAt: Double) -> String? {
        do { _ = try credentialForCalling(agent, chosenAt: chosenAt); return nil } catch { return "\(error)" }
    }

    /// How to get a revoked agent's node back (docs/API.md, agents/README.md).
    static func recovery(_ agent: String) -> String {
        "to recover: herald-lab agents enrol \(agent) --host HOST, install the enrolment on its host (agents/install.sh), restart its agent, and run the plan again"
    }

    /// In a TLS lab an agent is called only over TLS, on a host its certificate names: an
    /// enrolled agent registers only an `https` URL whose host it was enrolled for (the hosts
    /// the coordinator issued its certificate for); a name never enrolled only an `https` URL.
    /// Nothing, the operator's credential least of all, then crosses the network in clear.
    func checkCallable(_ name: String, at url: String) throws {
        let hosts = read { $0.byName[name]?.hosts }
        if let why = Self.callableProblem(name, at: url, tlsLab: tlsLab, enrolledHosts: hosts) { throw LabRefusal(.forbidden, why) }
    }

    /// `checkCallable`'s rule: nil when `url` may be registered (`enrolledHosts`: nil for a name
    /// never enrolled).
    static func callableProblem(_ name: String, at url: String, tlsLab: Bool, enrolledHosts: [String]?) -> String? {
        guard tlsLab else { return nil }
        guard let u = URLComponents(string: url), u.scheme == "https", let host = u.host else {
            return "agent \(name) registers \(HTTPService.escaped(url)): this lab runs TLS, so an agent registers an https URL only"
        }
        guard let enrolledHosts else { return nil }
        let bare = canonicalHost(host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")))
        guard enrolledHosts.map(canonicalHost).contains(bare) else {
            return "agent \(name) registers \(HTTPService.escaped(url)), but its certificate names \(enrolledHosts.isEmpty ? "no host" : enrolledHosts.joined(separator: ", ")) only (enrol it again with --host for the host it runs on)"
        }
        return nil
    }

    /// A host as certificates compare it: IP literals in their canonical form, names in lower case.
    static func canonicalHost(_ h: String) -> String {
        var buf = [UInt8](repeating: 0, count: 16)
        var text = [CChar](repeating: 0, count: 64)
        for family in [AF_INET, AF_INET6] where inet_pton(family, h, &buf) == 1 {
            if inet_ntop(family, &buf, &text, socklen_t(text.count)) != nil { return String(cString: text) }
        }
        return h.lowercased()
    }

    /// Enrols `name`: a new credential pair, and a certificate for its `hosts` signed by the lab
    /// CA (which needs ca.pem and ca-key.pem in the coordinator's credentials folder). Enrolling
    /// a name again replaces its credentials (the old ones stop working).
    func enrol(_ request: LabWire.EnrolRequest) throws -> Enrolment {
        guard SafeName.isValid(request.name) else { throw LabRefusal(.invalid, "agent name \"\(HTTPService.escaped(request.name))\" \(SafeName.problem(with: request.name) ?? "")") }
        guard let folder = credentials, folder.has("ca.pem"), folder.has("ca-key.pem") else {
            throw LabRefusal(.conflict, "the coordinator has no lab CA to issue certificates with: start it with --credentials DIR made by herald-lab ca init")
        }
        guard request.hosts.count <= 16 else { throw LabRefusal(.invalid, "hosts: at most 16 names or addresses") }
        for h in request.hosts {
            guard Self.isHostName(h) else { throw LabRefusal(.invalid, "hosts: \"\(HTTPService.escaped(h))\" is not a host name or an IP address") }
        }
        let days = request.days ?? 825
        guard (1...3650).contains(days) else { throw LabRefusal(.invalid, "days must be between 1 and 3650") }
        let tmp = FileManager.default.temporaryDirectory.appendingPathComponent("heraldlab-enrol-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer {
            // It holds the private key just issued: a copy left behind is said.
            do { try FileManager.default.removeItem(at: tmp) } catch {
                logger.warning("cannot remove \(tmp.path), which holds the key issued for \(request.name): \(error)", metadata: ["agent": .string(request.name)])
            }
        }
        let cert = tmp.appendingPathComponent("cert.pem"), key = tmp.appendingPathComponent("key.pem")
        do {
            try LabCA.issue(caCertificate: folder.path("ca.pem"), caKey: folder.path("ca-key.pem"), commonName: request.name,
                            names: request.hosts, days: days, certificate: cert.path, key: key.path)
        } catch { throw LabRefusal(.failed, "cannot issue a certificate for \(request.name): \(error)") }
        let credential = AgentCredential(name: request.name, token: LabToken.generate(), coordinatorToken: LabToken.generate())
        let record = IdentityStore.Credential(name: request.name, tokenHash: CredentialHash.of(credential.token),
                                                 coordinatorToken: credential.coordinatorToken, issuedAt: clock.now(), revokedAt: nil, hosts: request.hosts)
        guard let store else { throw LabRefusal(.conflict, "the coordinator has no credentials folder to keep enrolments in") }
        try store.saveCredential(record)
        add(record)
        logger.notice("agent \(request.name) enrolled (certificate for \(request.hosts.isEmpty ? "no host names" : request.hosts.joined(separator: ", ")), \(days) days)", metadata: ["agent": .string(request.name)])
        var enrolment = Enrolment(credential: credential, coordinator: request.coordinator,
                                  ca: try String(contentsOfFile: folder.path("ca.pem"), encoding: .utf8),
                                  certificate: try String(contentsOf: cert, encoding: .utf8),
                                  key: try String(contentsOf: key, encoding: .utf8))
        enrolment.hosts = request.hosts
        return enrolment
    }

    /// Revokes `name`'s credential (kept in SQLite with when): refused from now on
    /// (`refusal(of:chosenAt:)`). The coordinator also forgets the agent and tells the air.
    func revoke(_ name: String) throws {
        guard SafeName.isValid(name) else { throw LabRefusal(.invalid, "agent name \(SafeName.problem(with: name) ?? "is invalid")") }
        guard var record = read({ $0.byName[name] }) else { throw LabRefusal(.notFound, "agent \(name) was never enrolled") }
        record.revokedAt = clock.now()
        guard let store else { throw LabRefusal(.notFound, "agent \(name) was never enrolled") }
        try store.saveCredential(record)
        add(record)
    }

    /// A DNS name or an IP literal, as certificates take them.
    static func isHostName(_ h: String) -> Bool {
        guard !h.isEmpty, h.utf8.count <= 253 else { return false }
        var buf = [UInt8](repeating: 0, count: 16)
        if inet_pton(AF_INET, h, &buf) == 1 || inet_pton(AF_INET6, h, &buf) == 1 { return true }
        return h.unicodeScalars.allSatisfy { ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "-" || $0 == "." }
            && !h.hasPrefix(".") && !h.hasPrefix("-") && !h.contains("..")
    }
}
