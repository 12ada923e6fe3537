import Foundation
import XCTest
@testable import LabResults

/// `--history postgres://…` and its password file (issue 41), without a server: the URL's
/// forms, a password anywhere on the command line refused, the password file's mode, and no
/// password in what is logged.
final class ResultsLocationTests: XCTestCase {
    func testTheURLsFormsParse() throws {
        let tcp = try ResultsLocation.parse("postgres://lab_coordinator@results.example:6543/herald?sslmode=verify-full&sslrootcert=/etc/herald-lab/pg-ca.pem")
        XCTAssertEqual(tcp, ResultsLocation(user: "lab_coordinator", host: "results.example", port: 6543, database: "herald", tls: .verifyFull, caFile: "/etc/herald-lab/pg-ca.pem"))
        XCTAssertEqual(tcp.description, "postgres://lab_coordinator@results.example:6543/herald?sslmode=verify-full&sslrootcert=/etc/herald-lab/pg-ca.pem")
        let plain = try ResultsLocation.parse("postgresql://ops@10.1.2.3/results")
        XCTAssertEqual(plain.port, 5432)
        XCTAssertEqual(plain.tls, .disable)
        XCTAssertEqual(try ResultsLocation.parse("postgres://ops@[::1]:5433/r").host, "::1")
        let socket = try ResultsLocation.parse("postgres://ops@/results?host=/run/postgresql")
        XCTAssertEqual(socket.socketDirectory, "/run/postgresql")
        XCTAssertNil(socket.host)
        XCTAssertEqual(try ResultsLocation.parse("postgres://ops%20x@h/d%C3%BC").database, "dü")
        XCTAssertTrue(ResultsLocation.isURL("POSTGRES://x@h/d"))
        XCTAssertFalse(ResultsLocation.isURL("results/history.sqlite"))
    }

    func testBadURLsAreRefusedNamingWhatIsWrong() {
        let cases: [(String, String)] = [
            ("postgres://ops:s3cret@h/d", "password in the URL is refused"),
            ("postgres://ops@h/d?password=s3cret", "password in the URL is refused"),
            ("postgres://h/d", "no user"),
            ("postgres://ops@h/", "no database"),
            ("postgres://ops@h/d?sslmode=prefer", "sslmode"),
            ("postgres://ops@h/d?sslrootcert=/ca.pem", "sslrootcert without TLS"),
            ("postgres://ops@h/d?application_name=x", "unknown parameter"),
            ("postgres://ops@/d", "no host"),
            ("mysql://ops@h/d", "not a postgres:// URL"),
        ]
        for (url, why) in cases {
            XCTAssertThrowsError(try ResultsLocation.parse(url), url) { e in
                XCTAssertTrue("\(e)".contains(why), "\(url): \(e)")
                XCTAssertFalse("\(e)".contains("s3cret"), "\(url): the password is in the error: \(e)")
            }
        }
    }

    func testRedactRemovesPasswords() {
        XCTAssertEqual(ResultsLocation.redact("postgres://ops:s3cret@h:5432/d"), "postgres://ops:***@h:5432/d")
        XCTAssertEqual(ResultsLocation.redact("postgres://ops@h/d?sslmode=require&password=s3cret&x=1"), "postgres://ops@h/d?sslmode=require&password=***&x=1")
        XCTAssertEqual(ResultsLocation.redact("postgres://ops@h/d"), "postgres://ops@h/d")
    }

    func testThePasswordFileMustBeTheOwnersAlone() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("pw-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("pw")
        FileManager.default.createFile(atPath: file.path, contents: Data("s3cret pass\r\nsecond line\n".utf8), attributes: [.posixPermissions: 0o600])
        XCTAssertEqual(try ResultsLocation.readPassword(file: file.path), "s3cret pass")
        try FileManager.default.setAttributes([.posixPermissions: 0o640], ofItemAtPath: file.path)
        XCTAssertThrowsError(try ResultsLocation.readPassword(file: file.path)) { e in
            XCTAssertTrue("\(e)".contains("chmod 600"), "\(e)")
            XCTAssertFalse("\(e)".contains("s3cret"))
        }
        let empty = dir.appendingPathComponent("empty")
        FileManager.default.createFile(atPath: empty.path, contents: Data("\n".utf8), attributes: [.posixPermissions: 0o600])
        XCTAssertThrowsError(try ResultsLocation.readPassword(file: empty.path)) { XCTAssertTrue("\($0)".contains("empty")) }
        XCTAssertThrowsError(try ResultsLocation.readPassword(file: dir.appendingPathComponent("none").path))
        XCTAssertThrowsError(try ResultsLocation.readPassword(file: dir.path)) { XCTAssertTrue("\($0)".contains("not a regular file")) }
    }

    func testControllersGiveFirmwareAndMake() {
        let (firmware, make) = SharedRun.controllers([
            "n1": "address=00:11:22:33:44:55 hciVersion=9 lmpSubversion=8870 lmpVersion=9 manufacturer=2 manufacturerName=Intel Corp.",
            "n2": "address=00:11:22:33:44:56 hciVersion=9 lmpSubversion=8870 lmpVersion=9 manufacturer=2 manufacturerName=Intel Corp.",
            "n3": "address=00:aa hciVersion=6 lmpSubversion=12 lmpVersion=6 manufacturer=10 manufacturerName=Cambridge Silicon Radio",
            "n4": "address=00:bb lmpSubversion=1 lmpVersion=11 manufacturer=93",
        ])
        XCTAssertEqual(firmware, "LMP 11.1; LMP 6.12; LMP 9.8870")
        XCTAssertEqual(make, "Cambridge Silicon Radio; Intel Corp.; company 93")
        XCTAssertEqual(SharedRun.controllers([:]).firmware, "")
    }

    func testGrantsQuoteRoleNames() {
        XCTAssertEqual(SharedResultsStore.quoteIdentifier("lab\"; DROP ROLE x; --"), "\"lab\"\"; DROP ROLE x; --\"")
        XCTAssertTrue(SharedResultsStore.grantStatements(coordinator: "c", operator: "o").allSatisfy { $0.contains("\"c\"") || $0.contains("\"o\"") })
    }
}
