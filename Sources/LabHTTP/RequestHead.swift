import Foundation
import HTTPTypes

/// Why a request is refused before it reaches a handler: the status to answer with and a message
/// for the body (and the log).
struct Refusal: Error {
    var status: HTTPResponse.Status
    var message: String
    /// The request as far as it is known ("GET /v1/x"), for the log line (escaped there).
    var request: String?
    init(_ status: HTTPResponse.Status, _ message: String, request: String? = nil) {
        self.status = status
        self.message = message
        self.request = request
    }
}

/// A request's head (request line and header fields), judged strictly (RFC 9112) on the parts
/// NIO's decoder parsed: no control characters, UTF-8 only, exactly one way to find the body's
/// end, a path that decodes. Anything else is a `Refusal`. What the connection needs of it
/// (`HeadRules`) is kept.
struct RequestHead {
    static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    /// Fields that must not appear twice (a second one is refused, not joined).
    static let singletons: Set<String> = ["host", "authorization", "content-length", "transfer-encoding", "content-type", "expect", "range"]

    var http10: Bool
    var keepAlive: Bool
    /// Whether a body follows the head.
    var hasBody: Bool
    var expectContinue: Bool

    /// Judges a head as NIO's decoder gave it (method, target, version and fields in the order
    /// they came) on its parsed parts, by the rules of one read off the wire.
    static func parse(method: String, target: String, major: Int, minor: Int, fields: [(String, String)]) throws -> RequestHead {
        // NIO decodes bytes that are not UTF-8 as U+FFFD: such a head is refused.
        // (Scalar searches: String.contains(String) goes through Foundation's locale-aware search,
        // a tenth of the coordinator's CPU at a thousand heartbeats a second.)
        let replacement: Unicode.Scalar = "\u{FFFD}"
        // Request line: METHOD SP target SP HTTP/x.y, printable ASCII only.
        for b in Array(method.utf8) + Array(target.utf8) where b < 0x20 || b >= 0x7F {
            throw Refusal(.badRequest, b >= 0x80 ? "the request line is not ASCII" : "control character in the request line")
        }
        if target.unicodeScalars.contains(replacement) { throw Refusal(.badRequest, "the request line is not ASCII") }
        guard !method.isEmpty, !target.isEmpty, !target.utf8.contains(0x20) else { throw Refusal(.badRequest, "malformed request line") }
        guard method.utf8.allSatisfy(isTokenByte) else { throw Refusal(.badRequest, "malformed method") }
        guard methods.contains(method) else { throw Refusal(.notImplemented, "method not supported (GET, HEAD, POST, PUT, DELETE, PATCH)") }
        guard major == 1, minor == 0 || minor == 1 else {
            throw (0...9).contains(major) && (0...9).contains(minor) ? Refusal(.httpVersionNotSupported, "only HTTP/1.0 and HTTP/1.1 are served")
                : Refusal(.badRequest, "malformed HTTP version")
        }
        let http10 = minor == 0
        guard target.hasPrefix("/") else { throw Refusal(.badRequest, "the request target must be a path (origin form)") }
        guard !target.utf8.contains(UInt8(ascii: "#")) else { throw Refusal(.badRequest, "fragment in the request target") }

        // Header fields.
        var headers = [String: String]()
        for (rawName, rawValue) in fields {
            guard !rawName.isEmpty, rawName.utf8.allSatisfy(isTokenByte) else {
                throw rawName.unicodeScalars.contains(replacement) ? Refusal(.badRequest, "header value is not UTF-8") : Refusal(.badRequest, "malformed header name")
            }
            let value = rawValue.trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
            for b in value.utf8 where (b < 0x20 && b != 0x09) || b == 0x7F { throw Refusal(.badRequest, "control character in a header value") }
            if value.unicodeScalars.contains(replacement) { throw Refusal(.badRequest, "header value is not UTF-8") }
            let name = rawName.lowercased()
            if let old = headers[name] {
                if singletons.contains(name) { throw Refusal(.badRequest, "repeated \(name) header") }
                headers[name] = old + ", " + value
            } else {
                headers[name] = value
            }
        }

        // The body's framing: one way only.
        var hasBody = false
        if let te = headers["transfer-encoding"] {
            guard !http10 else { throw Refusal(.badRequest, "Transfer-Encoding in an HTTP/1.0 request") }
            guard headers["content-length"] == nil else { throw Refusal(.badRequest, "both Content-Length and Transfer-Encoding") }
            guard te.lowercased() == "chunked" else { throw Refusal(.notImplemented, "only Transfer-Encoding: chunked is supported") }
            hasBody = true
        }
        if let cl = headers["content-length"] {
            let digits = Array(cl.utf8)
            guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int(cl) else {
                throw Refusal(.badRequest, "invalid Content-Length")
            }
            hasBody = hasBody || n > 0
        }
        if !http10 && headers["host"] == nil { throw Refusal(.badRequest, "no Host header (required in HTTP/1.1)") }
        var expectContinue = false
        if let expect = headers["expect"] {
            guard expect.lowercased() == "100-continue" else { throw Refusal(.expectationFailed, "only Expect: 100-continue is supported") }
            expectContinue = true
        }
        let connection = Set((headers["connection"] ?? "").lowercased().split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
        let keepAlive = http10 ? connection.contains("keep-alive") && !connection.contains("close") : !connection.contains("close")

        // The path must decode (refused here, the connection closed); EdgeMiddleware decodes it for the route.
        _ = try decodeTarget(target, method: method)
        return RequestHead(http10: http10, keepAlive: keepAlive, hasBody: hasBody, expectContinue: expectContinue)
    }

    /// The target's path segments and query, each part percent-decoded exactly once.
    static func decodeTarget(_ target: String, method: String) throws -> (segments: [String], query: [String: String]) {
        let rawPath: Substring, rawQuery: Substring?
        if let q = target.firstIndex(of: "?") {
            rawPath = target[..<q]
            rawQuery = target[target.index(after: q)...]
        } else {
            rawPath = target[...]
            rawQuery = nil
        }
        var segments = [String]()
        for raw in rawPath.split(separator: "/") {
            guard let bytes = percentDecoded(raw.utf8), let segment = String(validating: bytes, as: UTF8.self) else {
                throw Refusal(.badRequest, "malformed percent-encoding in the path", request: "\(method) \(target)")
            }
            // Control characters other than NUL pass: handlers check their names, and log lines
            // escape them.
            guard segment != ".", segment != "..", !bytes.contains(UInt8(ascii: "/")), !bytes.contains(0) else {
                throw Refusal(.badRequest, "path segment \".\" or \"..\", or holding \"/\" or NUL", request: "\(method) \(target)")
            }
            segments.append(segment)
        }
        var query = [String: String]()
        if let rawQuery {
            for item in rawQuery.split(separator: "&") {
                let pair = item.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                guard let nameBytes = percentDecoded(pair[0].utf8), let name = String(validating: nameBytes, as: UTF8.self),
                      let valueBytes = percentDecoded((pair.count > 1 ? pair[1] : "").utf8), let value = String(validating: valueBytes, as: UTF8.self),
                      !nameBytes.contains(0), !valueBytes.contains(0) else {
                    throw Refusal(.badRequest, "malformed percent-encoding in the query", request: "\(method) \(target)")
                }
                query[name] = value
            }
        }
        return (segments, query)
    }

    /// `%XX` decoded once; nil for a `%` not followed by two hex digits.
    static func percentDecoded<C: Collection>(_ bytes: C) -> [UInt8]? where C.Element == UInt8 {
        var out = [UInt8]()
        out.reserveCapacity(bytes.count)
        var i = bytes.startIndex
        while i != bytes.endIndex {
            let b = bytes[i]
            if b == UInt8(ascii: "%") {
                let h = bytes.index(after: i)
                guard h != bytes.endIndex else { return nil }
                let l = bytes.index(after: h)
                guard l != bytes.endIndex, let hi = hexValue(bytes[h]), let lo = hexValue(bytes[l]) else { return nil }
                out.append(hi << 4 | lo)
                i = bytes.index(after: l)
            } else {
                out.append(b)
                i = bytes.index(after: i)
            }
        }
        return out
    }

    static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x41 + 10
        case 0x61...0x66: return b - 0x61 + 10
        default: return nil
        }
    }

    /// RFC 9110 tchar.
    static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
             UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
             UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"): return true
        default: return false
        }
    }
}
