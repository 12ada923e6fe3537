import Foundation
import LabNet
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A real PostgreSQL server from Debian's packages, started by the test in a temporary folder:
/// initdb, then pg_ctl on a free TCP port of 127.0.0.1 and a Unix socket in the folder;
/// stopped and the folder removed by `destroy`. As root (CI) it runs as the `postgres` user the
/// package created (PostgreSQL refuses to run as root). Local connections (the socket) trust the
/// superuser `admin`; TCP asks a password (scram-sha-256).
final class PostgresServer {
    let bin: String
    let dir: URL
    let port: Int
    let data: URL
    private let runAs: String?

    static let superuser = "admin"

    /// The newest /usr/lib/postgresql/N/bin with initdb, pg_ctl and postgres; nil when PostgreSQL
    /// is not installed (make test-results-server installs Debian's postgresql).
    static func binaries() -> String? {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init).sorted(by: >)
        for v in versions {
            let b = "\(root)/\(v)/bin"
            if ["initdb", "pg_ctl", "postgres"].allSatisfy({ FileManager.default.isExecutableFile(atPath: "\(b)/\($0)") }) { return b }
        }
        return nil
    }

    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw NSError(domain: "port", code: 1) }
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok else { throw NSError(domain: "port", code: 2) }
        return Int(UInt16(bigEndian: addr.sin_port))
    }

    /// Starts a new cluster; throws XCTSkip when PostgreSQL's binaries are absent.
    init() throws {
        guard let bin = Self.binaries() else {
            if ProcessInfo.processInfo.environment["HERALDLAB_REQUIRE_POSTGRES"] != nil {
                throw NSError(domain: "postgres", code: 1, userInfo: [NSLocalizedDescriptionKey: "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin"])
            }
            throw XCTSkip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (Debian's postgresql package; make test-results-server installs it)")
        }
        self.bin = bin
        // Short: the socket path must fit in 107 bytes.
        dir = URL(fileURLWithPath: "/tmp/hlpg-\(UUID().uuidString.prefix(8))")
        data = dir.appendingPathComponent("data")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        if getuid() == 0 {
            guard let pw = getpwnam("postgres") else { throw XCTSkip("running as root without a postgres user to run PostgreSQL as") }
            guard chown(dir.path, pw.pointee.pw_uid, pw.pointee.pw_gid) == 0 else { throw NSError(domain: "chown", code: Int(errno)) }
            runAs = "postgres"
        } else {
            runAs = nil
        }
        port = try Self.freePort()
        let pwfile = dir.appendingPathComponent("superuser.pw")
        try Data("admin-\(UUID().uuidString)\n".utf8).write(to: pwfile)
        if let pw = getpwnam("postgres"), runAs != nil { chown(pwfile.path, pw.pointee.pw_uid, pw.pointee.pw_gid) }
        // TLS: a CA of its own and a certificate for "localhost" only (so 127.0.0.1 fails verify-full).
        try LabCA.create(commonName: "results test CA", days: 2, certificate: caFile, key: dir.appendingPathComponent("ca.key").path)
        try LabCA.issue(caCertificate: caFile, caKey: dir.appendingPathComponent("ca.key").path, commonName: "localhost", names: ["localhost"], days: 2,
                        certificate: dir.appendingPathComponent("server.crt").path, key: dir.appendingPathComponent("server.key").path)
        if runAs != nil, let pw = getpwnam("postgres") {
            for f in ["server.key", "server.crt", "ca.pem"] { chown(dir.appendingPathComponent(f).path, pw.pointee.pw_uid, pw.pointee.pw_gid) }
        }
        try run("initdb", ["-D", data.path, "-U", Self.superuser, "--pwfile", pwfile.path, "--auth-local=trust", "--auth-host=scram-sha-256",
                           "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        try start()
    }

    func start() throws {
        try run("pg_ctl", ["-D", data.path, "-l", dir.appendingPathComponent("server.log").path, "-w", "-t", "60",
                           "-o", "-p \(port) -k \(dir.path) -c listen_addresses=127.0.0.1 -c max_connections=50 -c shared_buffers=16MB -c ssl=on -c ssl_cert_file=\(dir.path)/server.crt -c ssl_key_file=\(dir.path)/server.key", "start"])
    }

    func stop() throws {
        try run("pg_ctl", ["-D", data.path, "-w", "-t", "60", "-m", "fast", "stop"])
    }

    /// Stops the server if it runs and removes its folder.
    func destroy() {
        _ = try? run("pg_ctl", ["-D", data.path, "-w", "-t", "60", "-m", "immediate", "stop"], quiet: true)
        try? FileManager.default.removeItem(at: dir)
    }

    var log: String { (try? String(contentsOf: dir.appendingPathComponent("server.log"), encoding: .utf8)) ?? "" }

    /// The CA that signed the server's certificate.
    var caFile: String { dir.appendingPathComponent("ca.pem").path }

    /// The Unix socket the superuser connects through (trust).
    var socketPath: String { dir.appendingPathComponent(".s.PGSQL.\(port)").path }

    /// Runs a PostgreSQL tool (as `postgres` when root) with posix_spawn and waitpid: Foundation's
    /// Process missed runuser's exit here (left a zombie and waited for ever).
    @discardableResult
    func run(_ tool: String, _ args: [String], quiet: Bool = false) throws -> String {
        // In /tmp: the postgres user may not enter the test's working folder.
        let argv = ["/usr/bin/env", "-C", "/tmp"] + (runAs.map { ["/usr/sbin/runuser", "-u", $0, "--"] } ?? []) + ["\(bin)/\(tool)"] + args
        let out = dir.appendingPathComponent("tool-\(UUID().uuidString).out")
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, out.path, O_WRONLY | O_CREAT | O_TRUNC, 0o666)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        var pid = pid_t()
        let cargs = argv.map { strdup($0) } + [nil]
        defer { cargs.forEach { free($0) } }
        let rc = posix_spawn(&pid, argv[0], &actions, nil, cargs, environ)
        guard rc == 0 else { throw NSError(domain: "postgres", code: Int(rc), userInfo: [NSLocalizedDescriptionKey: "cannot start \(argv[0]): \(String(cString: strerror(rc)))"]) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let text = (try? String(contentsOf: out, encoding: .utf8)) ?? ""
        try? FileManager.default.removeItem(at: out)
        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        if code != 0 && !quiet {
            throw NSError(domain: "postgres", code: Int(code), userInfo: [NSLocalizedDescriptionKey: "\(tool) \(args.joined(separator: " ")): exit \(code)\n\(text)\n\(log.suffix(2000))"])
        }
        return text
    }
}
