import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import LabNet
import Logging
import NIOCore
import NIOSSL
import ServiceLifecycle
import Synchronization

/// Hummingbird's request (inside `HTTPService`, `Request` is the handlers' own).
typealias HBRequest = HummingbirdCore.Request

/// What a request carries through the middleware to its route: Hummingbird's storage, the
/// channel it came on, and who sent it.
struct LabRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    let channel: any Channel
    var principal: HTTPService.Principal?
    var segments: [String] = []
    var query: [String: String] = [:]

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }
}

/// Authentication before routing: without a valid credential nobody learns which routes exist
/// (an unknown route is 401 too, never 404); then the route's existence and the caller's role.
/// An address whose credential is valid is vouched for at the gate.
struct AuthenticationMiddleware: RouterMiddleware {
    typealias Context = LabRequestContext
    let service: HTTPService

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response = try await admit(request, context: context, next: next)
        if let hsts = service.strictTransportSecurity { response.headers[.strictTransportSecurity] = hsts }
        return response
    }

    private func admit(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var context = context
        let remote = HTTPService.remote(of: context.channel)
        let method = request.method.rawValue
        do {
            (context.segments, context.query) = try RequestHead.decodeTarget(request.uri.description, method: method)
        } catch let r as Refusal {
            return HTTPService.answer(.error(r.status, r.message), head: false)
        }
        let peer = remote.address ?? remote.text
        let authorization = request.headers[.authorization]
        // An address that guessed wrong too often waits: only a credential that succeeded from it
        // lately is taken meanwhile (AuthThrottle).
        if service.authenticates, let authorization, let wait = service.throttle.retryAfter(peer) {
            let bearer = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst(7)) : ""
            let known = service.authenticate?(bearer).map { service.throttle.isKnown(peer, $0.throttleKey) } ?? false
            if !known {
                var r = LabHTTP.HTTPResponse.error(HTTPStatusCode.tooManyRequests, "too many wrong credentials from this address: try again in \(AuthThrottle.retryAfterHeader(wait)) s")
                r.headers["Retry-After"] = AuthThrottle.retryAfterHeader(wait)
                return HTTPService.answer(r, head: request.method == .head)
            }
        }
        switch service.admit(method: method, segments: context.segments, authorization: authorization) {
        case .refuse(let status, let message, let logged):
            if status == .unauthorized, let bearer = authorization, bearer.hasPrefix("Bearer ") {
                // A wrong credential: counted, and logged once per interval with the count.
                service.throttle.failed(peer, "bearer token")
            } else if let logged {
                service.logger.warning("refused \(method) \(HTTPService.escaped("/" + context.segments.joined(separator: "/"))) from \(remote.text): \(logged)",
                                       metadata: ["peer": .string(remote.text)])
            }
            return HTTPService.answer(.error(status, message), head: request.method == .head)
        case .route(_, _, let principal):
            // A valid credential vouches for its address at the gate; with authentication off
            // (loopback only) every caller is as known as any other.
            if principal != nil || !service.authenticates { service.vouch(for: remote.address) }
            if let principal { service.throttle.succeeded(peer, principal.throttleKey) }
            context.principal = principal
            return try await next(request, context)
        }
    }
}

extension HTTPService {
    /// The peer as log lines write it (`host:port`), and its numeric address.
    static func remote(of channel: any Channel) -> (text: String, address: String?) {
        guard let a = channel.remoteAddress else { return ("unknown", nil) }
        let ip = a.ipAddress
        guard let ip, let port = a.port else { return (ip ?? "unknown", ip) }
        return (a.protocol == .inet6 ? "[\(ip)]:\(port)" : "\(ip):\(port)", ip)
    }

    /// Runs Hummingbird's server with this service's routes behind `AuthenticationMiddleware`,
    /// each connection through `LabHTTPChannel`; returns once it listens.
    func serve(host: String, port: UInt16, tls: NIOSSLContext?, gate: ConnectionGate) async throws -> ((ServiceGroup, Task<Void, Never>, any Channel), UInt16) {
        let router = Router(context: LabRequestContext.self, options: .autoGenerateHeadEndpoints)
        let table = routes.withLock { $0 }
        var seen = Set<String>()
        for route in table {
            let key = route.method + " " + route.parts.map { $0.hasPrefix(":") ? ":" : $0 }.joined(separator: "/")
            guard seen.insert(key).inserted, let method = HTTPRequest.Method(route.method) else { continue }
            let path = RouterPath("/" + route.parts.joined(separator: "/"))
            router.on(path, method: method) { [self] request, context in
                await self.serve(route, request, context)
            }
        }
        let responder = MiddlewareFixedResponder(middleware: AuthenticationMiddleware(service: self), next: router.buildResponder())
        var hbLogger = logger
        if hbLogger.logLevel < .warning { hbLogger.logLevel = .warning }
        let limits = self.limits
        let serviceLogger = logger
        let builder = HTTPServerBuilder { respond in
            LabHTTPChannel(responder: respond, limits: limits, tls: tls, gate: gate, serviceLogger: serviceLogger)
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
            throw HTTPError(.internalServerError, "\(name): \(e.message)")
        }
        let listening = Listening()
        let app = Application(responder: responder, server: builder,
                              configuration: .init(address: .hostname(address, port: Int(port)), serverName: nil, backlog: 1024, reuseAddress: true),
                              onServerRunning: { channel in listening.succeed(UInt16(channel.localAddress?.port ?? 0), channel) },
                              logger: hbLogger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: hbLogger))
        let name = self.name
        let named = HostPort(host: host, port: port)
        let task = Task {
            do {
                try await group.run()
                listening.fail(HTTPError(.internalServerError, "\(name): the server ended before it listened"))
            } catch {
                listening.fail(HTTPError(.internalServerError, "\(name): cannot listen on \(named): \(Self.describe(error))"))
            }
        }
        do {
            let (bound, channel) = try await listening.wait()
            return ((group, task, channel), bound)
        } catch {
            task.cancel()
            throw error
        }
    }

    static func describe(_ error: Error) -> String {
        if let e = error as? IOError { return String(cString: strerror(e.errnoCode)) }
        return "\(error)"
    }

    /// One route's request: its role, its body within the route's limit, the handler, and the
    /// answer as Hummingbird sends it.
    func serve(_ route: Route, _ request: HBRequest, _ context: LabRequestContext) async -> Response {
        let isHead = request.method == .head
        let remote = Self.remote(of: context.channel)
        if let principal = context.principal, authenticates, !route.isPublic,
           !(route.allow?.contains(principal.role) ?? (principal.role != .scraper)) {
            logger.warning("refused \(request.method.rawValue) \(Self.escaped("/" + context.segments.joined(separator: "/"))) from \(remote.text): \(principal.role.rawValue) \(Self.escaped(principal.name)) is not allowed here",
                           metadata: ["peer": .string(remote.text)])
            return Self.answer(.error(.forbidden, "not allowed for role \(principal.role.rawValue)"), head: isHead)
        }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > route.bodyLimit {
            return Self.closing(.error(.payloadTooLarge, "the body is larger than \(route.bodyLimit) bytes"))
        }
        // The connection's HeadRules counts the body against this limit as it arrives.
        do {
            try await context.channel.pipeline.handler(type: HeadRules.self).map { $0.limitBody(route.bodyLimit) }.get()
        } catch {
            return Self.closing(.error(.badRequest, "the connection has gone"))
        }
        var body = Data()
        do {
            var buffer = try await request.body.collect(upTo: route.bodyLimit)
            body = buffer.readData(length: buffer.readableBytes) ?? Data()
        } catch let e as Hummingbird.HTTPError where e.status == .contentTooLarge {
            return Self.closing(.error(.payloadTooLarge, "the body is larger than \(route.bodyLimit) bytes"))
        } catch {
            return Self.closing(.error(.badRequest, "the body did not arrive whole: \(Self.escaped("\(error)"))"))
        }
        var params = [String: String]()
        for (p, v) in zip(route.parts, context.segments) where p.hasPrefix(":") { params[String(p.dropFirst())] = v }
        var headers = [String: String]()
        for field in request.headers {
            let name = field.name.canonicalName
            headers[name] = headers[name].map { $0 + ", " + field.value } ?? field.value
        }
        if let authority = request.head.authority { headers["host"] = authority }
        let ours = Request(method: request.method.rawValue, path: "/" + context.segments.joined(separator: "/"), parameters: params, query: context.query,
                           headers: headers, body: body, remote: remote.text, peerHost: remote.address, principal: context.principal)
        return Self.answer(await respond(route, ours), head: isHead, method: request.method.rawValue)
    }

    var authenticates: Bool { authenticate != nil }

    /// An answer that ends its connection (the rest of the request is not read).
    static func closing(_ response: HTTPResponse) -> Response {
        var r = response
        r.headers["Connection"] = "close"
        return answer(r, head: false)
    }

    /// Our answer as Hummingbird's: bytes, a file read 256 KiB at a time, or a stream sent
    /// chunked (at most `maxStreams` at once, each at most `streamSeconds`, then the connection
    /// ends).
    static func answer(_ response: HTTPResponse, head: Bool, method: String = "GET") -> Response {
        var fields = HTTPFields()
        for (name, value) in response.headers {
            if let n = HTTPField.Name(name) { fields.append(HTTPField(name: n, value: value)) }
        }
        let status = HTTPTypes.HTTPResponse.Status(code: response.status.code, reasonPhrase: response.status.phrase)
        switch response.body {
        case .data(let data):
            return Response(status: status, headers: fields, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
        case .file(let file, let range):
            return Response(status: status, headers: fields, body: ResponseBody(contentLength: range.count) { writer in
                var offset = range.lowerBound
                var buffer = ByteBufferAllocator().buffer(capacity: 256 * 1024)
                while offset < range.upperBound {
                    buffer.clear()
                    let want = min(256 * 1024, range.upperBound - offset)
                    let n = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: want) { raw in
                        max(0, file.read(into: raw, count: want, at: offset))
                    }
                    guard n > 0 else { throw HTTPError(.internalServerError, "the file ended at \(offset) of \(range.upperBound) bytes") }
                    offset += n
                    try await writer.write(buffer)
                }
                try await writer.finish(nil)
            })
        case .stream(let produce):
            if head { return Response(status: status, headers: fields) }
            guard streams.enter(limit: maxStreams) else {
                return closing(.error(.serviceUnavailable, "too many event streams open; try again later"))
            }
            fields[.connection] = "close"
            return Response(status: status, headers: fields, body: ResponseBody { writer in
                defer { streams.leave() }
                let deadline = monotonicNow() + streamSeconds
                do {
                    try await produce { data in
                        guard !data.isEmpty else { return }
                        guard monotonicNow() < deadline else { throw HTTPError(.requestTimeout, "the stream's time is up") }
                        try await writer.write(ByteBuffer(bytes: data))
                    }
                } catch {}
                do { try await writer.finish(nil) } catch {}
            })
        }
    }

    static let maxStreams = 32
    static let streamSeconds = 300.0
    static let streams = StreamCount()

    final class StreamCount: Sendable {
        private let open = Mutex(0)
        func enter(limit: Int) -> Bool { open.withLock { open in guard open < limit else { return false }; open += 1; return true } }
        func leave() { open.withLock { $0 -= 1 } }
    }
}

/// A middleware in front of a whole responder: it runs before routing.
struct MiddlewareFixedResponder<Next: HTTPResponder>: HTTPResponder where Next.Context == LabRequestContext {
    typealias Context = LabRequestContext
    let middleware: AuthenticationMiddleware
    let next: Next

    func respond(to request: Request, context: Context) async throws -> Response {
        try await middleware.handle(request, context: context) { request, context in
            try await next.respond(to: request, context: context)
        }
    }
}

/// The bound port and the listening channel once the server listens, or why it could not.
final class Listening: Sendable {
    typealias Bound = (UInt16, any Channel)
    /// The outcome once known, and the waiter before it is, under one lock.
    private struct State {
        var result: Result<Bound, Error>?
        var waiter: CheckedContinuation<Bound, Error>?
    }
    private let state = Mutex(State())

    func succeed(_ port: UInt16, _ channel: any Channel) { settle(.success((port, channel))) }
    func fail(_ error: Error) { settle(.failure(error)) }

    private func settle(_ r: Result<Bound, Error>) {
        let w: CheckedContinuation<Bound, Error>? = state.withLock { s in
            guard s.result == nil else { return nil }
            s.result = r
            defer { s.waiter = nil }
            return s.waiter
        }
        w?.resume(with: r)
    }

    func wait() async throws -> Bound {
        try await withCheckedThrowingContinuation { c in
            let r: Result<Bound, Error>? = state.withLock { s in
                if let result = s.result { return result }
                s.waiter = c
                return nil
            }
            if let r { c.resume(with: r) }
        }
    }
}
