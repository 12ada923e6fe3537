import Foundation
import Hummingbird
import XCTest
import LabNet
import LabTestSupport
@testable import LabHTTP

/// Streamed answers (`HTTPResponse.Body.stream`, the dashboard's server-sent events): sent
/// chunked, the connection closed at the end, and the producer told when the peer has gone.
final class StreamTests: XCTestCase {
    var services: [HTTPService] = []

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
    }

    final class Flag: @unchecked Sendable {
        private let lock = NSLock()
        private var value = false
        private var writes = 0
        func set() { lock.withLock { value = true } }
        var isSet: Bool { lock.withLock { value } }
        func wrote() { lock.withLock { writes += 1 } }
        var count: Int { lock.withLock { writes } }
    }

    func testAStreamIsSentChunkedAndEnds() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/events") { _, _ in
                try Response.stream(headers: ["Content-Type": "text/event-stream"]) { write in
                    for piece in ["data: a\n\n", "", "data: bb\n\n", "data: ccc\n\n"] { try await write(Data(piece.utf8)) }
                }
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        let client = LabClient(base: URL(string: "http://127.0.0.1:\(port)")!, token: nil)
        let (status, body, headers) = try await client.request("GET", "/events")
        XCTAssertEqual(status, 200)
        XCTAssertEqual(headers["transfer-encoding"], "chunked")
        XCTAssertNil(headers["content-length"])
        XCTAssertEqual(headers["connection"], "close")
        XCTAssertEqual(String(decoding: body, as: UTF8.self), "data: a\n\ndata: bb\n\ndata: ccc\n\n")
    }

    func testAStreamLearnsThatThePeerHasGone() async throws {
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        let ended = Flag()
        service.serve { r in
            r.routes().get("/forever") { _, _ in
                try Response.stream(headers: ["Content-Type": "text/event-stream"]) { write in
                    defer { ended.set() }
                    while true {
                        try await write(Data("data: tick\n\n".utf8))
                        ended.wrote()
                        await Task.yield()
                    }
                }
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        services.append(service)
        let c = try RawClient(port: port)
        XCTAssertTrue(c.send(get("/forever")))
        let head = try XCTUnwrap(c.answer(head: true))
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.headers["transfer-encoding"], "chunked")
        c.close()
        let deadline = Date().addingTimeInterval(10)
        while !ended.isSet && Date() < deadline { try await Task.sleep(nanoseconds: 20_000_000) }
        XCTAssertTrue(ended.isSet, "the producer's write threw once the peer had gone (\(ended.count) writes)")
    }
}
