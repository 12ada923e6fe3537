import XCTest
import LabPlan
@testable import LabCoordinator

/// The coordinator's rules for what agents tell it: where to call them, which file lists to accept.
final class CoordinatorRulesTests: XCTestCase {
    func info(_ url: String, port: UInt16? = 8701) -> LabWire.AgentInfo {
        LabWire.AgentInfo(name: "n1", url: url, tags: [], radio: .sim, adapter: nil, controller: nil, port: port)
    }

    func testAgentOnAWildcardAddressIsCalledWhereItsRegistrationCameFrom() throws {
        XCTAssertEqual(try AgentRegistry.reachableURL(info("http://0.0.0.0:8701"), peerHost: "10.77.0.11"), "http://10.77.0.11:8701")
        XCTAssertEqual(try AgentRegistry.reachableURL(info("http://[::]:8701"), peerHost: "fd00:77::11"), "http://[fd00:77::11]:8701")
        XCTAssertEqual(try AgentRegistry.reachableURL(info("http://0.0.0.0:8701"), peerHost: "::ffff:10.77.0.12"), "http://10.77.0.12:8701", "IPv4-mapped peers are called over IPv4")
        XCTAssertEqual(try AgentRegistry.reachableURL(info("http://n1.lab:8701"), peerHost: "10.77.0.11"), "http://n1.lab:8701", "an announced name is kept")
        XCTAssertEqual(try AgentRegistry.reachableURL(info("http://[fd00::5]:8701"), peerHost: "10.77.0.11"), "http://[fd00::5]:8701")
        XCTAssertThrowsError(try AgentRegistry.reachableURL(info("http://0.0.0.0:8701"), peerHost: nil)) { e in
            XCTAssertTrue("\(e)".contains("--advertise-url"), "\(e)")
        }
        XCTAssertThrowsError(try AgentRegistry.reachableURL(info("ftp://x:1"), peerHost: "10.0.0.1"))
    }

    func list(_ names: [String]) -> LabWire.FileList {
        LabWire.FileList(runId: "r1", node: "alpha", resumed: false, startedAt: nil,
                         files: names.map { LabWire.FileInfo(name: $0, bytes: 3, sha256: String(repeating: "a", count: 64)) })
    }

    func testFileListsNamingAnythingButHeraldFilesAreRefused() {
        XCTAssertNoThrow(try RunController.check(list(["contacts.csv", "log.txt"]), runId: "r1", node: "alpha"))
        for bad in ["../../../../x", "a/../../../x", "/../../../x", "./../../x", "/../../..", "..", ".", "", "contacts.csv/../../x",
                    "%2e%2e/x", "contacts.csv\u{0}", "nodes/contacts.csv", "manifest.json"] {
            XCTAssertThrowsError(try RunController.check(list(["contacts.csv", bad]), runId: "r1", node: "alpha"), "name \(bad)") { e in
                XCTAssertTrue((e as? RunController.GatherRefusal)?.message.contains("not one of the Herald files") == true, "\(e)")
            }
        }
        XCTAssertThrowsError(try RunController.check(list(["log.txt", "log.txt"]), runId: "r1", node: "alpha"), "a name twice")
        XCTAssertThrowsError(try RunController.check(list(["log.txt"]), runId: "r2", node: "alpha"), "another run")
        XCTAssertThrowsError(try RunController.check(list(["log.txt"]), runId: "r1", node: "beta"), "another node")
        var huge = list(["log.txt"])
        huge.files[0].bytes = -1
        XCTAssertThrowsError(try RunController.check(huge, runId: "r1", node: "alpha"), "negative size")
        huge.files[0].bytes = 3
        huge.files[0].sha256 = "../x"
        XCTAssertThrowsError(try RunController.check(huge, runId: "r1", node: "alpha"), "not a checksum")
    }

    func testRunStatesThatEndARun() {
        XCTAssertEqual(RunRecord.State.allCasesForTest.filter(\.isFinal), [.complete, .aborted, .failed, .cancelled])
    }
}

extension RunRecord.State {
    static let allCasesForTest: [RunRecord.State] = [.arming, .running, .gathering, .complete, .aborted, .failed, .cancelled]
}
