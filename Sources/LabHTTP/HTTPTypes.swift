import Foundation
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP status: its code and reason phrase.
public struct HTTPStatusCode: Sendable, Hashable, CustomStringConvertible {
    public var code: Int
    public var phrase: String

    public init(_ code: Int, phrase: String) {
        self.code = code
        self.phrase = phrase
    }

    public var description: String { "\(code) \(phrase)" }

    /// The status a rule's refusal is answered with (`LabRefusal.Kind.status`), at the edge.
    public init(refusal kind: LabRefusal.Kind) {
        switch kind {
        case .invalid: self = .badRequest
        case .unauthenticated: self = .unauthorized
        case .forbidden: self = .forbidden
        case .notFound: self = .notFound
        case .conflict: self = .conflict
        case .unprocessable: self = .unprocessableContent
        case .failed: self = .internalServerError
        }
    }

    public static let `continue` = HTTPStatusCode(100, phrase: "Continue")
    public static let ok = HTTPStatusCode(200, phrase: "OK")
    public static let created = HTTPStatusCode(201, phrase: "Created")
    public static let accepted = HTTPStatusCode(202, phrase: "Accepted")
    public static let noContent = HTTPStatusCode(204, phrase: "No Content")
    public static let partialContent = HTTPStatusCode(206, phrase: "Partial Content")
    public static let badRequest = HTTPStatusCode(400, phrase: "Bad Request")
    public static let unauthorized = HTTPStatusCode(401, phrase: "Unauthorized")
    public static let forbidden = HTTPStatusCode(403, phrase: "Forbidden")
    public static let notFound = HTTPStatusCode(404, phrase: "Not Found")
    public static let methodNotAllowed = HTTPStatusCode(405, phrase: "Method Not Allowed")
    public static let requestTimeout = HTTPStatusCode(408, phrase: "Request Timeout")
    public static let conflict = HTTPStatusCode(409, phrase: "Conflict")
    public static let gone = HTTPStatusCode(410, phrase: "Gone")
    public static let lengthRequired = HTTPStatusCode(411, phrase: "Length Required")
    public static let payloadTooLarge = HTTPStatusCode(413, phrase: "Content Too Large")
    public static let uriTooLong = HTTPStatusCode(414, phrase: "URI Too Long")
    public static let rangeNotSatisfiable = HTTPStatusCode(416, phrase: "Range Not Satisfiable")
    public static let expectationFailed = HTTPStatusCode(417, phrase: "Expectation Failed")
    public static let unprocessableContent = HTTPStatusCode(422, phrase: "Unprocessable Content")
    public static let tooManyRequests = HTTPStatusCode(429, phrase: "Too Many Requests")
    public static let requestHeaderFieldsTooLarge = HTTPStatusCode(431, phrase: "Request Header Fields Too Large")
    public static let internalServerError = HTTPStatusCode(500, phrase: "Internal Server Error")
    public static let notImplemented = HTTPStatusCode(501, phrase: "Not Implemented")
    public static let serviceUnavailable = HTTPStatusCode(503, phrase: "Service Unavailable")
    public static let httpVersionNotSupported = HTTPStatusCode(505, phrase: "HTTP Version Not Supported")
}

/// An answer: a status, header fields (names as they are to be sent) and a body, either bytes or
/// a range of an open file streamed from disk when written.
public struct HTTPResponse: Sendable {
    public enum Body: Sendable {
        case data(Data)
        /// `range` of an open regular file, streamed when the answer is written, 256 KiB at a time.
        case file(OpenFile, Range<Int>)
        /// A body written over time (server-sent events): the closure writes chunks with `write` until it returns; `write` throws once the peer has gone. Sent chunked, never buffered whole.
        /// `write` is not Sendable: it is called from the closure's own task, one chunk at a time.
        case stream(@Sendable (_ write: (Data) async throws -> Void) async throws -> Void)

        /// Bytes of a body whose length is known; 0 for a stream (sent chunked).
        public var count: Int {
            switch self {
            case .data(let d): return d.count
            case .file(_, let r): return r.count
            case .stream: return 0
            }
        }
    }

    public var status: HTTPStatusCode
    public var headers: [String: String]
    public var body: Body

    public init(_ status: HTTPStatusCode = .ok, headers: [String: String] = [:], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = .data(body)
    }

    public init(_ status: HTTPStatusCode, headers: [String: String], file: OpenFile, range: Range<Int>) {
        self.status = status
        self.headers = headers
        self.body = .file(file, range)
    }

    /// The body's bytes when it is `Data` (tests, small answers); nil for a file.
    public var data: Data? {
        if case .data(let d) = body { return d }
        return nil
    }

    /// A JSON body.
    public static func json<T: Encodable>(_ value: T, status: HTTPStatusCode = .ok) -> HTTPResponse {
        do {
            return HTTPResponse(status, headers: ["Content-Type": "application/json"], body: try LabJSON.encoder.encode(value))
        } catch {
            // Never an empty object in place of the answer: the client is told it has none.
            return .error(.internalServerError, "cannot encode the answer: \(error)")
        }
    }

    /// `{"error": message}` with a status.
    public static func error(_ status: HTTPStatusCode, _ message: String) -> HTTPResponse {
        json(["error": message], status: status)
    }
}

/// A regular file opened for reading, closed when the last reference goes. Opened when the
/// answer is made (its size is then fixed for the answer), read when the answer is written.
public final class OpenFile: Sendable {
    public let fd: Int32
    public let size: Int

    /// Opens `path` if it is a regular file (a FIFO, device or directory is refused without
    /// blocking on it); nil otherwise.
    public init?(path: String) {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { Glibc.close(fd); return nil }
        self.fd = fd
        self.size = Int(st.st_size)
    }

    deinit { Glibc.close(fd) }

    /// Reads at most `count` bytes at `offset` into `buffer`; 0 at the end of the file.
    func read(into buffer: UnsafeMutableRawBufferPointer, count: Int, at offset: Int) -> Int {
        while true {
            let n = pread(fd, buffer.baseAddress!, min(count, buffer.count), off_t(offset))
            if n < 0 && errno == EINTR { continue }
            return n
        }
    }
}

/// An error a handler throws to answer with a status and a message.
public struct HTTPError: Error, CustomStringConvertible, Sendable {
    public var status: HTTPStatusCode
    public var message: String
    public init(_ status: HTTPStatusCode, _ message: String) { self.status = status; self.message = message }
    public var description: String { "\(status.code) \(message)" }
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
            let text: String
            do { text = try String(contentsOfFile: file, encoding: .utf8) } catch {
                throw HTTPError(.internalServerError, "cannot read the token file \(file): \(error.localizedDescription)")
            }
            let token = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
            guard token.count >= minimumLength else {
                throw HTTPError(.internalServerError, "the token in \(file) is shorter than \(minimumLength) characters (\(token.count)): too easy to guess; herald-lab ca init writes one of 64")
            }
            return token
        }
        if let env = ProcessInfo.processInfo.environment["HERALDLAB_TOKEN"], !env.isEmpty {
            guard env.count >= minimumLength else {
                throw HTTPError(.internalServerError, "HERALDLAB_TOKEN is shorter than \(minimumLength) characters (\(env.count)): too easy to guess; herald-lab ca init writes one of 64")
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
