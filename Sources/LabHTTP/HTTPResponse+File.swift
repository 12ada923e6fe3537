import Foundation

extension HTTPResponse {
    /// A file streamed from disk, never held in memory (256 KiB at a time through Hummingbird's body writer).
    /// With a `Range: bytes=…` header (`range`), answers 206 with that part and `Content-Range`,
    /// so an interrupted download can resume; a range that cannot be satisfied or is not a
    /// valid byte range is 416 with `Content-Range: bytes */LEN` (RFC 9110 15.5.17), never a
    /// 206 with an impossible range. Throws 404 with `missing` when the file is not there or is
    /// not a regular file.
    public static func file(_ url: URL, contentType: String = "application/octet-stream", range: String? = nil, missing: String) throws -> HTTPResponse {
        guard let file = OpenFile(path: url.path) else { throw HTTPError(.notFound, missing) }
        let size = file.size
        switch range.map({ ByteRange.parse($0, size: size) }) ?? .whole {
        case .part(let r):
            return HTTPResponse(.partialContent, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes",
                                                           "Content-Range": "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(size)"],
                                file: file, range: r)
        case .unsatisfiable(let why):
            var r = HTTPResponse.error(.rangeNotSatisfiable, "Range \(HTTPService.escaped(range ?? "")): \(why) (the file has \(size) bytes)")
            r.headers["Content-Range"] = "bytes */\(size)"
            r.headers["Accept-Ranges"] = "bytes"
            return r
        case .whole:
            return HTTPResponse(.ok, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes"], file: file, range: 0..<size)
        }
    }
}

/// What a `Range` header asks of a representation of `size` bytes (RFC 9110 14.1.2, 14.2).
enum ByteRange: Equatable {
    /// Answer it whole (200): no range, another unit, or several ranges (not served as
    /// multipart; RFC 9110 lets a server ignore Range).
    case whole
    /// One satisfiable range, clamped to the file (206).
    case part(Range<Int>)
    /// A byte range that is invalid (`5-2`, signs, garbage) or starts at or past the end, or a
    /// zero suffix (416).
    case unsatisfiable(String)

    static func parse(_ header: String, size: Int) -> ByteRange {
        let text = header.trimmingCharacters(in: .whitespaces)
        guard let eq = text.firstIndex(of: "="), text[..<eq].trimmingCharacters(in: .whitespaces).lowercased() == "bytes" else { return .whole }
        let set = text[text.index(after: eq)...]
        if set.contains(",") { return .whole }
        let spec = set.trimmingCharacters(in: .whitespaces)
        let parts = spec.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2 else { return .unsatisfiable("not a byte range") }
        /// Plain digits only (no sign, no spaces), at most 18 of them (no overflow).
        func number(_ s: Substring) -> Int? {
            guard !s.isEmpty, s.count <= 18, s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int(s)
        }
        if parts[0].isEmpty {
            // -N: the last N bytes.
            guard let suffix = number(parts[1]) else { return .unsatisfiable("not a byte range") }
            guard suffix > 0, size > 0 else { return .unsatisfiable("an empty suffix") }
            return .part(max(0, size - suffix)..<size)
        }
        guard let first = number(parts[0]) else { return .unsatisfiable("not a byte range") }
        var last = size - 1
        if !parts[1].isEmpty {
            guard let l = number(parts[1]) else { return .unsatisfiable("not a byte range") }
            guard l >= first else { return .unsatisfiable("its end comes before its start") }
            last = min(l, size - 1)
        }
        guard first < size else { return .unsatisfiable("it starts at or past the end") }
        return .part(first..<(last + 1))
    }
}
