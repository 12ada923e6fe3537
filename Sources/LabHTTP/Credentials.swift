import Foundation
import HeraldCore
import LabNet

/// A credentials folder (`--credentials DIR`, or `$HERALDLAB_CREDENTIALS`): what a service or a
/// command proves itself with and whom it trusts.
///
///     ca.pem          the lab CA: https and TLS air addresses are checked against it
///     cert.pem        this host's certificate (issued by the lab CA) and
///     key.pem         its key: a service with both serves TLS
///     operator.token  the operator's credential (coordinator host, herald-lab commands)
///     ca-key.pem      the CA's key (coordinator host only): enrolment issues certificates with it
///     air.key         the key the air checks node tickets with (coordinator and air hosts)
///     agent.json      an agent's enrolment: its name, its credential, the coordinator's
///
/// `herald-lab ca init` makes a coordinator host's folder; `herald-lab enrol FILE` an agent's.
public struct CredentialsFolder: Sendable {
    public let url: URL

    public static let environment = "HERALDLAB_CREDENTIALS"

    /// The folder named by `path`, else by `$HERALDLAB_CREDENTIALS`; nil when neither says one.
    public static func locate(_ path: String?) throws -> CredentialsFolder? {
        guard let p = path ?? ProcessInfo.processInfo.environment[environment].flatMap({ $0.isEmpty ? nil : $0 }) else { return nil }
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: p, isDirectory: &isDir), isDir.boolValue else {
            throw CredentialError("credentials folder \(p) does not exist (make one with herald-lab ca init, or herald-lab enrol FILE)")
        }
        return CredentialsFolder(url: URL(fileURLWithPath: p))
    }

    public init(url: URL) { self.url = url }

    public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// Whether `name` is a regular file in the folder.
    public func has(_ name: String) -> Bool {
        var st = stat()
        return lstat(path(name), &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG
    }

    /// The TLS context this host serves with, when the folder has cert.pem and key.pem.
    public func serverTLS() throws -> TLSContext? {
        switch (has("cert.pem"), has("key.pem")) {
        case (false, false): return nil
        case (true, true):
            do { return try TLSContext(certificate: path("cert.pem"), key: path("key.pem")) } catch {
                throw CredentialError("\(url.path): \(error)")
            }
        default: throw CredentialError("\(url.path) holds only one of cert.pem and key.pem: both or neither")
        }
    }

    /// Trusts the folder's lab CA for every https URL and TLS air address this process dials.
    /// Returns the context (nil when the folder has no ca.pem).
    @discardableResult
    public func trustLabCA() throws -> TLSContext? {
        guard has("ca.pem") else { return nil }
        do {
            return try LabTrust.trust(caFile: path("ca.pem"))
        } catch { throw CredentialError("\(url.path): \(error)") }
    }

    /// A one-line secret from a file of the folder (at least 16 characters), nil when absent.
    public func secret(_ name: String) throws -> String? {
        guard has(name) else { return nil }
        return try LabToken.load(file: path(name))
    }

    /// The agent's enrolment, when the folder has agent.json.
    public func agent() throws -> AgentCredential? {
        guard has("agent.json") else { return nil }
        let data: Data
        do { data = try Data(contentsOf: url.appendingPathComponent("agent.json")) } catch {
            throw CredentialError("cannot read \(path("agent.json")): \(error.localizedDescription)")
        }
        guard data.count < 64 * 1024, let c = try? LabJSON.decoder.decode(AgentCredential.self, from: data), c.isValid else {
            throw CredentialError("\(path("agent.json")) is not an agent enrolment (name, token, coordinatorToken)")
        }
        return c
    }
}

/// A credentials problem: the file and what is wrong (the commands exit 2 with it).
public struct CredentialError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ d: String) { description = d }
}

/// An agent's own credentials, bound to its name at enrolment.
public struct AgentCredential: Codable, Sendable, Equatable {
    /// The agent's name: the only name it may register and heartbeat as.
    public var name: String
    /// What the agent calls the coordinator with.
    public var token: String
    /// What the coordinator calls this agent with (no other agent knows it).
    public var coordinatorToken: String

    public init(name: String, token: String, coordinatorToken: String) {
        self.name = name
        self.token = token
        self.coordinatorToken = coordinatorToken
    }

    var isValid: Bool { SafeName.isValid(name) && token.count >= 32 && coordinatorToken.count >= 32 }
}

/// What the coordinator issues when an operator enrols an agent (`herald-lab agents enrol`),
/// carried to the node in one file (mode 0600) and unpacked there by `herald-lab enrol`.
public struct Enrolment: Codable, Sendable {
    public var credential: AgentCredential
    /// The coordinator the agent registers with (as the operator called it).
    public var coordinator: String?
    /// PEM texts: the lab CA, the agent's certificate and key.
    public var ca: String
    public var certificate: String
    public var key: String
    /// A ticket the air accepts for nodes of this agent (see `AirTicket`), when the lab has an air key.
    public var airKey: String?
    /// The host names and addresses the certificate was issued for: agents/install.sh checks
    /// them against the host it installs on before touching anything.
    public var hosts: [String]?

    public init(credential: AgentCredential, coordinator: String?, ca: String, certificate: String, key: String, airKey: String? = nil) {
        self.credential = credential
        self.coordinator = coordinator
        self.ca = ca
        self.certificate = certificate
        self.key = key
        self.airKey = airKey
    }

    /// Writes the agent's credentials folder: ca.pem, cert.pem, key.pem and agent.json, each 0600
    /// whatever the umask. A folder it makes is 0700 (whatever the umask); one that exists must
    /// be a directory that neither the group nor others may write to (anyone who can write
    /// there could swap the key), and keeps its mode.
    public func install(into folder: URL) throws {
        guard SafeName.isValid(credential.name), credential.isValid else { throw CredentialError("the enrolment's credential is invalid") }
        try Self.privateFolder(folder)
        for (name, text, mode) in [("ca.pem", ca, 0o600), ("cert.pem", certificate, 0o600), ("key.pem", key, 0o600)] as [(String, String, Int)] {
            guard text.hasPrefix("-----BEGIN "), text.utf8.count < 64 * 1024 else { throw CredentialError("the enrolment's \(name) is not PEM") }
            try Durable.write(Data(text.utf8), to: folder.appendingPathComponent(name), mode: mode_t(mode))
        }
        try Durable.write(try LabJSON.encoder.encode(credential), to: folder.appendingPathComponent("agent.json"), mode: 0o600)
    }

    /// Makes `folder` mode 0700 (mkdir, then chmod: the umask cannot widen it), or checks that an
    /// existing one is a directory (not a link) that the group and others cannot write to.
    static func privateFolder(_ folder: URL) throws {
        let path = folder.path
        var st = stat()
        if lstat(path, &st) != 0 {
            guard errno == ENOENT else { throw CredentialError("\(path): \(String(cString: strerror(errno)))") }
            let parent = folder.deletingLastPathComponent()
            do { try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true) } catch {
                throw CredentialError("cannot make \(parent.path): \(error.localizedDescription)")
            }
            guard mkdir(path, 0o700) == 0 || errno == EEXIST else { throw CredentialError("cannot make \(path): \(String(cString: strerror(errno)))") }
            guard lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, chmod(path, 0o700) == 0 else {
                throw CredentialError("cannot make \(path) private (mode 0700)")
            }
            return
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw CredentialError("\(path) is not a directory") }
        guard st.st_mode & 0o022 == 0 else {
            throw CredentialError("\(path) may be written by its group or by others (mode \(String(st.st_mode & 0o7777, radix: 8))); a credentials folder must not be (chmod go-w \(path))")
        }
    }
}

/// Credentials as a service holds them: a lookup from a bearer credential to who holds it.
public enum CredentialHash {
    /// SHA-256 of a credential, hex: what the coordinator keeps of agents' credentials.
    public static func of(_ secret: String) -> String {
        SHA256.hash(Data(secret.utf8))
    }
}

/// The shared token: `HERALDLAB_TOKEN`, or the first line of a token file.
public enum LabToken {
    public static func load(file: String?) throws -> String? {
        if let file {
            let text: String
            do { text = try String(contentsOfFile: file, encoding: .utf8) } catch {
                throw ServiceError("cannot read the token file \(file): \(error.localizedDescription)")
            }
            let token = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
            guard token.count >= minimumLength else {
                throw ServiceError("the token in \(file) is shorter than \(minimumLength) characters (\(token.count)): too easy to guess; herald-lab ca init writes one of 64")
            }
            return token
        }
        if let env = ProcessInfo.processInfo.environment["HERALDLAB_TOKEN"], !env.isEmpty {
            guard env.count >= minimumLength else {
                throw ServiceError("HERALDLAB_TOKEN is shorter than \(minimumLength) characters (\(env.count)): too easy to guess; herald-lab ca init writes one of 64")
            }
            return env
        }
        return nil
    }

    /// The shortest credential a service or client takes (a 2-character HERALDLAB_TOKEN was
    /// accepted once, issue 36).
    public static let minimumLength = 32

    /// A new random token (hex, 32 bytes).
    public static func generate() -> String {
        var g = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }
}

/// Who calls a service, as its bearer credential says (`AuthenticationMiddleware` asks).
extension HTTPService {
    /// Who may call: what a bearer credential authenticates as.
    public enum Role: String, Sendable, Hashable, CaseIterable {
        /// `scraper` holds the scrape credential: it reads `GET /metrics` and nothing else, so a
        /// Prometheus server's credential opens no other route, not even those any principal may call.
        case `operator`, coordinator, agent, scraper
    }

    /// Adds a scrape credential (`scraper`, for `GET /metrics` only) to an authenticator.
    public static func withScraper(_ token: String?, _ base: Authenticate?) -> Authenticate? {
        guard let token, let base else { return base }
        return { given in constantTimeEqual(given, token) ? Principal(role: .scraper, name: "scraper") : base(given) }
    }

    /// An authenticated caller.
    public struct Principal: Sendable, Equatable, Hashable {
        public var role: Role
        public var name: String
        public init(role: Role, name: String) { self.role = role; self.name = name }
        /// Who this is, for AuthThrottle's memory of credentials that succeeded from an address.
        public var throttleKey: String { "\(role.rawValue) \(name)" }
    }

    /// Maps a bearer credential to its principal, or nil when it is not valid.
    public typealias Authenticate = @Sendable (_ bearer: String) -> Principal?

    /// Compares two secrets in time that depends on their length only.
    public static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var diff: UInt8 = 0
        for i in 0..<x.count { diff |= x[i] ^ y[i] }
        return diff == 0
    }
}
