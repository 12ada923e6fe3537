import Foundation
import XCTest
import LabHTTP
import LabNet
import LabTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab run` exits 2 on every error reaching the coordinator (1 means only that the
/// plan's verdict failed), and `--insecure` listens on loopback only, by address (issue 19,
/// items 6 and 7). The coordinators here are HTTPServices in this process.
final class SubmissionErrorTests: XCTestCase {
    var lab: LabProcesses?
    var services: [HTTPService] = []

    override func tearDown() async throws {
        for s in services { await s.stop() }
        services = []
        lab?.stopAll()
        lab = nil
    }

    func makeLab() throws -> LabProcesses {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        return lab
    }

    /// A CA folder `name` with ca.pem, and a server certificate for `names` signed by it.
    func ca(_ lab: LabProcesses, _ name: String, names: [String] = ["127.0.0.1"]) throws -> (folder: URL, server: TLSContext) {
        let dir = lab.dir.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        func p(_ f: String) -> String { dir.appendingPathComponent(f).path }
        try LabCA.create(commonName: name, days: 1, certificate: p("ca.pem"), key: p("ca-key.pem"))
        try LabCA.issue(caCertificate: p("ca.pem"), caKey: p("ca-key.pem"), commonName: "coordinator", names: names, days: 1,
                        certificate: p("server-cert.pem"), key: p("server-key.pem"))
        return (dir, try TLSContext(certificate: p("server-cert.pem"), key: p("server-key.pem")))
    }

    func service(tls: TLSContext?) async throws -> UInt16 {
        let s = HTTPService(name: "coordinator", token: lab!.token, logger: LogCapture.quiet())
        services.append(s)
        return try await s.start(host: "127.0.0.1", port: 0, tls: tls)
    }

    func testRunExitsTwoOnEveryErrorReachingTheCoordinator() async throws {
        let lab = try makeLab()
        let plan = lab.dir.appendingPathComponent("p.yaml")
        try LabProcesses.plan("p", nodes: 2, duration: "10s").write(to: plan, atomically: true, encoding: .utf8)
        let labCA = try ca(lab, "lab-ca")
        let otherCA = try ca(lab, "other-ca")
        let wrongName = try ca(lab, "name-ca", names: ["localhost"])
        let tlsPort = try await service(tls: labCA.server)
        let otherPort = try await service(tls: otherCA.server)
        let namePort = try await service(tls: wrongName.server)
        let plainPort = try await service(tls: nil)
        // A listener that accepts and hangs up at once (a peer that is gone).
        let (hangup, hangupPort) = try Listener.listen(host: "127.0.0.1", port: 0)
        defer { close(hangup) }
        Thread { while let fd = Listener.accept(hangup) { close(fd) } }.start()
        let refused = try { () throws -> UInt16 in
            let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
            close(fd)
            return port
        }()

        let cases: [(what: String, url: String, credentials: URL?)] = [
            ("refused", "http://127.0.0.1:\(refused)", nil),
            ("DNS", "http://no-such-host.invalid:8700", nil),
            ("http against https", "http://127.0.0.1:\(tlsPort)", nil),
            ("https against http", "https://127.0.0.1:\(plainPort)", labCA.folder),
            ("another CA", "https://127.0.0.1:\(otherPort)", labCA.folder),
            ("a certificate for another name", "https://127.0.0.1:\(namePort)", wrongName.folder),
            ("a peer that hangs up", "http://127.0.0.1:\(hangupPort)", nil),
            ("a peer that hangs up during TLS", "https://127.0.0.1:\(hangupPort)", labCA.folder),
        ]
        for c in cases {
            var args = ["run", plan.path, "--coordinator", c.url, "--token-file", lab.tokenFile.path, "--out", lab.dir.appendingPathComponent("out").path]
            if let f = c.credentials { args += ["--credentials", f.path] }
            let (code, out) = try lab.cli(args, environment: ["PATH": "/usr/bin:/bin"], timeout: 60)
            XCTAssertEqual(code, 2, "\(c.what): \(out)")
            XCTAssertTrue(out.contains("herald-lab run: cannot submit the plan to \(c.url)"), "\(c.what): \(out)")
        }
        // A listing says the request once, then why.
        let (listCode, listOut) = try lab.cli(["agents", "--coordinator", "http://127.0.0.1:\(refused)", "--token-file", lab.tokenFile.path],
                                              environment: ["PATH": "/usr/bin:/bin"], timeout: 60)
        XCTAssertEqual(listCode, 2, listOut)
        XCTAssertTrue(listOut.contains("herald-lab: GET http://127.0.0.1:\(refused)/v1/agents: cannot connect to 127.0.0.1:\(refused): Connection refused"), listOut)
        XCTAssertEqual(listOut.components(separatedBy: "GET ").count, 2, "the request named once: \(listOut)")
        // The right CA reaches it (the stand-in coordinator has no /v1/runs: 404, still exit 2,
        // as a refusal).
        let (code, out) = try lab.cli(["run", plan.path, "--coordinator", "https://127.0.0.1:\(tlsPort)", "--token-file", lab.tokenFile.path,
                                       "--credentials", labCA.folder.path], environment: ["PATH": "/usr/bin:/bin"], timeout: 60)
        XCTAssertEqual(code, 2, out)
        XCTAssertTrue(out.contains("refused the plan (HTTP 404)"), out)
    }

    /// `--insecure` resolves --host and binds only a loopback address: a name that merely
    /// starts with "127." is a name like any other.
    func testInsecureListensOnLoopbackAddressesOnly() throws {
        let lab = try makeLab()
        let env = ["PATH": "/usr/bin:/bin"]
        for host in ["127.attacker.invalid", "0.0.0.0", "::", "10.255.255.1"] {
            for service in [["coordinator", "--results", lab.results.path], ["air"], ["agent", "--name", "a1", "--data", lab.dir.appendingPathComponent("a1").path]] {
                let (code, out) = try lab.cli(service + ["--port", "0", "--insecure", "--host", host], environment: env, timeout: 20)
                XCTAssertEqual(code, 2, "\(service[0]) --insecure --host \(host): \(out)")
                XCTAssertTrue(out.contains("loopback only: --host \(host)"), out)
                XCTAssertFalse(out.contains("listening on"), out)
            }
        }
        // A name that resolves to loopback only is bound by its checked address.
        let (code, out) = try lab.cli(["air", "--port", "0", "--insecure", "--host", "localhost"], environment: env, timeout: 2)
        XCTAssertNotEqual(code, 2, out)
        XCTAssertTrue(out.contains("listening on 127.0.0.1") || out.contains("listening on ::1"), out)
    }
}
