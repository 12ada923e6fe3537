import Foundation
import Hummingbird
import XCTest
import LabTestSupport
@testable import LabHTTP

/// `Range` on files (issue 19, item 7): a satisfiable range is 206 with its Content-Range; an
/// invalid or unsatisfiable one is 416 with `Content-Range: bytes */LEN` (RFC 9110), never a
/// 206 with an impossible range; another unit or several ranges get the whole file (200).
final class RangeTests: XCTestCase {
    func testRulesOfOneByteRange() {
        let size = 100
        let cases: [(String, ByteRange)] = [
            ("bytes=0-9", .part(0..<10)),
            ("bytes=90-", .part(90..<100)),
            ("bytes=90-1000", .part(90..<100)),
            ("bytes=-10", .part(90..<100)),
            ("bytes=-1000", .part(0..<100)),
            ("bytes=99-99", .part(99..<100)),
            ("BYTES = 5-6", .part(5..<7)),
            ("items=0-1", .whole),
            ("bytes=0-1,5-6", .whole),
        ]
        for (header, want) in cases { XCTAssertEqual(ByteRange.parse(header, size: size), want, header) }
        for bad in ["bytes=5-2", "bytes=100-", "bytes=100-200", "bytes=-0", "bytes=+5-6", "bytes=5-+6", "bytes= -", "bytes=a-b",
                    "bytes=5", "bytes=1-2-3", "bytes=99999999999999999999-", "bytes=0x1-2", "bytes=", "bytes=-"] {
            guard case .unsatisfiable = ByteRange.parse(bad, size: size) else { return XCTFail("\(bad) is \(ByteRange.parse(bad, size: size))") }
        }
        guard case .unsatisfiable = ByteRange.parse("bytes=0-", size: 0) else { return XCTFail("an empty file has no byte 0") }
        guard case .unsatisfiable = ByteRange.parse("bytes=-5", size: 0) else { return XCTFail("an empty file has no last bytes") }
    }

    func testUnsatisfiableRangesAre416OnTheWire() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("range-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let content = Data((0..<1000).map { UInt8(truncatingIfNeeded: $0) })
        try content.write(to: dir.appendingPathComponent("f.csv"))
        let service = HTTPService(name: "t", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/files/:name") { request, context in
                try Response.file(dir.appendingPathComponent(context.parameter("name")), range: request.headers[.range], missing: "no such file")
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0)
        defer { Task { await service.stop() } }
        let c = try RawClient(port: port)
        for bad in ["bytes=5-2", "bytes=1000-", "bytes=2000-3000", "bytes=-0", "bytes=+5-"] {
            c.send(get("/files/f.csv", extra: "Range: \(bad)\r\n"))
            let a = try XCTUnwrap(c.answer(), bad)
            XCTAssertEqual(a.status, 416, bad)
            XCTAssertEqual(a.headers["content-range"], "bytes */1000", bad)
        }
        c.send(get("/files/f.csv", extra: "Range: bytes=998-\r\n"))
        let tail = try XCTUnwrap(c.answer())
        XCTAssertEqual(tail.status, 206)
        XCTAssertEqual(tail.headers["content-range"], "bytes 998-999/1000")
        XCTAssertEqual(tail.body, content[998...])
    }
}
