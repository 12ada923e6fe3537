import Foundation
import HeraldCore
import LabNet
import Logging
import Synchronization
import NIOCore
import NIOSSL
import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

/// A JSON HTTP/1.1 service: routes with `:parameters`, authentication before routing (401 on
/// every route but the public ones such as `GET /health`, known or not, and a log line), roles
/// per route (403), and limits enforced before the work is done (`Limits`). Used by the agent
/// and the coordinator. Its connections are served by
/// the gate, limits and deadlines of `LabHTTPChannel` on Hummingbird 2's server (see
/// ARCHITECTURE.md, "HTTP on Hummingbird").
public final class HTTPService: Sendable {
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

    /// What one connection may cost before it is refused: each limit is checked before the work
    /// it bounds (a header block is not buffered past its limit, a body over its route's limit
    /// is not read).
    public struct Limits: Sendable, Equatable {
        /// From a request's first byte to the end of its head (408 after).
        public var headerTimeout: Double = 10
        /// A connection without a new request for this long is closed without an answer.
        public var idleTimeout: Double = 10
        /// From the end of the head to the end of the body (408 after).
        public var bodyTimeout: Double = 30
        /// A write of the answer that makes no progress for this long ends the connection (a
        /// client must keep reading a large file).
        public var writeTimeout: Double = 30
        /// The whole head, request line included (431 beyond).
        public var maxHeaderBytes = 16 * 1024
        /// The request line (414 beyond).
        public var maxRequestLine = 8 * 1024
        /// Header fields in one request (431 beyond).
        public var maxHeaderCount = 100
        /// Connections open at once, idle ones included; one more is answered 503 (a TLS alert on
        /// a TLS port) and closed at accept.
        public var maxConnections = 1024
        /// Connections one address that has not authenticated lately may hold.
        public var maxConnectionsPerAddress = 32
        /// Places of `maxConnections` only addresses that authenticated lately may take.
        public var reservedForKnown = 128

        public init(headerTimeout: Double = 10, idleTimeout: Double = 10, bodyTimeout: Double = 30, writeTimeout: Double = 30,
                    maxHeaderBytes: Int = 16 * 1024, maxRequestLine: Int = 8 * 1024, maxHeaderCount: Int = 100, maxConnections: Int = 1024,
                    maxConnectionsPerAddress: Int = 32, reservedForKnown: Int = 128) {
            self.headerTimeout = headerTimeout
            self.idleTimeout = idleTimeout
            self.bodyTimeout = bodyTimeout
            self.writeTimeout = writeTimeout
            self.maxHeaderBytes = maxHeaderBytes
            self.maxRequestLine = maxRequestLine
            self.maxHeaderCount = maxHeaderCount
            self.maxConnections = maxConnections
            self.maxConnectionsPerAddress = maxConnectionsPerAddress
            self.reservedForKnown = reservedForKnown
        }
    }

    public struct Request: Sendable {
        public var method: String
        /// The decoded path: "/" and the percent-decoded segments (none holds "/", ".", "..").
        public var path: String
        public var parameters: [String: String]
        public var query: [String: String]
        /// Field names in lower case.
        public var headers: [String: String]
        public var body: Data
        /// `host:port` of the peer.
        public var remote: String
        /// The numeric address the request came from (IPv4 or IPv6, no brackets), when known.
        public var peerHost: String?
        /// Who sent it; nil on a public route without a credential, or with authentication off.
        public var principal: Principal?

        public func decode<T: Decodable>(_ type: T.Type) throws -> T {
            do { return try LabJSON.decoder.decode(T.self, from: body) } catch {
                throw HTTPError(.badRequest, "request body is not a valid \(T.self): \(LabJSON.describe(error))")
            }
        }
    }

    public typealias Handler = @Sendable (Request) async throws -> HTTPResponse

    struct Route: Sendable {
        let method: String
        let parts: [String]
        let handler: Handler
        let isPublic: Bool
        let bodyLimit: Int
        let allow: Set<Role>?
    }

    public let name: String
    public let limits: Limits
    /// The service's log (label herald-lab.http), with metadata `service` (its name).
    public let logger: Logger
    public static let defaultBodyLimit = 1 << 20

    let authenticate: Authenticate?
    /// Wrong credentials slowed per peer address (bearer tokens here, the dashboard's sign-in
    /// through the same one).
    public let throttle: AuthThrottle
    /// The routes, in the order added (and routed).
    let routes = Mutex<[Route]>([])
    /// Every route's method and path template, in the order routed (the endpoint-table tests
    /// compare them with LabPlan's `AgentAPI` and `CoordinatorAPI`).
    public var routeTable: [(method: String, path: String)] {
        routes.withLock { $0.map { ($0.method, "/" + $0.parts.joined(separator: "/")) } }
    }
    /// The running server (its service group, the task running it, its gate and listener), and
    /// whether it serves TLS, under one lock.
    private struct Running {
        var server: (group: ServiceGroup, task: Task<Void, Never>, gate: ConnectionGate, listener: any Channel)?
        var servingTLS = false
    }
    private let running = Mutex(Running())
    /// Over TLS every answer says so for a year (HSTS): a browser that once reached the
    /// coordinator over https never falls back to plain http for it.
    var strictTransportSecurity: String? { running.withLock { $0.servingTLS ? "max-age=31536000" : nil } }

    /// `authenticate` nil turns authentication off (only for `--insecure` on loopback): every
    /// route is then open and `Request.principal` is nil.
    public init(name: String, authenticate: Authenticate?, limits: Limits = Limits(),
                logger: Logger = Logger(label: "herald-lab.http"), throttle: AuthThrottle.Rules = AuthThrottle.Rules(),
                now: @escaping @Sendable () -> Double = { ProcessInfo.processInfo.systemUptime }) {
        self.name = name
        self.authenticate = authenticate
        self.limits = limits
        var logger = logger
        logger[metadataKey: "service"] = .string(name)
        self.logger = logger
        self.throttle = AuthThrottle(rules: throttle, logger: logger, now: now)
        route("GET", "/health", public: true) { _ in .json(["status": "ok", "service": name]) }
    }

    /// The logger of a service's HTTP when its owner hands none in: label herald-lab.http, at
    /// the owner's level.
    public static func defaultLogger(level: Logger.Level) -> Logger {
        var logger = Logger(label: "herald-lab.http")
        logger.logLevel = level
        return logger
    }

    /// One shared token, authenticated as the operator; nil turns authentication off.
    public convenience init(name: String, token: String?, limits: Limits = Limits(),
                            logger: Logger = Logger(label: "herald-lab.http")) {
        var authenticate: Authenticate?
        if let token {
            authenticate = { given in HTTPService.constantTimeEqual(given, token) ? Principal(role: .operator, name: "token") : nil }
        }
        self.init(name: name, authenticate: authenticate, limits: limits, logger: logger)
    }

    /// Adds a route; `pattern` segments starting with `:` are parameters (matched against the
    /// decoded segments). `allow` nil lets any authenticated principal call it; otherwise a
    /// principal of another role gets 403.
    public func route(_ method: String, _ pattern: String, public isPublic: Bool = false, bodyLimit: Int = HTTPService.defaultBodyLimit,
                      allow: Set<Role>? = nil, _ handler: @escaping Handler) {
        let route = Route(method: method, parts: pattern.split(separator: "/").map(String.init), handler: handler,
                            isPublic: isPublic, bodyLimit: max(0, bodyLimit), allow: allow)
        routes.withLock { $0.append(route) }
    }

    /// Starts listening on `host:port` (a name, an IPv4 or IPv6 literal, or a wildcard; port 0:
    /// any free port); returns the bound port. With `tls`, every connection is TLS (swift-nio-ssl,
    /// the handshake within the first head's deadline).
    public func start(host: String = "127.0.0.1", port: UInt16, tls: TLSContext? = nil) async throws -> UInt16 {
        let ssl = tls?.nio
        let gate = ConnectionGate(total: limits.maxConnections, perAddress: limits.maxConnectionsPerAddress, reserved: limits.reservedForKnown)
        let (server, bound) = try await serve(host: host, port: port, tls: ssl, gate: gate)
        running.withLock { $0.server = (server.0, server.1, gate, server.2); $0.servingTLS = tls != nil }
        return bound
    }

    /// Stops listening, closes every connection (a handler still running finds its connection
    /// gone when it answers), and returns once the server has ended, or after about a second.
    public func stop() async {
        guard let (group, task, gate, listener) = running.withLock({ r -> (ServiceGroup, Task<Void, Never>, ConnectionGate, any Channel)? in
            defer { r.server = nil }
            return r.server
        }) else { return }
        // The listening socket is closed here, not later by the service group's shutdown: when
        // stop() returns, a connect is refused.
        gate.closeAll()
        do { try await listener.close() } catch {
            // Already closed by the group: the port is closed either way.
        }
        await group.triggerGracefulShutdown()
        gate.closeAll()
        let deadline = monotonicNow() + 1
        while monotonicNow() < deadline, gate.count() > 0 {
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        task.cancel()
    }

    /// Open connections: in all, or from one address (tests, figures).
    public func openConnections(from address: String? = nil) -> Int {
        running.withLock { $0.server?.gate }?.count(address) ?? 0
    }

    /// The address presented a valid credential: it may use the places kept for those.
    func vouch(for address: String?) {
        guard let address, let gate = running.withLock({ $0.server?.gate }) else { return }
        gate.vouch(for: address)
    }

    // MARK: Routing and authentication

    enum Admission {
        case refuse(HTTPStatusCode, String, logged: String?)
        case route(Route, [String: String], Principal?)
    }

    func match(_ method: String, _ segments: [String]) -> (Route, [String: String])? {
        let rs = routes.withLock { $0 }
        func find(_ method: String) -> (Route, [String: String])? {
            for r in rs where r.method == method && r.parts.count == segments.count {
                var params = [String: String]()
                var ok = true
                for (p, v) in zip(r.parts, segments) {
                    if p.hasPrefix(":") { params[String(p.dropFirst())] = v } else if p != v { ok = false; break }
                }
                if ok { return (r, params) }
            }
            return nil
        }
        // HEAD is GET without the body.
        return find(method) ?? (method == "HEAD" ? find("GET") : nil)
    }

    /// Authentication before routing: without a valid credential nobody learns which routes
    /// exist (an unknown route is 401 too, never 404); then the route, then the role.
    func admit(method: String, segments: [String], authorization: String?) -> Admission {
        let path = "/" + segments.joined(separator: "/")
        let matched = match(method, segments)
        var principal: Principal?
        if let authenticate {
            let bearer = authorization.flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
            if let bearer { principal = authenticate(bearer) }
            if matched?.0.isPublic != true && principal == nil {
                return .refuse(.unauthorized, "a valid token is required (Authorization: Bearer <token>)",
                               logged: "\(bearer == nil ? "missing" : "wrong") token")
            }
        }
        guard let (route, params) = matched else {
            return .refuse(.notFound, "no route \(method) \(Self.escaped(path))", logged: nil)
        }
        if authenticate != nil, !route.isPublic, let principal, !(route.allow?.contains(principal.role) ?? (principal.role != .scraper)) {
            return .refuse(.forbidden, "not allowed for role \(principal.role.rawValue)",
                           logged: "\(principal.role.rawValue) \(Self.escaped(principal.name)) is not allowed here")
        }
        return .route(route, params, principal)
    }

    /// Runs a route's handler; its errors become answers.
    func respond(_ route: Route, _ request: Request) async -> HTTPResponse {
        do {
            return try await route.handler(request)
        } catch let e as HTTPError {
            return .error(e.status, e.message)
        } catch let e as LabRefusal {
            return .error(HTTPStatusCode(refusal: e.kind), e.message)
        } catch {
            logger.error("\(request.method) \(Self.escaped(request.path)) failed: \(Self.escaped("\(error)"))", metadata: ["peer": .string(request.remote)])
            return .error(.internalServerError, "\(error)")
        }
    }

    /// Text from the network as it may go into a log line: control characters, direction marks,
    /// quotes and backslashes escaped (no forged lines), at most 200 characters (`OutsideText`).
    public static func escaped(_ text: String) -> String {
        OutsideText.escaped(text, limit: 200, quotes: true)
    }

    public static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var diff: UInt8 = 0
        for i in 0..<x.count { diff |= x[i] ^ y[i] }
        return diff == 0
    }
}
