import AsyncHTTPClient
import Foundation
import HeraldCore
import LabNet
#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// A small JSON HTTP client with the bearer token, over AsyncHTTPClient: one `HTTPClient` for the
/// whole process (its connections pooled per host, on NIO's shared event loops; no thread per
/// request), https checked against the lab CA only (`LabTrust`).
public final class LabClient: Sendable {
    public let base: URL
    public let token: String?

    public struct Failure: Error, CustomStringConvertible, Sendable {
        public var status: Int?
        public var message: String
        public var description: String { status.map { "HTTP \($0): \(message)" } ?? message }
        public init(status: Int?, message: String) { self.status = status; self.message = message }
    }

    /// The largest answer read whole (a JSON answer is far smaller; a peer that sends more is
    /// cut off, not buffered).
    public static let maxAnswerBytes = 64 << 20

    private let timeout: TimeInterval

    public init(base: URL, token: String?, timeout: TimeInterval = 10) {
        self.base = base
        self.token = token
        self.timeout = timeout
    }

    /// Sends a request; `timeout` bounds the whole exchange, connect to the answer's last byte.
    /// Returns the status, the body and the headers (names in lower case; a repeated field's
    /// values joined with ", ").
    public func request(_ method: String, _ path: String, body: Data? = nil, headers: [String: String] = [:], timeout: TimeInterval? = nil) async throws -> (Int, Data, [String: String]) {
        guard let url = URL(string: path, relativeTo: base)?.absoluteURL else { throw Failure(status: nil, message: "bad path \(path)") }
        let wait = timeout ?? self.timeout
        guard wait.isFinite, wait > 0, wait <= 86_400 else { throw Failure(status: nil, message: "\(method) \(url.absoluteString): timeout \(wait) s is not 0 to 86400 s") }
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = HTTPMethod(rawValue: method)
        do { request.tlsConfiguration = try LabHTTPClient.tls(for: url) } catch {
            throw Failure(status: nil, message: "\(method) \(url.absoluteString): \(error)")
        }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) where !["host", "connection", "content-length"].contains(name.lowercased()) {
            request.headers.add(name: name, value: value)
        }
        if let token { request.headers.replaceOrAdd(name: "Authorization", value: "Bearer \(token)") }
        if let body {
            if !request.headers.contains(name: "Content-Type") { request.headers.add(name: "Content-Type", value: "application/json") }
            request.body = .bytes(ByteBuffer(bytes: body))
        } else if ["POST", "PUT", "PATCH"].contains(method) {
            request.body = .bytes(ByteBuffer())
        }
        let deadline = NIODeadline.now() + .nanoseconds(Saturating.nanoseconds(wait))
        let prepared = request
        do {
            return try await LabHTTPClient.within(deadline, seconds: wait) {
                let response = try await LabHTTPClient.shared.execute(prepared, deadline: deadline)
                var fields: [String: String] = [:]
                for (name, value) in response.headers {
                    let key = name.lowercased()
                    fields[key] = fields[key].map { "\($0), \(value)" } ?? value
                }
                let bytes = try await response.body.collect(upTo: Self.maxAnswerBytes)
                return (Int(response.status.code), Data(bytes.readableBytesView), fields)
            }
        } catch let e as Failure {
            throw Failure(status: nil, message: "\(method) \(url.absoluteString): \(e.message)")
        } catch {
            throw Failure(status: nil, message: "\(method) \(url.absoluteString): \(LabHTTPClient.describe(error, url: url, timeout: wait))")
        }
    }

    /// Sends JSON, expects 2xx and a JSON answer.
    public func call<T: Decodable>(_ method: String, _ path: String, _ body: (some Encodable)? = Optional<Int>.none, as: T.Type = T.self, timeout: TimeInterval? = nil) async throws -> T {
        try await timedCall(method, path, body, as: T.self, timeout: timeout).answer
    }

    /// `call`, with this host's wall clock when the request was handed to the client (its body
    /// already encoded) and when the whole answer was in: a heartbeat's clock stamps.
    public func timedCall<T: Decodable>(_ method: String, _ path: String, _ body: (some Encodable)? = Optional<Int>.none, as: T.Type = T.self, timeout: TimeInterval? = nil) async throws -> (answer: T, sent: Double, answered: Double) {
        let data = try body.map { try LabJSON.encoder.encode($0) }
        let sent = Date().timeIntervalSince1970
        let (status, answer, _) = try await request(method, path, body: data, timeout: timeout)
        let answered = Date().timeIntervalSince1970
        guard (200..<300).contains(status) else {
            let message = (try? JSONDecoder().decode([String: String].self, from: answer))?["error"] ?? String(decoding: answer.prefix(300), as: UTF8.self)
            throw Failure(status: status, message: message)
        }
        do { return (try LabJSON.decoder.decode(T.self, from: answer), sent, answered) } catch {
            throw Failure(status: status, message: "unexpected answer to \(method) \(path): \(LabJSON.describe(error))")
        }
    }
}

/// An empty JSON object, for calls without a body or an answer of interest.
public struct Empty: Codable, Sendable { public init() {} }

/// The process's one AsyncHTTPClient and the TLS it speaks.
enum LabHTTPClient {
    /// Never shut down: it lives as long as the process. Redirects are not followed (a bearer
    /// credential goes only to the host it was meant for), HTTP/1.1 only, nothing decompressed, a
    /// refused connect fails at once (the caller's backoff decides when to try again), and idle
    /// connections are dropped after 5 s, before a HeraldLab server's 10 s idle close can race a
    /// request sent on them.
    static let shared: HTTPClient = {
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(10), read: .seconds(120)),
            connectionPool: .init(idleTimeout: .seconds(5)),
            decompression: .disabled)
        configuration.httpVersion = .http1Only
        configuration.connectionPool.retryConnectionEstablishment = false
        // Socket reads of up to 1 MiB where the data is there (NIO's default stops at 64 KiB): a
        // download's body then reaches FileDownload in far fewer parts, each a pass through the
        // HTTP decoder and AsyncHTTPClient's state machines. Small answers keep small buffers
        // (the allocator grows only when reads fill it).
        configuration.http1_1ConnectionDebugInitializer = { channel in
            channel.setOption(ChannelOptions.recvAllocator, value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 2048, maximum: 1 << 20))
        }
        return HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }()

    /// The TLS configuration last made, and the CA file it was made from.
    private static let cached = Mutex<(file: String, configuration: TLSConfiguration)?>(nil)

    /// nil for http; for https, a TLS client that trusts only the lab CA (`LabTrust.caFile`) and
    /// checks the name or address dialled.
    static func tls(for url: URL) throws -> TLSConfiguration? {
        switch url.scheme?.lowercased() {
        case "http": return nil
        case "https":
            guard let file = LabTrust.caFile else {
                throw NetError(.tls, "https needs the lab CA to check the server (--ca FILE, or ca.pem in --credentials DIR)")
            }
            if let c = cached.withLock({ $0 }), c.file == file { return c.configuration }
            var configuration = TLSConfiguration.makeClientConfiguration()
            do { configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(file)) } catch {
                throw NetError(.tls, "\(file): \(error)")
            }
            configuration.certificateVerification = .fullVerification
            configuration.minimumTLSVersion = .tlsv12
            cached.withLock { $0 = (file, configuration) }
            return configuration
        default: throw NetError(.badAddress, "only http:// and https:// are supported")
        }
    }

    /// Runs `body`, cancelled at `deadline` (AsyncHTTPClient's own deadline covers the answer's
    /// head only; this covers its body too).
    static func within<T: Sendable>(_ deadline: NIODeadline, seconds: TimeInterval, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await body() }
            group.addTask {
                let left = deadline - .now()
                if left > .zero { try await Task.sleep(nanoseconds: UInt64(left.nanoseconds)) }
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let value = first else {
                throw LabClient.Failure(status: nil, message: noAnswer(within: seconds))
            }
            return value
        }
    }

    /// Whole seconds (rounded up) as digits; a timeout that is not a number of seconds Int64 holds
    /// (NaN, 1e300: configuration can say anything) as Swift writes it.
    static func noAnswer(within seconds: TimeInterval) -> String {
        let up = seconds.rounded(.up)
        return "no answer within \(abs(up) < 9.2e18 ? String(Saturating.int64(up)) : "\(seconds)") s"
    }

    /// A failure in words a lab user can act on.
    static func describe(_ error: Error, url: URL, timeout: TimeInterval) -> String {
        let target = (try? HostPort(url: url)).map { "\($0)" } ?? url.host ?? "the server"
        if let e = error as? NIOConnectionError {
            let causes = e.connectionErrors.map { failure -> String in
                if let io = failure.error as? IOError { return String(cString: strerror(io.errnoCode)) }
                return "\(failure.error)"
            }
            if let resolution = e.dnsAAAAError ?? e.dnsAError, causes.isEmpty { return "cannot resolve \(target): \(resolution)" }
            return "cannot connect to \(target): \(Array(Set(causes)).sorted().joined(separator: "; "))"
        }
        if let e = error as? IOError, e.errnoCode != 0 { return "cannot connect to \(target): \(String(cString: strerror(e.errnoCode)))" }
        if let e = error as? HTTPClientError {
            switch e {
            case .deadlineExceeded, .readTimeout, .connectTimeout, .writeTimeout: return noAnswer(within: timeout)
            case .remoteConnectionClosed: return "the server closed the connection"
            case .cancelled: return "cancelled"
            default: return "\(e)"
            }
        }
        if let e = error as? NIOSSLError { return "TLS: \(e)" }
        if let e = error as? BoringSSLError { return "TLS: \(e)" }
        if let e = error as? NIOSSLExtraError { return "TLS: \(e)" }
        if error is NIOTooManyBytesError { return "the answer is over \(LabClient.maxAnswerBytes >> 20) MB" }
        return "\(error)"
    }
}
