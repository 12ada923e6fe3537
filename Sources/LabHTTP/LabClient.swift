import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A small JSON HTTP client over URLSession (libcurl on Linux), with the bearer token.
public final class LabClient: @unchecked Sendable {
    public let base: URL
    public let token: String?
    private let session: URLSession

    public struct Failure: Error, CustomStringConvertible, Sendable {
        public var status: Int?
        public var message: String
        public var description: String { status.map { "HTTP \($0): \(message)" } ?? message }
        public init(status: Int?, message: String) { self.status = status; self.message = message }
    }

    /// One session for the whole process: on Linux every URLSession holds threads of its own, and
    /// hundreds of them (a coordinator arming 200 agents) exhaust the dispatch thread pool.
    private static let shared: URLSession = {
        let config = URLSessionConfiguration.ephemeral
        config.timeoutIntervalForResource = 600
        config.httpMaximumConnectionsPerHost = 512
        return URLSession(configuration: config)
    }()
    private let timeout: TimeInterval

    public init(base: URL, token: String?, timeout: TimeInterval = 10) {
        self.base = base
        self.token = token
        self.timeout = timeout
        session = Self.shared
    }

    public func request(_ method: String, _ path: String, body: Data? = nil, headers: [String: String] = [:], timeout: TimeInterval? = nil) async throws -> (Int, Data, [String: String]) {
        guard let url = URL(string: path, relativeTo: base) else { throw Failure(status: nil, message: "bad path \(path)") }
        var r = URLRequest(url: url)
        r.httpMethod = method
        r.timeoutInterval = timeout ?? self.timeout
        if let token { r.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let body {
            r.httpBody = body
            r.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        for (k, v) in headers { r.setValue(v, forHTTPHeaderField: k) }
        let (data, response): (Data, URLResponse)
        do {
            (data, response) = try await session.data(for: r)
        } catch {
            throw Failure(status: nil, message: "\(method) \(url.absoluteString): \(error.localizedDescription)")
        }
        let http = response as? HTTPURLResponse
        var out = [String: String]()
        for (k, v) in http?.allHeaderFields ?? [:] { out["\(k)".lowercased()] = "\(v)" }
        return (http?.statusCode ?? 0, data, out)
    }

    /// Sends JSON, expects 2xx and a JSON answer.
    public func call<T: Decodable>(_ method: String, _ path: String, _ body: (some Encodable)? = Optional<Int>.none, as: T.Type = T.self, timeout: TimeInterval? = nil) async throws -> T {
        let data = try body.map { try LabJSON.encoder.encode($0) }
        let (status, answer, _) = try await request(method, path, body: data, timeout: timeout)
        guard (200..<300).contains(status) else {
            let message = (try? JSONDecoder().decode([String: String].self, from: answer))?["error"] ?? String(decoding: answer.prefix(300), as: UTF8.self)
            throw Failure(status: status, message: message)
        }
        do { return try LabJSON.decoder.decode(T.self, from: answer) } catch {
            throw Failure(status: status, message: "unexpected answer to \(method) \(path): \(LabJSON.describe(error))")
        }
    }
}

/// An empty JSON object, for calls without a body or an answer of interest.
public struct Empty: Codable, Sendable { public init() {} }
