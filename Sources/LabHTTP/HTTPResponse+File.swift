import Foundation

extension HTTPResponse {
    /// A file streamed from disk, never held in memory (sendfile; 256 KiB at a time over TLS).
    /// With a `Range: bytes=a-[b]` header (`range`), answers 206 with that part and
    /// `Content-Range`, so an interrupted download can resume. Throws 404 with `missing` when
    /// the file is not there or is not a regular file.
    public static func file(_ url: URL, contentType: String = "application/octet-stream", range: String? = nil, missing: String) throws -> HTTPResponse {
        guard let file = OpenFile(path: url.path) else { throw HTTPError(.notFound, missing) }
        let size = file.size
        if let range, let r = parseRange(range, size: size) {
            return HTTPResponse(.partialContent, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes",
                                                           "Content-Range": "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(size)"],
                                file: file, range: r)
        }
        return HTTPResponse(.ok, headers: ["Content-Type": contentType, "Accept-Ranges": "bytes"], file: file, range: 0..<size)
    }

    /// `bytes=a-b` or `bytes=a-`, clamped to the file.
    static func parseRange(_ header: String, size: Int) -> Range<Int>? {
        guard header.hasPrefix("bytes=") else { return nil }
        let spec = header.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard spec.count == 2, let a = Int(spec[0]), a >= 0, a <= size else { return nil }
        let b = spec[1].isEmpty ? size - 1 : min(size - 1, Int(spec[1]) ?? size - 1)
        return a..<max(a, b + 1)
    }
}
