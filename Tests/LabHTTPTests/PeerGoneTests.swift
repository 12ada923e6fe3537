import Foundation
import Hummingbird
import XCTest
import LabNet
import LabTestSupport
@testable import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// The CPU time this process has used (user and system), in seconds: getrusage(RUSAGE_SELF).
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// A lab CA in `dir` (ca.pem, ca-key.pem) and a server certificate for 127.0.0.1 signed by it;
/// returns the server's context and a client's that trusts the CA.
func makeTestTLS(in dir: URL) throws -> (server: TLSContext, client: TLSContext) {
    func p(_ f: String) -> String { dir.appendingPathComponent(f).path }
    try LabCA.create(commonName: "test CA", days: 1, certificate: p("ca.pem"), key: p("ca-key.pem"))
    try LabCA.issue(caCertificate: p("ca.pem"), caKey: p("ca-key.pem"), commonName: "server",
                    names: ["127.0.0.1"], days: 1, certificate: p("cert.pem"), key: p("key.pem"))
    return (try TLSContext(certificate: p("cert.pem"), key: p("key.pem")), try TLSContext(trusting: p("ca.pem")))
}

/// `GET /health` over TLS on a new connection: the start of the answer.
func healthOverTLS(_ port: UInt16, _ client: TLSContext) throws -> String {
    let c = try TestStream.connect(host: "127.0.0.1", port: port, timeout: 10, tls: client)
    defer { c.close() }
    try c.write(get("/health", extra: "Connection: close\r\n"))
    return String(decoding: try c.read(), as: UTF8.self)
}

/// A client that pipelines requests and closes without reading a byte (issue 19, item 2): the
/// server must close the connection at its first failed write, drop the answers it still had
/// to write, and use no CPU afterwards; its workers go back to idle.
final class PeerGoneTests: XCTestCase {
    var services: [HTTPService] = []
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("peergone-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
        try? FileManager.default.removeItem(at: dir)
    }

    func start(tls: TLSContext?, gate: Gate) async throws -> (HTTPService, UInt16) {
        let service = HTTPService(name: tls == nil ? "plain" : "tls", token: nil, limits: .init(idleTimeout: 60), logger: LogCapture.quiet())
        service.serve { r in
            r.routes().get("/gate") { _, _ in
                await gate.wait()
                return Response.json(["status": "passed"])
            }
        }
        let port = try await service.start(host: "127.0.0.1", port: 0, tls: tls)
        services.append(service)
        return (service, port)
    }

    /// `GET /gate` then 200 `GET /health`, pipelined in one write.
    static let pipeline = Array((get("/gate") + String(repeating: get("/health"), count: 200)).utf8)

    /// How the client leaves: with a FIN (and close_notify over TLS), or with a reset.
    enum Leave: CaseIterable { case close, reset }

    static func setResetOnClose(_ fd: Int32) {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
    }

    func testPipelinedRequestsFromAClientThatLeavesCostNothing() async throws {
        let (serverTLS, clientTLS) = try makeTestTLS(in: dir)
        // Three connections per service and way of leaving (12 in all), all behind one gate.
        // The answers behind `GET /gate` are written only once the client has gone, whatever the
        // machine's load (no race between the client's close and the server's writes).
        let perKind = 3
        let gate = Gate()
        let (plain, plainPort) = try await start(tls: nil, gate: gate)
        let (tls, tlsPort) = try await start(tls: serverTLS, gate: gate)

        for leave in Leave.allCases {
            for _ in 0..<perKind {
                let raw = try RawClient(port: plainPort)
                XCTAssertTrue(raw.send(Self.pipeline))
                if leave == .reset { Self.setResetOnClose(raw.fd) }
                raw.close()

                let c = try TestStream.connect(host: "127.0.0.1", port: tlsPort, timeout: 10, tls: clientTLS)
                try c.write(Self.pipeline)
                if leave == .reset { try c.reset() } else { c.close() }
            }
        }
        // Every client has gone; now the answers are written, to nobody.
        await gate.open()

        // Each connection is closed at its first failed write (a bounded wait: the deadline
        // only ends a test that has already failed).
        let deadline = monotonicNow() + 30
        func openConnections() -> Int { plain.openConnections() + tls.openConnections() }
        while openConnections() > 0 && monotonicNow() < deadline {
            try await Task.sleep(nanoseconds: 20_000_000)
        }
        XCTAssertEqual(openConnections(), 0, "connections still open after their clients left")

        // Then the process is idle: under 1 % of a core (0.1 s of CPU) over 10 s.
        let before = processCPUSeconds()
        try await Task.sleep(nanoseconds: 10_000_000_000)
        let used = processCPUSeconds() - before
        print("PeerGoneTests: \(String(format: "%.3f", used)) s of CPU in the 10 s after 12 clients left")
        XCTAssertLessThan(used, 0.1, "the service used CPU after its clients left")

        // And both still answer.
        let r = try RawClient(port: plainPort)
        r.send(get("/health", extra: "Connection: close\r\n"))
        XCTAssertEqual(r.answer()?.status, 200)
        XCTAssertTrue(try healthOverTLS(tlsPort, clientTLS).hasPrefix("HTTP/1.1 200"))
    }
}

extension PeerGoneTests {
    /// Strangers that start a TLS handshake and send no more hold no thread (issue 19, item 2):
    /// each is a connection on NIO's loop, with its head deadline, and a client that completes
    /// its handshake is answered meanwhile.
    func testSlowTLSHandshakesHoldNoWorker() async throws {
        let (serverTLS, clientTLS) = try makeTestTLS(in: dir)
        let service = HTTPService(name: "tls", token: nil, limits: .init(headerTimeout: 120, idleTimeout: 120), logger: LogCapture.quiet())
        let port = try await service.start(host: "127.0.0.1", port: 0, tls: serverTLS)
        services.append(service)
        // The first bytes of a ClientHello record, then nothing.
        let strangers = try (0..<20).map { _ -> RawClient in
            let r = try RawClient(port: port)
            XCTAssertTrue(r.send([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))
            return r
        }
        defer { for s in strangers { s.close() } }
        // Every one is held, its handshake begun (bounded wait: far below their 120 s deadline).
        let deadline = monotonicNow() + 30
        while service.openConnections() < strangers.count && monotonicNow() < deadline {
            try await Task.sleep(nanoseconds: 20_000_000)
        }
        XCTAssertEqual(service.openConnections(), strangers.count, "slow handshakes held open")
        XCTAssertTrue(try healthOverTLS(port, clientTLS).hasPrefix("HTTP/1.1 200"))
    }
}
