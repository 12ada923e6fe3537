import Crypto
import Foundation
import XCTest
import HeraldCore
import LabHTTP
@testable import LabNet
import LabTestSupport
import NIOCore
import NIOEmbedded
import NIOSSL
import SwiftASN1
import X509
#if canImport(Glibc)
import Glibc
#endif

/// The lab CA on swift-certificates: what its certificates hold, that swift-nio-ssl takes them
/// both ways (a server's for a name, an IPv4 and an IPv6 address; a client's checked against the
/// CA), that another CA's are refused, that a CA the old C code made still issues, its files and
/// its errors.
final class LabCATests: XCTestCase {
    var dir: URL!
    var services: [HTTPService] = []

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("labca-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
        LabTrust.forget()
        try FileManager.default.removeItem(at: dir)
    }

    func path(_ name: String) -> String { dir.appendingPathComponent(name).path }

    /// A CA as `<prefix>ca.pem` and `<prefix>ca-key.pem`.
    func makeCA(_ prefix: String = "", days: Int = 1) throws {
        try LabCA.create(commonName: "\(prefix)test CA", days: days, certificate: path(prefix + "ca.pem"), key: path(prefix + "ca-key.pem"))
    }

    /// `<name>.pem` and `<name>-key.pem`, issued by the CA `<ca>ca.pem`.
    func issue(_ name: String, names: [String], by ca: String = "", days: Int = 1) throws {
        try LabCA.issue(caCertificate: path(ca + "ca.pem"), caKey: path(ca + "ca-key.pem"), commonName: name, names: names, days: days,
                        certificate: path(name + ".pem"), key: path(name + "-key.pem"))
    }

    func certificate(_ name: String) throws -> Certificate {
        try Certificate(pemEncoded: String(contentsOfFile: path(name), encoding: .utf8))
    }

    /// Writes the old C code's CA (the fixture) as old-ca.pem and old-ca-key.pem.
    func writeOldCA() throws {
        try OldLabCA.certificate.write(toFile: path("old-ca.pem"), atomically: false, encoding: .utf8)
        try OldLabCA.key.write(toFile: path("old-ca-key.pem"), atomically: false, encoding: .utf8)
    }

    // MARK: - Handshakes with swift-nio-ssl

    /// A server certificate issued for `names` by `<ca>ca.pem` (both CAs made here), served by an
    /// HTTPService over TLS on `host`; GET /health from LabClient (both swift-nio-ssl) at
    /// https://`host`:port, trusting the lab CA ca.pem only.
    func health(names: [String], by ca: String = "", host: String) async throws -> String? {
        try makeCA()
        if ca != "" { try makeCA(ca) }
        try issue("server", names: names, by: ca)
        let service = HTTPService(name: "test", token: nil, logger: LogCapture.quiet())
        let port = try await service.start(host: host, port: 0, tls: try TLSContext(certificate: path("server.pem"), key: path("server-key.pem")))
        services.append(service)
        try LabTrust.trust(caFile: path("ca.pem"))
        let health: [String: String] = try await LabClient(base: URL(string: "https://\(HostPort.urlHost(host)):\(port)")!, token: nil).call("GET", "/health")
        return health["status"]
    }

    /// The same, refused: a TLS failure, before any answer.
    func assertRefused(names: [String], by ca: String = "", host: String, _ what: String) async throws {
        do {
            _ = try await health(names: names, by: ca, host: host)
            XCTFail(what)
        } catch let f as LabClient.Failure {
            XCTAssertNil(f.status)
            XCTAssertTrue(f.message.contains("TLS"), f.message)
        }
    }

    func testServerCertificateForAHostName() async throws {
        let status = try await health(names: ["localhost"], host: "localhost")
        XCTAssertEqual(status, "ok")
    }

    func testServerCertificateForAnIPv4Address() async throws {
        let status = try await health(names: ["127.0.0.1"], host: "127.0.0.1")
        XCTAssertEqual(status, "ok")
    }

    func testServerCertificateForAnIPv6AddressGivenInBrackets() async throws {
        try requireIPv6Loopback()
        let status = try await health(names: ["[::1]"], host: "::1")
        XCTAssertEqual(status, "ok")
    }

    /// The names are what the certificate is good for: one for localhost only is refused at 127.0.0.1.
    func testServerCertificateIsRefusedForAnAddressItDoesNotName() async throws {
        try await assertRefused(names: ["localhost"], host: "127.0.0.1", "a certificate for localhost was taken at 127.0.0.1")
    }

    func testServerCertificateFromAnotherCAIsRefused() async throws {
        try await assertRefused(names: ["127.0.0.1"], by: "other-", host: "127.0.0.1", "a server certificate another CA signed was taken")
    }

    /// What one in-memory TLS session between swift-nio-ssl's client and server came to.
    struct Session {
        /// What the server read of the client's "hello" (only after both ends finished the handshake).
        var serverRead: String?
        /// The client certificate the server verified.
        var clientCertificate: NIOSSLCertificate?
        var serverError: Error?
    }

    /// A handshake in memory (two EmbeddedChannels, bytes handed over until none move) between
    /// a server presenting `<server>.pem` that asks for a client certificate signed by
    /// `<serverTrusts>ca.pem`, and a client presenting `<client>.pem` that checks the server
    /// against `<clientTrusts>ca.pem` and the name localhost; then the client writes "hello".
    func session(server: String, client: String, serverTrusts: String = "", clientTrusts: String = "") throws -> Session {
        // The product's check of the files first, then configurations of the test's own (the
        // product's contexts ask for no client certificate).
        _ = try TLSContext(certificate: path(server + ".pem"), key: path(server + "-key.pem"))
        _ = try TLSContext(trusting: path(clientTrusts + "ca.pem"))
        var serverConfiguration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(path(server + ".pem")).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: path(server + "-key.pem"), format: .pem)))
        serverConfiguration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(path(serverTrusts + "ca.pem")))
        serverConfiguration.certificateVerification = .noHostnameVerification
        var clientConfiguration = TLSConfiguration.makeClientConfiguration()
        clientConfiguration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(path(clientTrusts + "ca.pem")))
        clientConfiguration.certificateVerification = .fullVerification
        clientConfiguration.certificateChain = try NIOSSLCertificate.fromPEMFile(path(client + ".pem")).map { .certificate($0) }
        clientConfiguration.privateKey = .privateKey(try NIOSSLPrivateKey(file: path(client + "-key.pem"), format: .pem))

        let c = EmbeddedChannel(), s = EmbeddedChannel()
        try c.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: NIOSSLContext(configuration: clientConfiguration), serverHostname: "localhost"))
        try s.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: try NIOSSLContext(configuration: serverConfiguration)))
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        try s.connect(to: address).wait()
        try c.connect(to: address).wait()
        c.writeAndFlush(ByteBuffer(string: "hello"), promise: nil)
        var result = Session()
        func handOver() throws {
            var moved = true, rounds = 0
            while moved && rounds < 100 {
                moved = false
                rounds += 1
                while let bytes = try c.readOutbound(as: ByteBuffer.self) {
                    moved = true
                    do { try s.writeInbound(bytes) } catch { result.serverError = result.serverError ?? error }
                }
                while let bytes = try s.readOutbound(as: ByteBuffer.self) {
                    moved = true
                    do { try c.writeInbound(bytes) } catch {} // the client's side of a refusal is the server's alert
                }
            }
        }
        try handOver()
        if s.isActive, let read = try s.readInbound(as: ByteBuffer.self) {
            result.serverRead = String(buffer: read)
            result.clientCertificate = try s.pipeline.syncOperations.nioSSL_peerCertificate()
        }
        // Closed both ways (close_notify handed over, the shutdown timers run out) before the end.
        c.close(promise: nil)
        s.close(promise: nil)
        try handOver()
        c.embeddedEventLoop.advanceTime(by: .seconds(60))
        s.embeddedEventLoop.advanceTime(by: .seconds(60))
        for channel in [c, s] {
            do { _ = try channel.finish(acceptAlreadyClosed: true) } catch {} // what is left over does not matter here
        }
        return result
    }

    func testClientCertificateIsVerifiedAgainstTheCA() throws {
        try makeCA()
        try issue("server", names: ["localhost"])
        try issue("agent", names: [])
        let s = try session(server: "server", client: "agent")
        XCTAssertNil(s.serverError)
        XCTAssertEqual(s.serverRead, "hello")
        XCTAssertEqual(s.clientCertificate, try NIOSSLCertificate.fromPEMFile(path("agent.pem")).first, "the server saw the agent's certificate")
    }

    func testClientCertificateFromAnotherCAIsRefused() throws {
        try makeCA()
        try makeCA("other-")
        try issue("server", names: ["localhost"])
        try issue("stranger", names: [], by: "other-")
        let s = try session(server: "server", client: "stranger")
        XCTAssertNil(s.serverRead, "the server read from a client another CA vouched for")
        let error = try XCTUnwrap(s.serverError, "the server took a client certificate another CA signed")
        XCTAssertTrue("\(error)".contains("CERTIFICATE_VERIFY_FAILED"), "\(error)")
    }

    // MARK: - What the certificates hold

    /// What every certificate made here is: X.509 v3, a P-256 key, O=HeraldLab and the common
    /// name, signed by `issuer` with ECDSA and SHA-256, a positive serial of at most 16 bytes,
    /// valid from an hour ago for `days`.
    func assertMadeHere(_ cert: Certificate, commonName: String, issuer: Certificate, days: Int,
                        file: StaticString = #filePath, line: UInt = #line) throws {
        XCTAssertEqual(cert.version, .v3, file: file, line: line)
        XCTAssertEqual(cert.signatureAlgorithm, .ecdsaWithSHA256, file: file, line: line)
        XCTAssertNotNil(P256.Signing.PublicKey(cert.publicKey), "a P-256 key", file: file, line: line)
        XCTAssertEqual(cert.subject, try DistinguishedName { OrganizationName("HeraldLab"); CommonName(commonName) }, file: file, line: line)
        XCTAssertEqual(cert.issuer, issuer.subject, file: file, line: line)
        XCTAssertTrue(issuer.publicKey.isValidSignature(cert.signature, for: cert), "signed by the issuer", file: file, line: line)
        XCTAssertLessThanOrEqual(cert.serialNumber.bytes.count, 16, file: file, line: line)
        XCTAssertLessThan(cert.serialNumber.bytes.first ?? 0xFF, 0x80, "positive", file: file, line: line)
        XCTAssertEqual(cert.notValidBefore.timeIntervalSinceNow, -3600, accuracy: 60, file: file, line: line)
        XCTAssertEqual(cert.notValidAfter.timeIntervalSinceNow, Double(days) * 86400, accuracy: 60, file: file, line: line)
    }

    /// Every serial is 16 bytes and positive (1 in 128 once lost its leading byte and read as
    /// negative); 20,000 draws, so the old rule failed this with probability 1 - (127/128)^20000.
    func testEverySerialIsSixteenPositiveBytes() {
        for _ in 0..<20_000 {
            let bytes = Array(LabCA.serial().bytes)
            XCTAssertEqual(bytes.count, 16)
            XCTAssertTrue((1...0x7F).contains(bytes[0]), "\(bytes)")
        }
    }

    func testCACertificateHoldsWhatTheCodeWrote() throws {
        try makeCA(days: 30)
        let ca = try certificate("ca.pem")
        try assertMadeHere(ca, commonName: "test CA", issuer: ca, days: 30)
        XCTAssertEqual(ca.extensions.map(\.oid), [.X509ExtensionID.basicConstraints, .X509ExtensionID.keyUsage, .X509ExtensionID.subjectKeyIdentifier])
        XCTAssertEqual(ca.extensions[oid: .X509ExtensionID.basicConstraints]?.critical, true)
        XCTAssertEqual(try ca.extensions.basicConstraints, .isCertificateAuthority(maxPathLength: 0))
        XCTAssertEqual(ca.extensions[oid: .X509ExtensionID.keyUsage]?.critical, true)
        XCTAssertEqual(try ca.extensions.keyUsage, KeyUsage(keyCertSign: true, cRLSign: true))
        XCTAssertEqual(ca.extensions[oid: .X509ExtensionID.subjectKeyIdentifier]?.critical, false)
        XCTAssertEqual(try ca.extensions.subjectKeyIdentifier, SubjectKeyIdentifier(hash: ca.publicKey))
    }

    func testIssuedCertificateHoldsWhatTheCodeWrote() throws {
        try makeCA()
        try issue("server", names: ["server.lab", "10.0.0.5", "[fd00::5]", "::1"], days: 10)
        let ca = try certificate("ca.pem"), leaf = try certificate("server.pem")
        try assertMadeHere(leaf, commonName: "server", issuer: ca, days: 10)
        XCTAssertNotEqual(leaf.serialNumber, ca.serialNumber)
        XCTAssertEqual(leaf.extensions.map(\.oid), [.X509ExtensionID.basicConstraints, .X509ExtensionID.keyUsage, .X509ExtensionID.extendedKeyUsage,
                                                    .X509ExtensionID.authorityKeyIdentifier, .X509ExtensionID.subjectAlternativeName])
        XCTAssertEqual(leaf.extensions.map(\.critical), [true, true, false, false, false])
        XCTAssertEqual(try leaf.extensions.basicConstraints, .notCertificateAuthority)
        XCTAssertEqual(try leaf.extensions.keyUsage, KeyUsage(digitalSignature: true, keyEncipherment: true))
        XCTAssertEqual(try leaf.extensions.extendedKeyUsage, try ExtendedKeyUsage([.serverAuth, .clientAuth]))
        XCTAssertEqual(try leaf.extensions.authorityKeyIdentifier?.keyIdentifier, try ca.extensions.subjectKeyIdentifier?.keyIdentifier)
        XCTAssertEqual(try leaf.extensions.subjectAlternativeNames, SubjectAlternativeNames([
            .dnsName("server.lab"),
            .ipAddress(ASN1OctetString(contentBytes: [10, 0, 0, 5])),
            .ipAddress(ASN1OctetString(contentBytes: [0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5])),
            .ipAddress(ASN1OctetString(contentBytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])),
        ]))

        // The key: PKCS#8 PEM, as OpenSSL's PEM_write_PrivateKey wrote it, the certificate's.
        let keyText = try String(contentsOfFile: path("server-key.pem"), encoding: .utf8)
        XCTAssertTrue(keyText.hasPrefix("-----BEGIN PRIVATE KEY-----\n"), keyText)
        XCTAssertTrue(keyText.hasSuffix("-----END PRIVATE KEY-----\n"), keyText)
        XCTAssertEqual(try Certificate.PrivateKey(pemEncoded: keyText).publicKey, leaf.publicKey)
        XCTAssertTrue(try String(contentsOfFile: path("server.pem"), encoding: .utf8).hasSuffix("-----END CERTIFICATE-----\n"))
    }

    /// No names, no subjectAltName (as ctls_issue): a client certificate names no host.
    func testIssuedWithoutNamesHasNoSubjectAltName() throws {
        try makeCA()
        try issue("agent", names: [])
        let leaf = try certificate("agent.pem")
        XCTAssertEqual(leaf.extensions.count, 4)
        XCTAssertNil(leaf.extensions[oid: .X509ExtensionID.subjectAlternativeName])
    }

    // MARK: - A CA made by the old C code

    /// The old C code's CA issues with the new code: the same extensions, byte for byte, as the
    /// leaf the C code issued for the same names; signed by that CA; taken by swift-nio-ssl as
    /// a server's and as a client's certificate.
    func testCAMadeByTheOldCodeIssuesCertificatesThatVerify() throws {
        try writeOldCA()
        try LabCA.issue(caCertificate: path("old-ca.pem"), caKey: path("old-ca-key.pem"), commonName: "server", names: ["localhost", "127.0.0.1", "::1"],
                        days: 1, certificate: path("server.pem"), key: path("server-key.pem"))
        let ca = try Certificate(pemEncoded: OldLabCA.certificate), old = try Certificate(pemEncoded: OldLabCA.leaf)
        let leaf = try certificate("server.pem")
        XCTAssertTrue(ca.publicKey.isValidSignature(leaf.signature, for: leaf), "signed by the old CA")
        XCTAssertEqual(leaf.issuer, old.issuer)
        XCTAssertEqual(leaf.subject, old.subject)
        XCTAssertEqual(leaf.signatureAlgorithm, old.signatureAlgorithm)
        XCTAssertEqual(Array(leaf.extensions), Array(old.extensions))

        try LabCA.issue(caCertificate: path("old-ca.pem"), caKey: path("old-ca-key.pem"), commonName: "agent", names: [], days: 1,
                        certificate: path("agent.pem"), key: path("agent-key.pem"))
        let s = try session(server: "server", client: "agent", serverTrusts: "old-", clientTrusts: "old-")
        XCTAssertNil(s.serverError)
        XCTAssertEqual(s.serverRead, "hello")
    }

    /// The fingerprint is the old one, to the letter: ctls_fingerprint gave this for the fixture.
    func testFingerprintIsTheOldCodesText() throws {
        try writeOldCA()
        XCTAssertEqual(try LabCA.fingerprint(certificate: path("old-ca.pem")), "ffab162d987903d48ca92d60c5872ae8c2951e756cbef7e064b9cf66184252df")
        try makeCA()
        let der = try Certificate(pemEncoded: String(contentsOfFile: path("ca.pem"), encoding: .utf8)).serializeAsPEM().derBytes
        XCTAssertEqual(try LabCA.fingerprint(certificate: path("ca.pem")), HeraldCore.SHA256.hash(Data(der)))
    }

    // MARK: - Files

    /// Keys are 0600 whatever the umask and whatever was there before; nothing else is left in the folder.
    func testKeyFilesAreMode0600AndNothingIsLeftBehind() throws {
        try "an old, world-readable key\n".write(toFile: path("ca-key.pem"), atomically: false, encoding: .utf8)
        chmod(path("ca-key.pem"), 0o644)
        let old = umask(0)
        defer { umask(old) }
        try makeCA()
        try issue("server", names: ["localhost"])
        for key in ["ca-key.pem", "server-key.pem"] {
            var st = stat()
            XCTAssertEqual(stat(path(key), &st), 0)
            XCTAssertEqual(st.st_mode & 0o777, 0o600, key)
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted(), ["ca-key.pem", "ca.pem", "server-key.pem", "server.pem"])
    }

    func testAFolderThatIsNotThereIsNamed() {
        XCTAssertThrowsError(try LabCA.create(commonName: "t", days: 1, certificate: path("none/ca.pem"), key: path("none/ca-key.pem"))) {
            assertNamed($0, path("none/ca-key.pem"), "No such file or directory")
        }
    }

    // MARK: - Errors

    func assertNamed(_ error: Error, _ parts: String..., file: StaticString = #filePath, line: UInt = #line) {
        guard let e = error as? NetError else { return XCTFail("not a NetError: \(error)", file: file, line: line) }
        XCTAssertEqual(e.kind, .tls, file: file, line: line)
        for p in parts { XCTAssertTrue(e.message.contains(p), "\(e.message) does not say \(p)", file: file, line: line) }
    }

    func testAMissingCAKeyIsNamed() throws {
        try makeCA()
        try FileManager.default.removeItem(atPath: path("ca-key.pem"))
        XCTAssertThrowsError(try issue("server", names: ["localhost"])) { assertNamed($0, "cannot read the CA key", path("ca-key.pem"), "No such file or directory") }
        XCTAssertFalse(FileManager.default.fileExists(atPath: path("server.pem")))
        XCTAssertFalse(FileManager.default.fileExists(atPath: path("server-key.pem")))
    }

    func testGarbledFilesAreNamed() throws {
        try makeCA()
        let good = try String(contentsOfFile: path("ca.pem"), encoding: .utf8)
        let key = try String(contentsOfFile: path("ca-key.pem"), encoding: .utf8)
        let cases: [(file: String, text: String, problem: String)] = [
            ("ca.pem", "not PEM at all\n", "no PEM certificate"),
            ("ca.pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "PEM is garbled"),
            ("ca.pem", key.replacingOccurrences(of: "PRIVATE KEY", with: "CERTIFICATE"), "certificate is garbled"),
            ("ca.pem", String(good.dropLast(40)), "PEM is garbled"),
            ("ca-key.pem", good, "no PEM private key"),
            ("ca-key.pem", good.replacingOccurrences(of: "CERTIFICATE", with: "PRIVATE KEY"), "PRIVATE KEY is garbled"),
        ]
        for c in cases {
            try makeCA()
            try c.text.write(toFile: path(c.file), atomically: false, encoding: .utf8)
            let what = c.file == "ca.pem" ? "the CA certificate" : "the CA key"
            XCTAssertThrowsError(try issue("server", names: ["localhost"]), "\(c.file): \(c.text)") { assertNamed($0, "cannot read \(what) \(path(c.file))", c.problem) }
        }
        try "garbage".write(toFile: path("x.pem"), atomically: false, encoding: .utf8)
        XCTAssertThrowsError(try LabCA.fingerprint(certificate: path("x.pem"))) { assertNamed($0, "cannot read the certificate \(path("x.pem"))", "no PEM certificate") }
        XCTAssertThrowsError(try LabCA.fingerprint(certificate: path("none.pem"))) { assertNamed($0, path("none.pem"), "No such file or directory") }
        XCTAssertThrowsError(try LabCA.fingerprint(certificate: dir.path)) { assertNamed($0, dir.path, "not a regular file") }
    }

    func testAKeyThatIsNotTheCAsIsRefused() throws {
        try makeCA()
        try makeCA("other-")
        XCTAssertThrowsError(try LabCA.issue(caCertificate: path("ca.pem"), caKey: path("other-ca-key.pem"), commonName: "server", names: [], days: 1,
                                             certificate: path("server.pem"), key: path("server-key.pem"))) {
            assertNamed($0, "the CA key \(path("other-ca-key.pem")) is not the key of the CA certificate \(path("ca.pem"))")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: path("server.pem")))
    }

    func testDaysOutOfRangeAreRefusedAndWriteNothing() throws {
        for days in [0, -1, Int.min, 36_501, Int.max] {
            XCTAssertThrowsError(try makeCA(days: days), "\(days)") { assertNamed($0, "days must be between 1 and 36500, not \(days)") }
            XCTAssertFalse(FileManager.default.fileExists(atPath: path("ca.pem")))
            XCTAssertFalse(FileManager.default.fileExists(atPath: path("ca-key.pem")))
        }
        try makeCA()
        XCTAssertThrowsError(try issue("server", names: ["localhost"], days: 0)) { assertNamed($0, "days must be between 1 and 36500, not 0") }
        XCTAssertNoThrow(try issue("server", names: ["localhost"], days: 36_500))
    }

    func testBadNamesAreRefused() throws {
        try makeCA()
        for bad in ["", "[]", "a,b", "two words", "ünï.lab"] {
            XCTAssertThrowsError(try issue("server", names: [bad]), bad) { assertNamed($0, "\"\(bad)\" is not a host name or an IP address") }
        }
        XCTAssertThrowsError(try LabCA.create(commonName: "", days: 1, certificate: path("x.pem"), key: path("x-key.pem"))) { assertNamed($0, "common name") }
        XCTAssertThrowsError(try LabCA.create(commonName: String(repeating: "n", count: 65), days: 1, certificate: path("x.pem"), key: path("x-key.pem"))) { assertNamed($0, "common name") }
    }
}
