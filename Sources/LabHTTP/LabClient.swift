import Foundation
import LabNet

/// A small JSON HTTP client with the bearer token, over `HTTPExchange` (one connection from
/// LabNet's `Dialer` per request, on a thread of its own while it runs, threads reused; not
/// URLSession: see `HTTPExchange`).
public final class LabClient: @unchecked Sendable {
    public let base: URL
    public let token: String?

    public struct Failure: Error, CustomStringConvertible, Sendable {
        public var status: Int?
        public var message: String
        public var description: String { status.map { "HTTP \($0): \(message)" } ?? message }
        public init(status: Int?, message: String) { self.status = status; self.message = message }
    }

    private let timeout: TimeInterval

    public init(base: URL, token: String?, timeout: TimeInterval = 10) {
        self.base = base
        self.token = token
        self.timeout = timeout
    }

    /// Sends a request; `timeout` bounds the connect and every wait for the answer's bytes.
    /// Returns the status, the body and the headers (names in lower case).
    public func request(_ method: String, _ path: String, body: Data? = nil, headers: [String: String] = [:], timeout: TimeInterval? = nil) async throws -> (Int, Data, [String: String]) {
        guard let url = URL(string: path, relativeTo: base) else { throw Failure(status: nil, message: "bad path \(path)") }
        var all = headers
        if let token { all["Authorization"] = "Bearer \(token)" }
        if body != nil, !all.keys.contains(where: { $0.lowercased() == "content-type" }) { all["Content-Type"] = "application/json" }
        let wait = timeout ?? self.timeout
        let fields = all
        let answer: HTTPExchange.Answer
        do {
            // A thread of its own for each request in flight: the socket calls block, and the
            // cooperative pool has only as many threads as cores. Threads are reused (BlockingThreads).
            answer = try await withCheckedThrowingContinuation { c in
                BlockingThreads.shared.run {
                    c.resume(with: Result { try HTTPExchange.perform(method, url, headers: fields, body: body, timeout: wait) })
                }
            }
        } catch let e as NetError {
            throw Failure(status: nil, message: "\(method) \(url.absoluteString): \(e.message)")
        }
        return (answer.status, answer.body, answer.headers)
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
