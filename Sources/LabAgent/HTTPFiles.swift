import Foundation
import FlyingFox

/// File bodies with byte ranges, for gathering logs.
enum HTTPBodySequenceFactory {
    static func file(_ url: URL, range: Range<Int>?) throws -> HTTPBodySequence {
        try HTTPBodySequence(file: url, range: range, suggestedBufferSize: 256 * 1024)
    }
}

enum HTTPResponseFactory {
    static func file(_ body: HTTPBodySequence, size: Int) -> HTTPResponse {
        HTTPResponse(statusCode: .ok, headers: [.contentType: "application/octet-stream", .acceptRanges: "bytes"], body: body)
    }
    static func partial(_ body: HTTPBodySequence, range: Range<Int>, size: Int) -> HTTPResponse {
        HTTPResponse(statusCode: .partialContent, headers: [.contentType: "application/octet-stream", .acceptRanges: "bytes",
                                                             .contentRange: "bytes \(range.lowerBound)-\(range.upperBound - 1)/\(size)"], body: body)
    }
}
