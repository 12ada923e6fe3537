import Foundation
import XCTest
import LabNet
import LabTestSupport
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

    /// A TLS echo server on loopback (swift-nio-ssl with the product's server context): answers
    /// each read with the same bytes; one connection. `error` is why it failed (its handshake).
    func echoServer(_ tls: TLSContext) throws -> (port: UInt16, done: DispatchSemaphore, error: () -> Error?) {
        let server = try TestServer(tls: tls)
        let done = DispatchSemaphore(value: 0)
        let box = ErrorBox()
        Thread {
            defer { server.close(); done.signal() }
            do {
                let conn = try server.accept()
                while true {
                    let got = try conn.read()
                    if got.isEmpty { break }
                    try conn.write(got)
                }
                conn.close()
            } catch { box.error = error }
        }.start()
        return (server.port, done, { box.error })
    }

    func testRoundTripThroughTLSWithTheLabCA() throws {
        try makeLab()
        let server = try echoServer(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")))
        let client = try TLSContext(trusting: path("ca.pem"))
        for host in ["127.0.0.1"] {
            let c = try TestStream.connect(host: host, port: server.port, timeout: 5, tls: client)
            XCTAssertTrue(c.isTLS)
            // More than one record (16 KB each) each way.
            let sent = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let writer = Thread {
                do { try c.write(sent) } catch { XCTFail("write: \(error)") }
            }
            writer.start()
            let got = try c.read { $0.count >= sent.count }
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
        XCTAssertThrowsError(try TestStream.connect(host: "127.0.0.1", port: server.port, timeout: 5, tls: client)) { error in
            let e = error as? StreamError
            XCTAssertEqual(e?.kind, .tls, "\(error)")
            XCTAssertEqual(e?.refusal, .untrusted, "\(error)")
            XCTAssertTrue(e?.message.contains("127.0.0.1:\(server.port)") == true, "names the address: \(error)")
        }
        XCTAssertEqual(server.done.wait(timeout: .now() + 10), .success)
        // The server saw its handshake refused too (the client's alert).
        XCTAssertEqual((server.error() as? StreamError)?.kind, .tls, "\(String(describing: server.error()))")
    }

    func testClientRefusesACertificateForAnotherName() throws {
        try makeLab()
        try LabCA.issue(caCertificate: path("ca.pem"), caKey: path("ca-key.pem"), commonName: "elsewhere", names: ["elsewhere.lab"], days: 1,
                        certificate: path("elsewhere.pem"), key: path("elsewhere-key.pem"))
        let client = try TLSContext(trusting: path("ca.pem"))
        for host in ["127.0.0.1", "localhost"] {
            let server = try echoServer(try TLSContext(certificate: path("elsewhere.pem"), key: path("elsewhere-key.pem")))
            defer { _ = server.done.wait(timeout: .now() + 10) }
            XCTAssertThrowsError(try TestStream.connect(host: host, port: server.port, timeout: 5, tls: client), host) { error in
                XCTAssertEqual((error as? StreamError)?.kind, .tls, "\(error)")
                XCTAssertEqual((error as? StreamError)?.refusal, .wrongName, "\(error)")
            }
        }
    }

    /// A certificate for 127.0.0.1 and localhost is taken by address and by name (the IP SAN
    /// and the DNS SAN), the same CA's certificate for another address is not.
    func testTheAddressDialledIsCheckedAgainstTheIPNames() throws {
        try makeLab()
        let client = try TLSContext(trusting: path("ca.pem"))
        for host in ["127.0.0.1", "localhost"] {
            let server = try echoServer(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")))
            let c = try TestStream.connect(host: host, port: server.port, timeout: 5, tls: client)
            try c.write("ping")
            XCTAssertEqual(String(decoding: try c.read { $0.count >= 4 }, as: UTF8.self), "ping", host)
            c.close()
            XCTAssertEqual(server.done.wait(timeout: .now() + 10), .success)
        }
        try LabCA.issue(caCertificate: path("ca.pem"), caKey: path("ca-key.pem"), commonName: "other", names: ["127.0.0.2"], days: 1,
                        certificate: path("other-ip.pem"), key: path("other-ip-key.pem"))
        let server = try echoServer(try TLSContext(certificate: path("other-ip.pem"), key: path("other-ip-key.pem")))
        XCTAssertThrowsError(try TestStream.connect(host: "127.0.0.1", port: server.port, timeout: 5, tls: client)) { error in
            XCTAssertEqual((error as? StreamError)?.refusal, .wrongName, "\(error)")
        }
        _ = server.done.wait(timeout: .now() + 10)
    }

    func testPlainClientAgainstTLSServerFailsCleanly() throws {
        try makeLab()
        let server = try echoServer(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")))
        let c = try TestStream.connect(host: "127.0.0.1", port: server.port, timeout: 5)
        try c.write("GET / HTTP/1.1\r\n\r\n")
        // The server's handshake fails on bytes that are not TLS; it closes (an alert, then EOF).
        do { _ = try c.readToEnd() } catch let e as StreamError where e.kind == .closed {
            // The server may reset rather than close: gone either way.
        }
        XCTAssertEqual(server.done.wait(timeout: .now() + 10), .success)
        let refused = server.error() as? StreamError
        XCTAssertEqual(refused?.kind, .tls, "\(String(describing: server.error()))")
        XCTAssertEqual(refused?.refusal, .notTLS, "\(String(describing: server.error()))")
    }

    /// Writes to a peer that has gone (it reset the connection, or closed it): the first write
    /// that meets it throws `.closed` (it never counts as "0 bytes written" and is never
    /// retried), and every later write throws at once, on TLS streams (swift-nio-ssl, the
    /// product's contexts) and plain LabNet connections alike.
    func testWritesToAPeerThatHasGoneFailAtOnce() throws {
        try makeLab()
        let serverTLS = try TLSContext(certificate: path("cert.pem"), key: path("key.pem"))
        let clientTLS = try TLSContext(trusting: path("ca.pem"))
        for (tls, reset) in [(true, true), (true, false), (false, true), (false, false)] {
            let server = try TestServer(tls: tls ? serverTLS : nil)
            defer { server.close() }
            let client = try TestStream.connect(host: "127.0.0.1", port: server.port, timeout: 5, tls: tls ? clientTLS : nil)
            let s = try server.accept()
            s.timeout = 5
            if reset { try client.reset() } else { client.close() }
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
                XCTAssertEqual((e as? StreamError)?.kind, .closed, "tls \(tls) reset \(reset): \(String(describing: e))")
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
            XCTAssertEqual((error as? NetError)?.kind, .tls, "\(error)")
            XCTAssertTrue("\(error)".contains("none.pem"), "\(error)")
            XCTAssertTrue("\(error)".contains("no such file"), "\(error)")
        }
        XCTAssertThrowsError(try TLSContext(certificate: path("c.pem"), key: path("k.pem"))) { error in
            XCTAssertEqual((error as? NetError)?.kind, .tls, "\(error)")
            XCTAssertTrue("\(error)".contains("c.pem"), "\(error)")
        }
    }

    /// Files that are there but wrong are refused at init, each named: a certificate file with
    /// no certificate, a key that is not a key, a key that is not the certificate's.
    func testBadFilesAreRefusedAtInit() throws {
        try makeLab()
        try makeLab("other-")
        try Data("not a certificate\n".utf8).write(to: dir.appendingPathComponent("junk.pem"))
        XCTAssertThrowsError(try TLSContext(trusting: path("junk.pem"))) { error in
            XCTAssertEqual((error as? NetError)?.kind, .tls, "\(error)")
            XCTAssertTrue("\(error)".hasPrefix(path("junk.pem") + ": cannot load the CA certificates"), "\(error)")
        }
        XCTAssertThrowsError(try TLSContext(certificate: path("junk.pem"), key: path("key.pem"))) { error in
            XCTAssertTrue("\(error)".hasPrefix(path("junk.pem") + ": cannot load the certificate chain"), "\(error)")
        }
        XCTAssertThrowsError(try TLSContext(certificate: path("cert.pem"), key: path("junk.pem"))) { error in
            XCTAssertTrue("\(error)".hasPrefix(path("junk.pem") + ": cannot load the private key"), "\(error)")
        }
        XCTAssertThrowsError(try TLSContext(certificate: path("cert.pem"), key: path("other-key.pem"))) { error in
            XCTAssertEqual((error as? NetError)?.kind, .tls, "\(error)")
            XCTAssertTrue("\(error)".hasPrefix(path("other-key.pem") + ": the private key does not pair with the certificate in " + path("cert.pem")), "\(error)")
        }
        // The CA's own certificate (keyCertSign only) cannot serve: named as such, not as a key
        // that does not pair.
        XCTAssertThrowsError(try TLSContext(certificate: path("ca.pem"), key: path("ca-key.pem"))) { error in
            XCTAssertTrue("\(error)".hasPrefix(path("ca.pem") + ": this certificate cannot serve TLS"), "\(error)")
        }
        XCTAssertTrue(try TLSContext(certificate: path("cert.pem"), key: path("key.pem")).isServer)
        XCTAssertEqual(try TLSContext(trusting: path("ca.pem")).material, .client(trusting: path("ca.pem")))
    }
}

final class ErrorBox: @unchecked Sendable {
    var error: Error?
}

final class ResultsBox: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [Error?] = []
    func add(_ e: Error?) { lock.withLock { results.append(e) } }
    var all: [Error?] { lock.withLock { results } }
}
