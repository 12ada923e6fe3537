import Foundation
import FlyingFox
import FlyingSocks

/// A JSON HTTP service on FlyingFox: routes with `:parameters`, a shared bearer token required
/// on every route but `GET /health` (401 and a log line otherwise), and request bodies limited
/// in size (413). Used by the agent, the coordinator and the air.
public final class HTTPService: @unchecked Sendable {
    public struct Request: Sendable {
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
        let bodyLimit: Int
    }

    public let name: String
    private let token: String?
    private var routes: [Route] = []
    private let lock = NSLock()
    private var server: HTTPServer?
    private var task: Task<Void, Never>?
    public let log: @Sendable (String) -> Void
    public static let defaultBodyLimit = 1 << 20

    /// `token` nil disables authentication (tests of the auth itself use a token).
    public init(name: String, token: String?, log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) {
        self.name = name
        self.token = token
        self.log = log
        route("GET", "/health", public: true) { _ in .json(["status": "ok", "service": name]) }
    }

    /// Adds a route; `pattern` segments starting with `:` are parameters.
    public func route(_ method: String, _ pattern: String, public isPublic: Bool = false, bodyLimit: Int = HTTPService.defaultBodyLimit, _ handler: @escaping Handler) {
        lock.lock(); defer { lock.unlock() }
        routes.append(Route(method: method, parts: pattern.split(separator: "/").map(String.init), handler: handler, public_: isPublic, bodyLimit: bodyLimit))
    }

    /// Starts listening on `host:port` (port 0: any free port); returns the bound port.
    public func start(host: String = "127.0.0.1", port: UInt16) async throws -> UInt16 {
        let address = try sockaddr_in.inet(ip4: host, port: port)
        let server = HTTPServer(address: address, timeout: 60, pool: SharedSocketPool.shared, logger: .disabled)
        await server.appendRoute("*") { [self] request in await self.handle(request) }
        self.server = server
        task = Task { try? await server.run() }
        try await server.waitUntilListening(timeout: 10)
        guard case .ip4(_, let bound)? = await server.listeningAddress else { throw HTTPError(.internalServerError, "no listening address") }
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
                if p.hasPrefix(":") { params[String(p.dropFirst())] = v.removingPercentEncoding ?? v } else if p != v { ok = false; break }
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
        guard let (route, params) = match(method, path) else {
            return .error(.notFound, "no route \(method) \(path)")
        }
        var headers = [String: String]()
        for (k, v) in request.headers { headers[k.rawValue.lowercased()] = v }
        if !route.public_, let token {
            let given = headers["authorization"].flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
            guard let given, Self.constantTimeEqual(given, token) else {
                log("\(name): refused \(method) \(path) from \(remote): \(given == nil ? "missing" : "wrong") token")
                return .error(.unauthorized, "a valid token is required (Authorization: Bearer <token>)")
            }
        }
        if let length = headers["content-length"].flatMap(Int.init), length > route.bodyLimit {
            log("\(name): refused \(method) \(path) from \(remote): body of \(length) bytes over the \(route.bodyLimit)-byte limit")
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
            return try await route.handler(Request(method: method, path: path, parameters: params, query: query, headers: headers, body: body, remote: remote, peerHost: peerHost))
        } catch let e as HTTPError {
            return .error(e.status, e.message)
        } catch {
            log("\(name): \(method) \(path) failed: \(error)")
            return .error(.internalServerError, "\(error)")
        }
    }

    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
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
