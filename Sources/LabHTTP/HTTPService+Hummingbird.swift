import Foundation
import HeraldCore
import HTTPTypes
import Hummingbird
import HummingbirdCore
import LabNet
import LabPlan
import Logging
import NIOCore
import NIOSSL
import ServiceLifecycle
import Synchronization

/// What a request carries through the middleware to its route: Hummingbird's storage, the peer
/// (read from the context's source when the request comes; the channel is not kept), the
/// decoded path and query, and who sent it.
public struct LabRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// `host:port` of the peer, as log lines write it.
    public let remote: String
    /// The numeric address the request came from (IPv4 or IPv6, no brackets), when known.
    public let peerHost: String?
    /// Who sent it; nil on a public route, or with authentication off.
    public internal(set) var principal: HTTPService.Principal?
    /// The path's segments and the query, each percent-decoded once (`EdgeMiddleware`).
    public internal(set) var segments: [String] = []
    public internal(set) var query: [String: String] = [:]

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        (remote, peerHost) = HTTPService.remote(of: source.channel)
    }

    /// The decoded path: "/" and the segments (none holds "/", ".", "..").
    public var path: String { "/" + segments.joined(separator: "/") }

    /// A `:name` parameter of the route, percent-decoded once ("" when the route has none).
    public func parameter(_ name: String) -> String {
        guard let raw = parameters.get(name), let bytes = RequestHead.percentDecoded(raw.utf8) else { return "" }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// The first middleware of every route and of the not-found answer: the request target decoded
/// (400 when malformed), errors answered as `{"error": message}` (`LabRefusal` by its kind's
/// status, Hummingbird's `HTTPError` by its own), HEAD without a body, HSTS over TLS.
struct EdgeMiddleware: RouterMiddleware {
    typealias Context = LabRequestContext
    let service: HTTPService

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var context = context
        var response: Response
        do {
            (context.segments, context.query) = try RequestHead.decodeTarget(request.uri.description, method: request.method.rawValue)
            response = try await next(request, context)
        } catch let e as HTTPError where e.status == .notFound && e.body == nil {
            // Hummingbird's router found no route.
            response = .error(.notFound, "no route \(request.method) \(HTTPService.escaped(context.path))")
        } catch {
            if let (status, message) = HTTPService.refusal(error) {
                response = .error(status, message)
                if let e = error as? HTTPError { for field in e.headers { response.headers[field.name] = field.value } }
            } else {
                service.logger.error("\(request.method) \(HTTPService.escaped(context.path)) failed: \(HTTPService.escaped("\(error)"))", metadata: ["peer": .string(context.remote)])
                response = .error(.internalServerError, "\(error)")
            }
        }
        if request.method == .head { response = response.createHeadResponse() }
        if let hsts = service.strictTransportSecurity { response.headers[.strictTransportSecurity] = hsts }
        return response
    }
}

/// Authentication and the role, once, in front of a group of routes (and of the not-found
/// answer, so that without a valid credential nobody learns which routes exist): 401 without a
/// valid credential, 403 for a role not in `allow`, 429 while an address that guessed wrong too
/// often waits (AuthThrottle). A valid credential vouches for its address at the gate.
struct AuthenticationMiddleware: RouterMiddleware {
    typealias Context = LabRequestContext
    let service: HTTPService
    /// nil: any role but the scraper's.
    let allow: Set<HTTPService.Role>?

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let authenticate = service.authenticate else {
            // Authentication off (loopback only): every caller is as known as any other.
            service.vouch(for: context.peerHost)
            return try await next(request, context)
        }
        let peer = context.peerHost ?? context.remote
        let authorization = request.headers[.authorization]
        let bearer = authorization.flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
        let principal = bearer.flatMap(authenticate)
        if let wait = service.throttle.retryAfter(peer), authorization != nil, !(principal.map { service.throttle.isKnown(peer, $0.throttleKey) } ?? false) {
            let seconds = AuthThrottle.retryAfterHeader(wait)
            throw HTTPError(.tooManyRequests, headers: [.retryAfter: seconds], message: "too many wrong credentials from this address: try again in \(seconds) s")
        }
        guard let principal else {
            if bearer != nil {
                service.throttle.failed(peer, "bearer token")
            } else {
                refused(request, context, "missing token")
            }
            throw HTTPError(.unauthorized, message: "a valid token is required (Authorization: Bearer <token>)")
        }
        guard allow?.contains(principal.role) ?? (principal.role != .scraper) else {
            refused(request, context, "\(principal.role.rawValue) \(HTTPService.escaped(principal.name)) is not allowed here")
            throw HTTPError(.forbidden, message: "not allowed for role \(principal.role.rawValue)")
        }
        service.vouch(for: context.peerHost)
        service.throttle.succeeded(peer, principal.throttleKey)
        var context = context
        context.principal = principal
        return try await next(request, context)
    }

    private func refused(_ request: Request, _ context: Context, _ why: String) {
        service.logger.warning("refused \(request.method) \(HTTPService.escaped(context.path)) from \(context.remote): \(why)", metadata: ["peer": .string(context.remote)])
    }
}

extension RouterMethods where Context == LabRequestContext {
    /// Routes `endpoint` (its method and template, from LabPlan's table): the body collected
    /// within `bodyLimit` (413 and the connection closed beyond it) and decoded as the
    /// endpoint's request type (400 when it is not one), the handler's answer sent as JSON.
    @discardableResult
    public func on<In: Decodable, Out, Answer: Encodable>(_ endpoint: Endpoint<In, Out>, bodyLimit: Int = HTTPService.defaultBodyLimit, status: HTTPResponse.Status = .ok,
                                                           _ handle: @escaping @Sendable (In, Request, LabRequestContext) async throws -> Answer) -> Self {
        on(endpoint, bodyLimit: bodyLimit) { (body: In, request: Request, context: LabRequestContext) -> Response in
            Response.json(try await handle(body, request, context), status: status)
        }
    }

    /// Routes `endpoint` to a handler that makes its own answer (a file, metrics' text).
    @discardableResult
    public func on<In: Decodable, Out>(_ endpoint: Endpoint<In, Out>, bodyLimit: Int = HTTPService.defaultBodyLimit,
                                       _ handle: @escaping @Sendable (In, Request, LabRequestContext) async throws -> Response) -> Self {
        on(RouterPath(endpoint.template), method: HTTPRequest.Method(endpoint.method) ?? .get) { request, context in
            let data = try await request.collectData(upTo: bodyLimit)
            return try await handle(try LabJSON.decode(In.self, from: data), request, context)
        }
    }
}

extension Request {
    /// The body, collected within `limit` bytes: beyond it (by Content-Length before reading,
    /// or as it arrives) 413, and the connection is closed without reading the rest.
    public func collectData(upTo limit: Int) async throws -> Data {
        let tooLarge = HTTPError(.contentTooLarge, headers: [.connection: "close"], message: "the body is larger than \(limit) bytes")
        if let length = headers[.contentLength].flatMap({ Int($0) }), length > limit { throw tooLarge }
        var request = self
        do {
            var buffer = try await request.collectBody(upTo: limit)
            return buffer.readData(length: buffer.readableBytes) ?? Data()
        } catch is NIOTooManyBytesError {
            throw tooLarge
        } catch let e as HTTPError where e.status == .contentTooLarge {
            throw tooLarge
        } catch {
            throw HTTPError(.badRequest, headers: [.connection: "close"], message: "the body did not arrive whole: \(HTTPService.escaped("\(error)"))")
        }
    }
}

extension HTTPService {
    /// The status and message an error thrown by a handler is answered with: a `LabRefusal` by
    /// its kind's status, Hummingbird's `HTTPError` by its own; nil for anything else (500, and
    /// a log line).
    public static func refusal(_ error: any Error) -> (status: HTTPResponse.Status, message: String)? {
        switch error {
        case let e as LabRefusal: return (HTTPResponse.Status(code: e.kind.status), e.message)
        case let e as HTTPError: return (e.status, e.body ?? e.status.reasonPhrase)
        case let e as Refusal: return (e.status, e.message)
        default: return nil
        }
    }

    /// The peer as log lines write it (`host:port`), and its numeric address.
    static func remote(of channel: any Channel) -> (text: String, address: String?) {
        guard let a = channel.remoteAddress else { return ("unknown", nil) }
        let ip = a.ipAddress
        guard let ip, let port = a.port else { return (ip ?? "unknown", ip) }
        return (a.protocol == .inet6 ? "[\(ip)]:\(port)" : "\(ip):\(port)", ip)
    }

    /// Hummingbird's `Application` serving the routes on `host:port` (a name, an IPv4 or IPv6
    /// literal, or a wildcard; port 0: any free port), each connection through `LabHTTPChannel`
    /// (with `tls`, every connection is TLS, the handshake within the first head's deadline): a
    /// `Service` for the process's ServiceGroup. `onListening` gets the bound port once it
    /// listens, before the first connection is served.
    public func server(host: String, port: UInt16, tls: TLSContext? = nil,
                       onListening: @escaping @Sendable (UInt16) async -> Void = { _ in }) throws -> Server {
        let ssl = tls?.nio
        let gate = ConnectionGate(total: limits.maxConnections, perAddress: limits.maxConnectionsPerAddress, reserved: limits.reservedForKnown)
        var hbLogger = logger
        if hbLogger.logLevel < .warning { hbLogger.logLevel = .warning }
        let limits = self.limits
        let serviceLogger = logger
        let builder = HTTPServerBuilder { respond in
            LabHTTPChannel(responder: respond, limits: limits, tls: ssl, gate: gate, serviceLogger: serviceLogger)
        }
        // The address as every listener of the product reads it (a wildcard, a literal, a name's
        // first address), given to Hummingbird as a numeric host.
        let address: String
        do {
            guard let first = try Listener.addresses(host: host, port: port).first else {
                throw NetError(.resolve, "cannot resolve \(host): no address")
            }
            address = first.host
        } catch let e as NetError {
            throw ServiceError("\(name): \(e.message)")
        }
        running.withLock { $0.server = (gate, nil, nil); $0.servingTLS = tls != nil }
        let app = Application(responder: responder(), server: builder,
                              configuration: .init(address: .hostname(address, port: Int(port)), serverName: nil, backlog: 1024, reuseAddress: true),
                              onServerRunning: { [self] channel in
                                  running.withLock { if $0.server?.gate === gate { $0.server?.listener = channel } }
                                  await onListening(UInt16(channel.localAddress?.port ?? 0))
                              },
                              logger: hbLogger)
        return Server(app: app, failure: "\(name): cannot listen on \(HostPort(host: host, port: port))")
    }

    /// The HTTP server of a service, as a `Service`: Hummingbird's `Application`, its failure to
    /// listen named (`<service>: cannot listen on host:port: <why>`).
    public struct Server: Service {
        let app: any Service
        let failure: String

        public func run() async throws {
            do { try await app.run() } catch {
                throw ServiceError("\(failure): \(HTTPService.describe(error))")
            }
        }
    }

    static func describe(_ error: Error) -> String {
        if let e = error as? IOError { return String(cString: strerror(e.errnoCode)) }
        return "\(error)"
    }
}

/// Why a service could not start, or a credential could not be loaded.
public struct ServiceError: Error, CustomStringConvertible, Sendable {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
