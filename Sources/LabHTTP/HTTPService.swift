import Foundation
import FlyingFox
import FlyingSocks
import LabNet

/// A JSON HTTP service on FlyingFox: routes with `:parameters`, a shared bearer token required
/// on every route but `GET /health` (401 and a log line otherwise), and request bodies limited
/// in size (413). Used by the agent, the coordinator and the air.
public final class HTTPService: @unchecked Sendable {
    /// Who may call what: the lab's operator (herald-lab commands), the coordinator (calling an
    /// agent), an agent (calling the coordinator about itself).
    public enum Role: String, Sendable, Hashable { case operator_ = "operator", coordinator, agent }

    /// Who made a request, as its credential says.
    public struct Principal: Sendable, Equatable {
        public var role: Role
        public var name: String
        public init(role: Role, name: String) { self.role = role; self.name = name }
    }

    public typealias Authenticator = @Sendable (_ bearer: String) -> Principal?

    public struct Request: Sendable {
        public var principal: Principal?
        public var method: String
        public var path: String
        public var parameters: [String: String]
        public var query: [String: String]
        public var headers: [String: String]
        public var body: Data
        public var remote: String
        /// The numeric address the request came from (IPv4 or IPv6, no brackets), when known.
        public var peerHost: String?

        public func decode<T: Decodable>(_ type: T.Type) throws -> T {
            do { return try LabJSON.decoder.decode(T.self, from: body) } catch {
                throw HTTPError(.badRequest, "request body is not a valid \(T.self): \(LabJSON.describe(error))")
            }
        }
    }

    public typealias Handler = @Sendable (Request) async throws -> HTTPResponse

    private struct Route: Sendable {
        let method: String
        let parts: [String]
        let handler: Handler
        let public_: Bool
        let allow: Set<Role>?
        let bodyLimit: Int
    }

    public let name: String
    private let authenticate: Authenticator?
    private var routes: [Route] = []
    private let lock = NSLock()
    private var server: HTTPServer?
    private var task: Task<Void, Never>?
    public let log: @Sendable (String) -> Void
    public static let defaultBodyLimit = 1 << 20

    /// `token` nil disables authentication (tests of the auth itself use a token).
    public convenience init(name: String, token: String?, log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) {
        self.init(name: name, authenticate: token.map(HTTPService.sharedToken), log: log)
    }

    /// One shared token: its holder is the operator.
    public static func sharedToken(_ token: String) -> Authenticator {
        { given in constantTimeEqual(given, token) ? Principal(role: .operator_, name: "token") : nil }
    }

    /// `authenticate` maps a bearer credential to who holds it (nil: no authentication, for
    /// --insecure on loopback only).
    public init(name: String, authenticate: Authenticator?, log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) {
        self.name = name
        self.authenticate = authenticate
        self.log = log
        route("GET", "/health", public: true) { _ in .json(["status": "ok", "service": name]) }
    }

    /// Adds a route; `pattern` segments starting with `:` are parameters.
    /// `allow`: the roles that may call it (nil: any authenticated caller).
    public func route(_ method: String, _ pattern: String, public isPublic: Bool = false, allow: Set<Role>? = nil, bodyLimit: Int = HTTPService.defaultBodyLimit, _ handler: @escaping Handler) {
        lock.lock(); defer { lock.unlock() }
        routes.append(Route(method: method, parts: pattern.split(separator: "/").map(String.init), handler: handler, public_: isPublic, allow: allow, bodyLimit: bodyLimit))
    }

    /// Starts listening on `host:port` (a name, an IPv4 or IPv6 literal, or a wildcard as
    /// `Listener` takes them; port 0: any free port); returns the bound port.
    public func start(host: String = "127.0.0.1", port: UInt16, tls: TLSContext? = nil) async throws -> UInt16 {
        if tls != nil { throw HTTPError(.internalServerError, "\(name): TLS is not available on this server yet") }
        let address: NetAddress
        do {
            address = try Listener.addresses(host: host, port: port)[0]
            // FlyingFox reports a failed bind only by never listening; binding once here first
            // says at once why it cannot (address in use, not an address of this machine).
            close(try Listener.listen(on: address, naming: HostPort(host: host, port: port)).fd)
        } catch let e as NetError {
            throw HTTPError(.internalServerError, "\(name): \(e.message)")
        }
        // FlyingFox binds the address it is given: a sockaddr_in or a sockaddr_in6 (an IPv6 socket
        // on Linux is dual-stack unless net.ipv6.bindv6only says otherwise).
        let server: HTTPServer
        if let v6 = address.ipv6 {
            server = HTTPServer(address: v6, timeout: 60, pool: SharedSocketPool.shared, logger: .disabled)
        } else {
            server = HTTPServer(address: address.ipv4!, timeout: 60, pool: SharedSocketPool.shared, logger: .disabled)
        }
        await server.appendRoute("*") { [self] request in await self.handle(request) }
        self.server = server
        task = Task { try? await server.run() }
        do { try await server.waitUntilListening(timeout: 10) } catch {
            throw HTTPError(.internalServerError, "\(name): cannot listen on \(HostPort(host: host, port: port)) (\(address.host))")
        }
        let bound: UInt16
        switch await server.listeningAddress {
        case .ip4(_, let p)?, .ip6(_, let p)?: bound = p
        default: throw HTTPError(.internalServerError, "no listening address")
        }
        // TCP_NODELAY on every connection FlyingFox accepts. FlyingFox 0.27 makes, binds and
        // listens on its socket inside HTTPServer.run() and hands it to nobody (no initialiser
        // takes a Socket, `state` is private, accepted sockets get no options), so the listening
        // socket is found by what it is bound to and the option set on it: Linux copies it to
        // every connection accepted afterwards. Replies are written head then body; with Nagle a
        // body waits for the head's ACK, a round trip (a clock probe's offset skews by half).
        // With port 0 nobody knows the port before this returns; with a fixed port only a
        // connection completed in the microseconds since listen() could miss it.
        for fd in Sockets.listeningSockets(family: address.family, port: bound) { Sockets.setNoDelay(fd) }
        return bound
    }

    public func stop() async {
        if let server { await server.stop(timeout: 1) }
        task?.cancel()
    }

    private func match(_ method: String, _ path: String) -> (Route, [String: String])? {
        let parts = path.split(separator: "/").map(String.init)
        lock.lock(); let rs = routes; lock.unlock()
        for r in rs where r.parts.count == parts.count {
            var params = [String: String]()
            var ok = true
            for (p, v) in zip(r.parts, parts) {
                // FlyingFox has decoded the path once already: parameters are taken as they are.
                if p.hasPrefix(":") { params[String(p.dropFirst())] = v } else if p != v { ok = false; break }
            }
            guard ok else { continue }
            if r.method == method { return (r, params) }
        }
        return nil
    }

    private func handle(_ request: HTTPRequest) async -> HTTPResponse {
        let method = request.method.rawValue
        let path = request.path
        let remote = request.remoteAddress.map { "\($0)" } ?? "?"
        let peerHost: String?
        switch request.remoteAddress {
        case .ip4(let h, _)?, .ip6(let h, _)?: peerHost = h
        default: peerHost = nil
        }
        var headers = [String: String]()
        for (k, v) in request.headers { headers[k.rawValue.lowercased()] = v }
        let matched = match(method, path)
        // Authentication before routing: without the token, nobody learns which routes exist.
        var principal: Principal?
        if matched?.0.public_ != true, let authenticate {
            let given = headers["authorization"].flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
            principal = given.flatMap(authenticate)
            guard principal != nil else {
                log("\(name): refused \(method) \(Self.escaped(path)) from \(remote): \(given == nil ? "missing" : "wrong") credential")
                return .error(.unauthorized, "a valid credential is required (Authorization: Bearer <token>)")
            }
        }
        guard let (route, params) = matched else {
            return .error(.notFound, "no route \(method) \(Self.escaped(path))")
        }
        if let principal, let allow = route.allow, !allow.contains(principal.role) {
            log("\(name): refused \(method) \(Self.escaped(path)) from \(remote): \(principal.role.rawValue) \(Self.escaped(principal.name)) may not call it")
            return .error(.forbidden, "\(principal.role.rawValue) \(principal.name) may not call \(method) \(Self.escaped(path))")
        }
        if let length = headers["content-length"].flatMap(Int.init), length > route.bodyLimit {
            log("\(name): refused \(method) \(Self.escaped(path)) from \(remote): body of \(length) bytes over the \(route.bodyLimit)-byte limit")
            return .error(.payloadTooLarge, "request body over \(route.bodyLimit) bytes")
        }
        let body: Data
        do {
            body = try await request.bodyData
        } catch {
            return .error(.badRequest, "cannot read the request body")
        }
        if body.count > route.bodyLimit { return .error(.payloadTooLarge, "request body over \(route.bodyLimit) bytes") }
        var query = [String: String]()
        for item in request.query { query[item.name] = item.value }
        do {
            return try await route.handler(Request(principal: principal, method: method, path: path, parameters: params, query: query, headers: headers, body: body, remote: remote, peerHost: peerHost))
        } catch let e as HTTPError {
            return .error(e.status, e.message)
        } catch {
            log("\(name): \(method) \(Self.escaped(path)) failed: \(Self.escaped("\(error)"))")
            return .error(.internalServerError, "\(error)")
        }
    }

    /// Text from the network as it may go into a log line: control characters, quotes and
    /// backslashes escaped (no forged lines), at most 200 characters.
    public static func escaped(_ text: String) -> String {
        var out = ""
        for u in text.unicodeScalars.prefix(200) {
            switch u {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case _ where u.value < 0x20 || u.value == 0x7F || (0x80...0x9F).contains(u.value) || u.value == 0x2028 || u.value == 0x2029:
                out += String(format: "\\x%02X", u.value & 0xFF)
            default: out.unicodeScalars.append(u)
            }
        }
        if text.unicodeScalars.count > 200 { out += "..." }
        return out
    }

    public static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var diff: UInt8 = 0
        for i in 0..<x.count { diff |= x[i] ^ y[i] }
        return diff == 0
    }
}

/// An error a handler throws to answer with a status and a message.
public struct HTTPError: Error, CustomStringConvertible, Sendable {
    public var status: HTTPStatusCode
    public var message: String
    public init(_ status: HTTPStatusCode, _ message: String) { self.status = status; self.message = message }
    public var description: String { "\(status.code) \(message)" }
}

extension HTTPResponse {
    /// A JSON body.
    public static func json<T: Encodable>(_ value: T, status: HTTPStatusCode = .ok) -> HTTPResponse {
        let data = (try? LabJSON.encoder.encode(value)) ?? Data("{}".utf8)
        return HTTPResponse(statusCode: status, headers: [.contentType: "application/json"], body: data)
    }

    /// `{"error": message}` with a status.
    public static func error(_ status: HTTPStatusCode, _ message: String) -> HTTPResponse {
        json(["error": message], status: status)
    }
}

/// JSON as every HeraldLab endpoint speaks it (times are numbers: seconds since 1970).
public enum LabJSON {
    public static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return e
    }()
    public static let decoder = JSONDecoder()

    static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let ctx): return "missing field \((ctx.codingPath + [key]).map(\.stringValue).joined(separator: "."))"
        case DecodingError.typeMismatch(_, let ctx), DecodingError.valueNotFound(_, let ctx), DecodingError.dataCorrupted(let ctx):
            return "\(ctx.codingPath.map(\.stringValue).joined(separator: ".")): \(ctx.debugDescription)"
        default: return "\(error)"
        }
    }
}

/// The shared token: `HERALDLAB_TOKEN`, or the first line of a token file.
public enum LabToken {
    public static func load(file: String?) throws -> String? {
        if let file {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                throw HTTPError(.internalServerError, "cannot read the token file \(file)")
            }
            let token = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
            guard token.count >= 16 else { throw HTTPError(.internalServerError, "the token in \(file) is shorter than 16 characters") }
            return token
        }
        if let env = ProcessInfo.processInfo.environment["HERALDLAB_TOKEN"], !env.isEmpty { return env }
        return nil
    }

    /// A new random token (hex, 32 bytes).
    public static func generate() -> String {
        var g = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }
}
