import Foundation
import XCTest
import LabNet
@testable import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab enrol` under any umask (issue 19, item 7): the credentials folder it makes is
/// 0700 and every file in it 0600; an existing folder others may write to is refused.
final class EnrolmentModeTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("enrol-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func enrolment() throws -> Enrolment {
        let ca = dir.appendingPathComponent("ca.pem").path, caKey = dir.appendingPathComponent("ca-key.pem").path
        try LabCA.create(commonName: "t", days: 1, certificate: ca, key: caKey)
        let pem = try String(contentsOfFile: ca, encoding: .utf8)
        let key = try String(contentsOfFile: caKey, encoding: .utf8)
        return Enrolment(credential: AgentCredential(name: "n1", token: String(repeating: "a", count: 40), coordinatorToken: String(repeating: "b", count: 40)),
                         coordinator: nil, ca: pem, certificate: pem, key: key)
    }

    func mode(_ url: URL) -> mode_t {
        var st = stat()
        XCTAssertEqual(lstat(url.path, &st), 0, url.path)
        return st.st_mode & 0o7777
    }

    func testFolderIs0700AndFiles0600UnderUmask000() throws {
        let e = try enrolment()
        let folder = dir.appendingPathComponent("deep/creds")
        let old = umask(0)
        defer { umask(old) }
        try e.install(into: folder)
        umask(old)
        XCTAssertEqual(mode(folder), 0o700)
        for f in ["ca.pem", "cert.pem", "key.pem", "agent.json"] {
            XCTAssertEqual(mode(folder.appendingPathComponent(f)), 0o600, f)
        }
        // Installing again into the folder it made keeps it so.
        try e.install(into: folder)
        XCTAssertEqual(mode(folder), 0o700)
    }

    func testAnExistingFolderOthersMayWriteToIsRefused() throws {
        let e = try enrolment()
        let open = dir.appendingPathComponent("open")
        XCTAssertEqual(mkdir(open.path, 0o700), 0)
        XCTAssertEqual(chmod(open.path, 0o777), 0)
        XCTAssertThrowsError(try e.install(into: open)) { error in
            XCTAssertTrue("\(error)".contains("may be written by its group or by others"), "\(error)")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: open.appendingPathComponent("key.pem").path), "nothing written")
        // One that only its owner may write to is used as it is.
        XCTAssertEqual(chmod(open.path, 0o750), 0)
        try e.install(into: open)
        XCTAssertEqual(mode(open), 0o750)
        XCTAssertEqual(mode(open.appendingPathComponent("key.pem")), 0o600)
    }
}
