import Foundation
import Hummingbird
import XCTest
#if canImport(Glibc)
import Glibc
#endif
import LabNet
import LabTestSupport
import NIOCore
import NIOEmbedded
import NIOHTTP1
@testable import LabHTTP

/// The clock probe over TLS: it checks the agent's certificate against the lab CA, and a server
/// another CA signed is a TLS failure that names the URL, not a closed connection.
final class ClockProbeTests: XCTestCase {
    var services: [HTTPService] = []
    var dirs: [URL] = []

    override func tearDown() async throws {
        for s in services { await s.stop() }
        for d in dirs { try? FileManager.default.removeItem(at: d) }
        LabTrust.forget()
    }

    func makeDir() throws -> URL {
        let d = FileManager.default.temporaryDirectory.appendingPathComponent("probe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: d, withIntermediateDirectories: true)
        dirs.append(d)
        return d
    }

    func testProbesOverTLSAgainstTheLabCAOnly() async throws {
        let ours = try makeDir(), other = try makeDir()
        let (server, _) = try makeTestTLS(in: ours)
        _ = try makeTestTLS(in: other)
        let service = HTTPService(name: "agent", token: nil, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().post("/v1/clock") { _, _ in
                let t = Date().timeIntervalSince1970
                return Response.json(["received": t, "sent": t])
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0, tls: server)
        services.append(service)
        let url = URL(string: "https://127.0.0.1:\(port)")!

        // Trusting another CA: the handshake fails, and the error says TLS.
        try LabTrust.trust(caFile: other.appendingPathComponent("ca.pem").path)
        do {
            _ = try await ClockProbe.measure(url, path: "/v1/clock", token: nil, count: 2, timeout: 5)
            XCTFail("probed a server another CA signed")
        } catch let e as NetError {
            XCTAssertEqual(e.kind, .tls, "\(e)")
            XCTAssertTrue(e.message.hasPrefix("clock probe of \(url.absoluteString): TLS"), e.message)
        }

        // The right CA: samples, each with the true offset (0, one clock) within its bounds.
        try LabTrust.trust(caFile: ours.appendingPathComponent("ca.pem").path)
        let samples = try await ClockProbe.measure(url, path: "/v1/clock", token: nil, count: 4)
        XCTAssertEqual(samples.count, 4)
        for s in samples { XCTAssertLessThanOrEqual(abs(s.offset), s.roundTrip / 2 + 1e-6, "\(samples)") }

        // Without any CA, https is refused before a connection is made.
        LabTrust.forget()
        do {
            _ = try await ClockProbe.measure(url, path: "/v1/clock", token: nil, count: 1)
            XCTFail("probed https without the lab CA")
        } catch let e as NetError {
            XCTAssertEqual(e.kind, .tls)
            XCTAssertTrue(e.message.contains("https needs the lab CA"), e.message)
        }
    }

    /// The probe's handler on an embedded loop: a connection that failed (a handshake the lab CA
    /// does not vouch for) or closed before the first request was asked for fails that request
    /// at once with the reason, writing nothing; a loaded machine made this order happen, and
    /// the request then waited out its 5 s deadline and was called a timeout, not TLS.
    func testAConnectionThatEndedBeforeTheFirstRequestFailsItAtOnceWithItsReason() throws {
        struct HandshakeRefused: Error {}
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: "/v1/clock")
        for ending in ["error", "close"] {
            let channel = EmbeddedChannel()
            let handler = ClockProbe.ProbeHandler()
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 9)).wait()
            if ending == "error" { channel.pipeline.fireErrorCaught(HandshakeRefused()) } else { try channel.close().wait() }
            var result: Result<ClockProbe.Exchange, Error>?
            handler.exchange(head, on: channel, within: .seconds(5)).whenComplete { result = $0 }
            switch result {
            case .failure(let e) where ending == "error": XCTAssertTrue(e is HandshakeRefused, "\(e)")
            case .failure(let e): XCTAssertEqual((e as? NetError)?.kind, .closed, "\(e)")
            default: XCTFail("\(ending): the exchange did not fail at once: \(String(describing: result))")
            }
            XCTAssertNil(try channel.readOutbound(as: HTTPClientRequestPart.self), "\(ending): nothing written")
            _ = try? channel.finish()
        }
    }

    /// An agent that vanishes mid-answer: the probe ends at once with the reason, naming the URL,
    /// and keeps no half exchange as a sample.
    func testAPeerThatVanishesMidAnswerEndsTheProbe() async throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        Thread {
            while let c = Listener.accept(fd) {
                var buf = [UInt8](repeating: 0, count: 4096)
                _ = read(c, &buf, buf.count)
                let part = Array("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{\"rec".utf8)
                _ = write(c, part, part.count)
                close(c)
            }
        }.start()
        let url = URL(string: "http://127.0.0.1:\(port)")!
        do {
            _ = try await ClockProbe.measure(url, path: "/v1/clock", token: nil, count: 3, timeout: 5)
            XCTFail("measured a peer that vanished")
        } catch let e as NetError {
            XCTAssertEqual(e.kind, .closed, "\(e)")
            XCTAssertTrue(e.message.hasPrefix("clock probe of \(url.absoluteString): "), e.message)
        }
    }
}
