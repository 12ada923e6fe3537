import Foundation
import Hummingbird
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

/// A JSON HTTP/1.1 service on Hummingbird 2: routes handed over once by its owner (`serve(_:)`:
/// public ones on the router directly, the rest on the groups of `routes(allow:)`, behind
/// authentication and the role, 401 and 403),
/// errors answered as `{"error": message}`, and limits enforced before the work is done
/// (`Limits`). Used by the agent and the coordinator. Its connections are served by the gate,
/// limits and deadlines of `LabHTTPChannel` (see ARCHITECTURE.md, "HTTP on Hummingbird").
public final class HTTPService: Sendable {
    public let name: String
    public let limits: Limits
    /// The service's log (label herald-lab.http), with metadata `service` (its name).
    public let logger: Logger
    public static let defaultBodyLimit = 1 << 20

    let authenticate: Authenticate?
    /// Wrong credentials slowed per peer address (bearer tokens here, the dashboard's sign-in
    /// through the same one).
    public let throttle: AuthThrottle
    /// What `serve(_:)` built once from the owner's routes: the responder, and every route's
    /// method and path template (`:name` parameters), as Hummingbird routes them (the
    /// endpoint-table tests compare them with LabPlan's `AgentAPI` and `CoordinatorAPI`).
    private let built = Mutex<(responder: RouterResponder<LabRequestContext>, table: [(method: String, path: String)])?>(nil)
    public var routeTable: [(method: String, path: String)] { built.withLock { $0?.table } ?? [] }
    /// The server while it runs (its gate, its listening channel once it listens, and the task
    /// running it when `start` runs it), and whether it serves TLS, under one lock.
    struct Running {
        var server: (gate: ConnectionGate, listener: (any Channel)?, task: Task<Void, Never>?)?
        var servingTLS = false
    }
    let running = Mutex(Running())
    /// Over TLS every answer says so for a year (HSTS): a browser that once reached the
    /// coordinator over https never falls back to plain http for it.
    var strictTransportSecurity: String? { running.withLock { $0.servingTLS ? "max-age=31536000" : nil } }

    /// `authenticate` nil turns authentication off (only for `--insecure` on loopback): every
    /// route is then open and `LabRequestContext.principal` is nil.
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

    /// The routes being built, lent to the owner by `serve(_:)` and not kept after it (Hummingbird's
    /// `Router` is a builder, not Sendable): public routes on `router` directly (GET /health is
    /// there already), the rest on the groups of `routes(allow:)`, behind authentication.
    public struct Routes {
        public let router: Router<LabRequestContext>
        let service: HTTPService

        /// Routes behind authentication: a caller without a valid credential gets 401, one whose
        /// role is not in `allow` 403 (`allow` nil: any role but the scraper's).
        public func routes(allow: Set<Role>? = nil) -> RouterGroup<LabRequestContext> {
            router.group().add(middleware: AuthenticationMiddleware(service: service, allow: allow))
        }
    }

    /// Hands the service its routes, once, before it starts: `build` adds them on a fresh router,
    /// from which the responder is built and kept (immutable after). A second call is a
    /// programming error.
    public func serve(_ build: (Routes) throws -> Void) rethrows {
        let made = try makeResponder(build)
        built.withLock { built in
            precondition(built == nil, "\(name): routes handed over twice, or after the service started")
            built = made
        }
    }

    /// The responder (`serve(_:)`'s; with no routes handed over, one with GET /health only), for
    /// `start` or a test of the routes in Hummingbird's router mode.
    public func responder() -> RouterResponder<LabRequestContext> {
        built.withLock { built in
            if let built { return built.responder }
            let made = makeResponder { _ in }
            built = made
            return made.responder
        }
    }

    private func makeResponder(_ build: (Routes) throws -> Void) rethrows -> (responder: RouterResponder<LabRequestContext>, table: [(method: String, path: String)]) {
        let router = Router(context: LabRequestContext.self, options: .autoGenerateHeadEndpoints)
        router.add(middleware: EdgeMiddleware(service: self))
        let name = self.name
        router.get("/health") { _, _ in Response.json(["status": "ok", "service": name]) }
        try build(Routes(router: router, service: self))
        // Added last, it is in front of the not-found answer only: without a valid credential an
        // unknown route is 401, never 404.
        router.add(middleware: AuthenticationMiddleware(service: self, allow: Set(Role.allCases)))
        let table = router.routes.map { r in
            (r.method.rawValue, "/" + r.path.components.map { c in "\(c)".hasPrefix("{") ? ":" + "\(c)".dropFirst().dropLast() : "\(c)" }.joined(separator: "/"))
        }
        return (router.buildResponder(), table)
    }

    /// Runs the server in a task of its own (tests, in-memory labs; a process puts `server(...)`
    /// in its ServiceGroup instead) and returns the bound port once it listens.
    public func start(host: String = "127.0.0.1", port: UInt16, tls: TLSContext? = nil) async throws -> UInt16 {
        let (ports, listening) = AsyncThrowingStream.makeStream(of: UInt16.self)
        let server = try self.server(host: host, port: port, tls: tls) { listening.yield($0) }
        let name = self.name
        let task = Task {
            do {
                try await server.run()
                listening.finish(throwing: ServiceError("\(name): the server ended before it listened"))
            } catch {
                listening.finish(throwing: error)
            }
        }
        running.withLock { $0.server?.task = task }
        for try await bound in ports { return bound }
        throw ServiceError("\(name): the server ended before it listened")
    }

    /// Closes every connection (a handler still running finds its connection gone when it
    /// answers). When `start` runs the server, it also stops listening and returns once the server
    /// has ended, or after about a second; in a ServiceGroup the group's shutdown, which comes
    /// after, stops the listener (closing it here would end the server before its turn, which
    /// the group takes for a failure).
    public func stop() async {
        guard let (gate, listener, task) = running.withLock({ r in
            defer { r.server = nil }
            return r.server
        }) else { return }
        gate.closeAll()
        guard let task else { return }
        // The listening socket is closed here: when stop() returns, a connect is refused.
        if let listener {
            do { try await listener.close() } catch {
                // Already closed (the server ended): the port is closed either way.
            }
        }
        gate.closeAll()
        let deadline = monotonicNow() + 1
        while monotonicNow() < deadline, gate.count() > 0 {
            do { try await Task.sleep(nanoseconds: 10_000_000) } catch { break }
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

    /// Text from the network as it may go into a log line: control characters, direction marks,
    /// quotes and backslashes escaped (no forged lines), at most 200 characters (`OutsideText`).
    public static func escaped(_ text: String) -> String {
        OutsideText.escaped(text, limit: 200, quotes: true)
    }
}
