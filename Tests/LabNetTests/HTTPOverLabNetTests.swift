import Foundation
import Hummingbird
import XCTest
import HeraldCore
import LabHTTP
import LabNet
import LabTestSupport
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

/// HTTPService, LabClient, ClockProbe and FileDownload on host names and IPv6.
final class HTTPOverLabNetTests: XCTestCase {
    var services: [HTTPService] = []

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
    }

    /// An HTTPService answering clock probes as the agent does, and a file.
    func start(on host: String, token: String? = nil, file: Data = Data()) async throws -> (HTTPService, UInt16) {
        let service = HTTPService(name: "test", token: token, logger: LogCapture.quiet())
        service.serve { r in
            r.routes().post("/v1/clock") { _, _ in
                let t = Date().timeIntervalSince1970
                return Response.json(["received": t, "sent": t])
            }
            r.routes().get("/file") { _, _ in Response(.ok, headers: ["Content-Type": "application/octet-stream"], body: file) }
        }
        let port = try await service.start(host: host, port: 0)
        services.append(service)
        return (service, port)
    }

    func url(_ host: String, _ port: UInt16) -> URL { URL(string: "http://\(HostPort.urlHost(host)):\(port)")! }

    func testServesHealthOnLocalhostByName() async throws {
        let (_, port) = try await start(on: "localhost")
        let health: [String: String] = try await LabClient(base: url("localhost", port), token: nil).call("GET", "/health")
        XCTAssertEqual(health["status"], "ok")
    }

    func testServesHealthOnIPv6Loopback() async throws {
        try requireIPv6Loopback()
        let (_, port) = try await start(on: "::1")
        let health: [String: String] = try await LabClient(base: url("::1", port), token: nil).call("GET", "/health")
        XCTAssertEqual(health["status"], "ok")
    }

    func testUnresolvableHostIsNamed() async throws {
        let service = HTTPService(name: "test", token: nil, logger: LogCapture.quiet())
        do {
            _ = try await service.start(host: "no-such-host.invalid", port: 0)
            XCTFail("started on a name that does not resolve")
        } catch {
            XCTAssertTrue("\(error)".contains("cannot resolve no-such-host.invalid"), "\(error)")
        }
    }

    func testBusyPortIsRefusedAtOnceWithTheCause() async throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(fd) }
        let service = HTTPService(name: "test", token: nil, logger: LogCapture.quiet())
        do {
            _ = try await service.start(host: "127.0.0.1", port: port)
            XCTFail("started on a busy port")
        } catch {
            XCTAssertTrue("\(error)".hasSuffix("test: cannot listen on 127.0.0.1:\(port): Address already in use"), "\(error)")
        }
    }

    /// The service's connections have TCP_NODELAY (inherited from the listening socket).
    func testAcceptedConnectionsHaveNoDelay() async throws {
        let (_, port) = try await start(on: "127.0.0.1")
        // Keep a connection open after one answer (kept alive) and find the server's end of it
        // among this process's sockets.
        let fd = try Dialer.connect(host: "127.0.0.1", port: port, timeout: 5)
        defer { close(fd) }
        let request = Array("GET /health HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\r\n".utf8)
        XCTAssertEqual(request.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }, request.count)
        var buffer = [UInt8](repeating: 0, count: 4096)
        Sockets.setTimeouts(fd, seconds: 5)
        XCTAssertGreaterThan(buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }, 0)
        let entries = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").compactMap(Int32.init)
        let accepted = entries.filter { s in
            s != fd && Sockets.localAddress(s)?.port == port && Sockets.peerHost(s) != nil
        }
        XCTAssertEqual(accepted.count, 1)
        XCTAssertTrue(accepted.allSatisfy(Sockets.noDelay), "the accepted socket inherits TCP_NODELAY")
    }

    func testClockProbeMeasuresOverIPv6() async throws {
        try requireIPv6Loopback()
        let (_, port) = try await start(on: "::1")
        let samples = try await ClockProbe.measure(url("::1", port), path: "/v1/clock", token: nil, count: 4)
        XCTAssertEqual(samples.count, 4)
        XCTAssertTrue(samples.allSatisfy { abs($0.offset) < 0.05 && $0.roundTrip >= 0 && $0.roundTrip < 1 }, "\(samples)")
    }

    func testClockProbeMeasuresOnLocalhost() async throws {
        let (_, port) = try await start(on: "localhost")
        let samples = try await ClockProbe.measure(url("localhost", port), path: "/v1/clock", token: nil, count: 4)
        XCTAssertEqual(samples.count, 4)
        // One clock on both ends: the true offset, 0, lies within every exchange's bounds, unless a
        // stamp was taken on the wrong side of the exchange (t0 after the agent's t1, t3 before t2).
        for s in samples {
            XCTAssertLessThanOrEqual(abs(s.offset), s.roundTrip / 2 + 1e-6, "\(samples)")
        }
    }

    func testClockProbeErrorsNameTheURL() async throws {
        let port = try closedPort()
        let refused = url("127.0.0.1", port)
        do {
            _ = try await ClockProbe.measure(refused, path: "/v1/clock", token: nil, count: 2, timeout: 2)
            XCTFail("measured a closed port")
        } catch {
            XCTAssertEqual("\(error)", "clock probe of \(refused.absoluteString): cannot connect to 127.0.0.1:\(port): Connection refused")
        }

        let (_, guarded) = try await start(on: "localhost", token: "0123456789abcdef0123")
        let unauthorised = url("localhost", guarded)
        do {
            _ = try await ClockProbe.measure(unauthorised, path: "/v1/clock", token: nil, count: 2)
            XCTFail("measured without the token")
        } catch {
            XCTAssertTrue("\(error)".hasPrefix("clock probe of \(unauthorised.absoluteString): HTTP 401"), "\(error)")
        }
        let samples = try await ClockProbe.measure(unauthorised, path: "/v1/clock", token: "0123456789abcdef0123", count: 1)
        XCTAssertEqual(samples.count, 1)
    }

    func testFileDownloadFromHostName() async throws {
        let body = Data((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let (_, port) = try await start(on: "localhost", file: body)
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("labnet-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("f")
        FileManager.default.createFile(atPath: file.path, contents: nil)
        let source = url("localhost", port).appendingPathComponent("file")
        var h = SHA256()
        let result = (try await FileDownload.get(source, headers: [:], appendingTo: file, hasher: &h, timeout: 10), h.finalizeHex())
        XCTAssertEqual(result.0.status, 200)
        XCTAssertEqual(result.0.bytes, Int64(body.count))
        XCTAssertEqual(try Data(contentsOf: file), body)
        XCTAssertEqual(result.1, SHA256.hash(body))
        var hasher = SHA256()
        do {
            _ = try await FileDownload.get(url("no-such-host.invalid", 80), headers: [:], appendingTo: file, hasher: &hasher)
            XCTFail("downloaded from a name that does not resolve")
        } catch {
            XCTAssertTrue("\(error)".contains("cannot resolve no-such-host.invalid"), "\(error)")
        }
    }
}
