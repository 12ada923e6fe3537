import Foundation
import FlyingFox

extension HTTPResponse {
    /// A file streamed from disk. With a `Range: bytes=a-[b]` header (`range`), answers 206 with
    /// that part and `Content-Range`, so an interrupted download can resume. Throws 404 with
    /// `missing` when the file is not there.
    public static func file(_ url: URL, contentType: String = "application/octet-stream", range: String? = nil, missing: String) throws -> HTTPResponse {
        guard let attrs = try? FileManager.default.attributesOfItem(atPath: url.path), let size = (attrs[.size] as? NSNumber)?.intValue else {
            throw HTTPError(.notFound, missing)
        }
        if let range, let r = parseRange(range, size: size) {
            let body = try HTTPBodySequence(file: url, range: r, suggestedBufferSize: 256 * 1024)
            return HTTPResponse(statusCode: .partialContent, headers: [.contentType: contentType, .acceptRanges: "bytes",
                                                                 .contentRange: "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(size)"], body: body)
        }
        let body = try HTTPBodySequence(file: url, range: nil, suggestedBufferSize: 256 * 1024)
        return HTTPResponse(statusCode: .ok, headers: [.contentType: contentType, .acceptRanges: "bytes"], body: body)
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
