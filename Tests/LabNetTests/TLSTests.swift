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
