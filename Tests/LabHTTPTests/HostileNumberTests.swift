import Foundation
import XCTest
import HeraldCore
import LabNet
import LabTestSupport
import NIOCore
import NIOEmbedded
@testable import LabHTTP

/// Issue 36: no Double-to-integer conversion of LabHTTP can trap. Timeouts and limits (which are
/// configuration, and configuration can say anything) fed 1e300, -1e300, NaN, ±infinity and a
/// negative value: a client refuses them by name, a server's limits saturate.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5]
    /// Where nothing listens: every call here must be refused before a connection is tried.
    let nowhere = URL(string: "http://127.0.0.1:9/")!

    // MARK: LabHTTPChannel (HeadRules)

    func testLimitsAsDelays() {
        XCTAssertEqual(Self.hostile.map(HeadRules.delay), [.nanoseconds(.max), .zero, .zero, .nanoseconds(.max), .zero, .zero])
        XCTAssertEqual(HeadRules.delay(1.5), .milliseconds(1500))
    }

    func testLimitsInWords() {
        XCTAssertEqual(Self.hostile.map(HeadRules.seconds), ["1e+300 s", "-1e+300 s", "nan s", "inf s", "-inf s", "-5 s"])
        XCTAssertEqual([10, 2.5].map(HeadRules.seconds), ["10 s", "2.5 s"])
    }

    func channel(_ limits: HTTPService.Limits) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        _ = try HeadRules.addHTTP(to: channel.pipeline.syncOperations, limits: limits, remote: "192.0.2.1:40000", logger: LogCapture.quiet())
        try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 40000)).wait()
        return channel
    }

    /// Limits of 1e300 s are the longest delay there is: a day later the connection is still open.
    func testHugeLimitsSaturate() throws {
        let channel = try channel(HTTPService.Limits(headerTimeout: 1e300, idleTimeout: .infinity, bodyTimeout: 1e300, writeTimeout: 1e300))
        channel.embeddedEventLoop.advanceTime(by: .hours(24))
        XCTAssertTrue(channel.isActive)
        try channel.writeInbound(channel.allocator.buffer(string: "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"))
        channel.embeddedEventLoop.advanceTime(by: .hours(24))
        XCTAssertTrue(channel.isActive, "the body's limit is as long")
        _ = try? channel.finish()
    }

    /// Limits that are not a number, or negative, are no time at all: the silent connection is closed at once, without a word.
    func testNaNAndNegativeLimitsAreZero() throws {
        for (idle, header) in [(Double.nan, -5.0), (-1e300, .nan), (-.infinity, -.infinity)] {
            let channel = try channel(HTTPService.Limits(headerTimeout: header, idleTimeout: idle, bodyTimeout: .nan, writeTimeout: -1))
            channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
            XCTAssertFalse(channel.isActive, "idle \(idle), header \(header)")
            XCTAssertNil(try channel.readOutbound(as: ByteBuffer.self))
        }
    }

    // MARK: LabClient, FileDownload, ClockProbe

    func testClientTimeoutsAreRefusedByName() async throws {
        for t in Self.hostile {
            do {
                _ = try await LabClient(base: nowhere, token: nil, timeout: t).request("GET", "/health")
                XCTFail("\(t) was taken")
            } catch let e as LabClient.Failure {
                XCTAssertEqual(e.message, "GET http://127.0.0.1:9/health: timeout \(t) s is not 0 to 86400 s")
            }
        }
    }

    func testDownloadTimeoutsAreRefusedByName() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hostile-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        for t in Self.hostile {
            var hasher = SHA256()
            do {
                _ = try await FileDownload.get(nowhere.appendingPathComponent("f"), headers: [:], appendingTo: file, hasher: &hasher, timeout: t)
                XCTFail("\(t) was taken")
            } catch let e as LabClient.Failure {
                XCTAssertEqual(e.message, "download of http://127.0.0.1:9/f: timeout \(t) s is not 0 to 86400 s")
            }
        }
    }

    func testClockProbeTimeoutsAreRefusedByName() async throws {
        for t in Self.hostile {
            do {
                _ = try await ClockProbe.measure(nowhere, path: "/v1/clock", token: nil, count: 1, timeout: t)
                XCTFail("\(t) was taken")
            } catch let e as NetError {
                XCTAssertEqual(e.message, "clock probe of http://127.0.0.1:9/: timeout \(t) s is not 0 to 3600 s")
            }
        }
    }

    /// The words of a timeout: whole seconds rounded up; anything Int64 cannot hold as Swift writes it.
    func testNoAnswerInWords() {
        XCTAssertEqual(Self.hostile.map(LabHTTPClient.noAnswer), ["no answer within 1e+300 s", "no answer within -1e+300 s", "no answer within nan s",
                                                                  "no answer within inf s", "no answer within -inf s", "no answer within -5 s"])
        XCTAssertEqual(LabHTTPClient.noAnswer(within: 2.2), "no answer within 3 s")
    }
}
