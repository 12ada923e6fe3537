import Foundation
import XCTest
import LabNet
#if canImport(Glibc)
import Glibc
#endif

/// TLS over real sockets with a lab CA made by LabCA: the client checks the CA and the name.
final class TLSTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func path(_ name: String) -> String { dir.appendingPathComponent(name).path }

    /// A CA and a server certificate for localhost and 127.0.0.1.
    func makeLab(_ prefix: String = "") throws {
        try LabCA.create(commonName: "test CA", days: 1, certificate: path(prefix + "ca.pem"), key: path(prefix + "ca-key.pem"))
        try LabCA.issue(caCertificate: path(prefix + "ca.pem"), caKey: path(prefix + "ca-key.pem"), commonName: "server",
                        names: ["localhost", "127.0.0.1"], days: 1, certificate: path(prefix + "cert.pem"), key: path(prefix + "key.pem"))
    }

    /// A TLS echo server on loopback: answers each read with the same bytes; one connection.
    func echoServer(_ tls: TLSContext) throws -> (port: UInt16, done: DispatchSemaphore, error: () -> Error?) {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        let done = DispatchSemaphore(value: 0)
        let box = ErrorBox()
        Thread {
            defer { close(fd); done.signal() }
            guard let c = Listener.accept(fd) else { return }
            do {
                let conn = try Connection.accepted(fd: c, name: "client", tls: tls, timeout: 5)
                var buf = [UInt8](repeating: 0, count: 70_000)
                while true {
                    let n = try conn.read(into: &buf)
                    if n == 0 { break }
                    try conn.write(Array(buf[0..<n]))
                }
                conn.close()
            } catch { box.error = error }
        }.start()
        return (port, done, { box.error })
    }

    func testRoundTripThroughTLSWithTheLabCA() throws {
        try makeLab()
        let server = try echoServer(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")))
        let client = try TLSContext(trusting: path("ca.pem"))
        for host in ["127.0.0.1"] {
            let c = try Connection.dial(host: host, port: server.port, timeout: 5, tls: client)
            XCTAssertTrue(c.isTLS)
            c.setTimeouts(seconds: 5)
            // More than one record (16 KB each) each way.
            let sent = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let writer = Thread { try? c.write(sent) }
            writer.start()
            var got = [UInt8]()
            var buf = [UInt8](repeating: 0, count: 65536)
            while got.count < sent.count {
                let n = try c.read(into: &buf)
                XCTAssertGreaterThan(n, 0)
                got += buf[0..<n]
            }
            XCTAssertEqual(got, sent)
            c.close()
        }
        XCTAssertEqual(server.done.wait(timeout: .now() + 10), .success)
        XCTAssertNil(server.error())
    }

    func testClientRefusesACertificateFromAnotherCA() throws {
        try makeLab()
        try makeLab("other-")
        let server = try echoServer(try TLSContext(certificate: path("other-cert.pem"), key: path("other-key.pem")))
        let client = try TLSContext(trusting: path("ca.pem"))
        XCTAssertThrowsError(try Connection.dial(host: "127.0.0.1", port: server.port, timeout: 5, tls: client)) { error in
            let e = error as? NetError
            XCTAssertEqual(e?.kind, .tls)
            XCTAssertTrue(e?.message.contains("certificate not trusted") == true, "\(error)")
            XCTAssertTrue(e?.message.contains("127.0.0.1:\(server.port)") == true, "names the address: \(error)")
        }
        _ = server.done.wait(timeout: .now() + 10)
    }

    func testClientRefusesACertificateForAnotherName() throws {
        try makeLab()
        try LabCA.issue(caCertificate: path("ca.pem"), caKey: path("ca-key.pem"), commonName: "elsewhere", names: ["elsewhere.lab"], days: 1,
                        certificate: path("elsewhere.pem"), key: path("elsewhere-key.pem"))
        let server = try echoServer(try TLSContext(certificate: path("elsewhere.pem"), key: path("elsewhere-key.pem")))
        let client = try TLSContext(trusting: path("ca.pem"))
        XCTAssertThrowsError(try Connection.dial(host: "127.0.0.1", port: server.port, timeout: 5, tls: client)) { error in
            XCTAssertEqual((error as? NetError)?.kind, .tls, "\(error)")
        }
        _ = server.done.wait(timeout: .now() + 10)
    }

    func testPlainClientAgainstTLSServerFailsCleanly() throws {
        try makeLab()
        let server = try echoServer(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")))
        let c = try Connection.dial(host: "127.0.0.1", port: server.port, timeout: 5)
        c.setTimeouts(seconds: 5)
        try c.write("GET / HTTP/1.1\r\n\r\n")
        var buf = [UInt8](repeating: 0, count: 1024)
        // The server's handshake fails on bytes that are not TLS; it closes (an alert, then EOF).
        var total = 0
        while true { let n = (try? c.read(into: &buf)) ?? 0; if n == 0 { break }; total += n }
        XCTAssertEqual(server.done.wait(timeout: .now() + 10), .success)
        XCTAssertEqual((server.error() as? NetError)?.kind, .tls)
    }

    /// Writes to a peer that has gone (it reset the connection, or closed it): the first write
    /// that meets it throws `.closed` (it never counts as "0 bytes written" and is never
    /// retried), and every later write throws at once, on TLS and plain streams alike.
    func testWritesToAPeerThatHasGoneFailAtOnce() throws {
        try makeLab()
        let serverTLS = try TLSContext(certificate: path("cert.pem"), key: path("key.pem"))
        let clientTLS = try TLSContext(trusting: path("ca.pem"))
        for (tls, reset) in [(true, true), (true, false), (false, true), (false, false)] {
            let (listener, port) = try Listener.listen(host: "127.0.0.1", port: 0)
            defer { close(listener) }
            let box = ErrorBox()
            let accepted = DispatchSemaphore(value: 0)
            let serverBox = ConnectionBox()
            Thread {
                defer { accepted.signal() }
                guard let fd = Listener.accept(listener) else { return }
                do { serverBox.connection = try Connection.accepted(fd: fd, name: "client", tls: tls ? serverTLS : nil, timeout: 5) } catch { box.error = error }
            }.start()
            let client = try Connection.dial(host: "127.0.0.1", port: port, timeout: 5, tls: tls ? clientTLS : nil)
            XCTAssertEqual(accepted.wait(timeout: .now() + 10), .success)
            let s = try XCTUnwrap(serverBox.connection, "\(String(describing: box.error))")
            s.setTimeouts(seconds: 5)
            if reset {
                var l = linger(l_onoff: 1, l_linger: 0)
                setsockopt(client.fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
            }
            client.close()
            // On a thread of its own, bounded: a write that retried for ever must fail the test,
            // not hang it.
            let record = [UInt8](repeating: 0x41, count: 1000)
            let results = ResultsBox()
            let done = DispatchSemaphore(value: 0)
            Thread {
                for _ in 0..<100 {
                    do { try s.write(record); results.add(nil) } catch { results.add(error) }
                }
                done.signal()
            }.start()
            XCTAssertEqual(done.wait(timeout: .now() + 30), .success, "tls \(tls) reset \(reset): a write never returned")
            let all = results.all
            // A closed (not reset) peer may take a write or two before its reset comes back.
            let firstFailure = try XCTUnwrap(all.firstIndex { $0 != nil }, "tls \(tls) reset \(reset): every write succeeded")
            XCTAssertLessThanOrEqual(firstFailure, 3, "tls \(tls) reset \(reset)")
            for e in all[firstFailure...] {
                XCTAssertEqual((e as? NetError)?.kind, .closed, "tls \(tls) reset \(reset): \(String(describing: e))")
            }
            s.close()
        }
    }

    func testKeysAreWrittenPrivate() throws {
        try makeLab()
        for key in ["ca-key.pem", "key.pem"] {
            var st = stat()
            XCTAssertEqual(stat(path(key), &st), 0)
            XCTAssertEqual(st.st_mode & 0o777, 0o600, key)
        }
        XCTAssertEqual(try LabCA.fingerprint(certificate: path("ca.pem")).count, 64)
    }

    func testMissingFilesAreNamed() {
        XCTAssertThrowsError(try TLSContext(trusting: path("none.pem"))) { error in
            XCTAssertTrue("\(error)".contains("none.pem"), "\(error)")
        }
        XCTAssertThrowsError(try TLSContext(certificate: path("c.pem"), key: path("k.pem"))) { error in
            XCTAssertTrue("\(error)".contains("c.pem"), "\(error)")
        }
    }
}

final class ErrorBox: @unchecked Sendable {
    var error: Error?
}

final class ConnectionBox: @unchecked Sendable {
    var connection: Connection?
}

final class ResultsBox: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [Error?] = []
    func add(_ e: Error?) { lock.withLock { results.append(e) } }
    var all: [Error?] { lock.withLock { results } }
}
