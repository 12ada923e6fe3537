import Foundation
import XCTest
import NIOCore
import NIOEmbedded
import NIOHTTP1
import LabTestSupport
@testable import LabHTTP

/// `HeadGuard` and `HeadRules` on an embedded channel with NIO's HTTP/1.1 codec between them:
/// no socket, and time moved by hand, so each deadline is checked exactly.
final class HeadRulesTests: XCTestCase {
    let limits = HTTPService.Limits(headerTimeout: 5, idleTimeout: 3, bodyTimeout: 7, writeTimeout: 4)

    func channel(_ limits: HTTPService.Limits? = nil) throws -> (EmbeddedChannel, HeadRules) {
        let channel = EmbeddedChannel()
        let rules = try HeadRules.addHTTP(to: channel.pipeline.syncOperations, limits: limits ?? self.limits, remote: "192.0.2.1:40000", logger: LogCapture.quiet())
        try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 40000)).wait()
        return (channel, rules)
    }

    func send(_ channel: EmbeddedChannel, _ text: String) throws {
        try channel.writeInbound(channel.allocator.buffer(string: text))
    }

    /// Everything the server wrote, as text.
    func written(_ channel: EmbeddedChannel) throws -> String {
        var out = ""
        while var b = try channel.readOutbound(as: ByteBuffer.self) { out += b.readString(length: b.readableBytes) ?? "" }
        return out
    }

    func isOpen(_ channel: EmbeddedChannel) -> Bool { channel.isActive }

    /// What a route's answer looks like to HeadRules: 200 with an empty body.
    func answerOK(_ channel: EmbeddedChannel) throws {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "0")
        try channel.writeOutbound(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
    }

    func testSilenceIsClosedWithoutAWordAtTheIdleDeadline() throws {
        let (channel, _) = try channel()
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(2990))
        XCTAssertTrue(isOpen(channel))
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(20))
        XCTAssertFalse(isOpen(channel))
        XCTAssertEqual(try written(channel), "")
    }

    /// The first head's deadline runs from accept (it covers a TLS handshake too): a byte at
    /// 1 s and more later do not move it.
    func testTheFirstHeadIsDueWithinTheHeaderDeadlineFromAccept() throws {
        let (channel, _) = try channel()
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        try send(channel, "GET /health HTTP/1.1\r\n")
        channel.embeddedEventLoop.advanceTime(by: .seconds(3))
        try send(channel, "Host: t\r\n")
        XCTAssertTrue(isOpen(channel), "past the idle deadline, but bytes came")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(990))
        XCTAssertTrue(isOpen(channel))
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(20))
        let text = try written(channel)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"), text)
        XCTAssertTrue(text.contains("connection: close") || text.contains("Connection: close"), text)
        XCTAssertFalse(isOpen(channel))
    }

    /// A head passes to the next handler; its body is due within the body deadline from the head.
    func testABodyIsDueWithinTheBodyDeadline() throws {
        let (channel, _) = try channel()
        try send(channel, "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        guard case .head(let head)? = try channel.readInbound(as: HTTPServerRequestPart.self) else { return XCTFail("no head") }
        XCTAssertEqual(head.uri, "/upload")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(6990))
        XCTAssertTrue(isOpen(channel))
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(20))
        XCTAssertTrue(try written(channel).hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        XCTAssertFalse(isOpen(channel))
    }

    /// After an answer the connection is kept (HTTP/1.1) until the idle deadline; the next head's
    /// deadline runs from its first byte.
    func testKeepAliveThenIdleThenTheNextHeadsOwnDeadline() throws {
        let (channel, _) = try channel()
        try send(channel, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertNotNil(try channel.readInbound(as: HTTPServerRequestPart.self))
        XCTAssertNotNil(try channel.readInbound(as: HTTPServerRequestPart.self))
        // A handler may take its time: no deadline while it runs.
        channel.embeddedEventLoop.advanceTime(by: .seconds(60))
        XCTAssertTrue(isOpen(channel))
        try answerOK(channel)
        XCTAssertTrue(try written(channel).hasPrefix("HTTP/1.1 200 OK\r\n"))
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        try send(channel, "GET /hea")
        channel.embeddedEventLoop.advanceTime(by: .seconds(4))
        XCTAssertTrue(isOpen(channel), "the next head has 5 s from its first byte")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1010))
        XCTAssertTrue(try written(channel).hasPrefix("HTTP/1.1 408"))
        XCTAssertFalse(isOpen(channel))
    }

    /// HTTP/1.0 closes after its answer unless it asked to keep alive; a route's answer with
    /// `Connection: close` closes too.
    func testHTTP10AndConnectionClose() throws {
        let (channel, _) = try channel()
        try send(channel, "GET /health HTTP/1.0\r\n\r\n")
        _ = try channel.readInbound(as: HTTPServerRequestPart.self)
        _ = try channel.readInbound(as: HTTPServerRequestPart.self)
        try answerOK(channel)
        XCTAssertTrue(try written(channel).lowercased().contains("connection: close"))
        XCTAssertFalse(isOpen(channel))
    }

    /// A request line without its end is refused once it passes 8 KiB (not buffered further);
    /// a head past 16 KiB is 431.
    func testHeadsPastTheirLimitsAreRefusedAsTheyCome() throws {
        let (line, _) = try channel()
        try send(line, "GET /" + String(repeating: "a", count: 8300))
        XCTAssertTrue(try written(line).hasPrefix("HTTP/1.1 414"))
        XCTAssertFalse(isOpen(line))

        let (head, _) = try channel()
        try send(head, "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + String(repeating: "b", count: 20_000))
        XCTAssertTrue(try written(head).hasPrefix("HTTP/1.1 431"))
        XCTAssertFalse(isOpen(head))
    }

    /// The service's body limit refuses the byte that passes it, as the body comes (a route's
    /// own limit is `collectData(upTo:)`'s, in LimitTests and RouterModeTests).
    func testTheServicesBodyLimitIsCountedAsTheBodyComes() throws {
        let (channel, _) = try channel(HTTPService.Limits(headerTimeout: 5, idleTimeout: 3, bodyTimeout: 7, writeTimeout: 4, maxBodyBytes: 20))
        try send(channel, "POST /upload HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n")
        XCTAssertTrue(isOpen(channel))
        try send(channel, "5\r\nghijk\r\n")
        XCTAssertTrue(try written(channel).hasPrefix("HTTP/1.1 413"))
        XCTAssertFalse(isOpen(channel))
    }
}
