import XCTest
import LabPlan

/// What an agent says of itself is bounded where it enters the coordinator (issue 36): each
/// field out of range is named, and nothing in range is refused.
final class AgentReportBoundsTests: XCTestCase {
    func status() -> LabWire.AgentStatus {
        var s = LabWire.AgentStatus(name: "a1", state: .running)
        s.runId = "r-20261129-1"; s.node = "n1"; s.startAt = 1_800_000_000; s.startedAt = 1_800_000_000.5; s.endsAt = 1_800_000_060
        s.lateBy = 0.5; s.peersDetected = 3; s.payloadsRead = 3; s.rssiLastMinute = 100; s.rssiTotal = 1000
        s.gaps = [LabWire.Gap(from: 1_800_000_001, to: 1_800_000_002, reason: "paused")]
        s.peers = ["ab12"]; s.recentPeers = ["ab12"]; s.held = ["r-20261129-1"]
        return s
    }

    func testAnHonestStatusPasses() { XCTAssertNil(status().problem) }

    func testEachImpossibleFieldIsNamed() {
        let cases: [(String, (inout LabWire.AgentStatus) -> Void)] = [
            ("startAt", { $0.startAt = 1e300 }), ("startedAt", { $0.startedAt = -.infinity }), ("endsAt", { $0.endsAt = .nan }),
            ("startedAt", { $0.startedAt = -1 }), ("lateBy", { $0.lateBy = .infinity }), ("peersDetected", { $0.peersDetected = -1 }),
            ("payloadsRead", { $0.payloadsRead = .max }), ("rssiLastMinute", { $0.rssiLastMinute = .min }), ("rssiTotal", { $0.rssiTotal = .max }),
            ("message", { $0.message = String(repeating: "x", count: 5000) }), ("gaps[0].from", { $0.gaps = [LabWire.Gap(from: .nan, to: 1, reason: "")] }),
            ("gaps[0] ends before", { $0.gaps = [LabWire.Gap(from: 1_800_000_002, to: 1_800_000_001, reason: "")] }),
            ("gaps has more than", { $0.gaps = Array(repeating: LabWire.Gap(from: 1_800_000_001, to: 1_800_000_002, reason: ""), count: 10_001) }),
            ("peers[0]", { $0.peers = ["\u{202E}x"] }), ("recentPeers has more", { $0.recentPeers = Array(repeating: "x", count: 10_001) }),
            ("held[1]", { $0.held = ["r1", "../x"] }), ("runId", { $0.runId = "-rf" }), ("node", { $0.node = "a/b" }),
        ]
        for (field, twist) in cases {
            var s = status()
            twist(&s)
            let problem = s.problem ?? ""
            XCTAssertTrue(problem.hasPrefix(field), "\(field): \(problem)")
        }
    }

    func testAFileListsInstantsAndTextsAreBounded() {
        var list = LabWire.FileList(runId: "r1", node: "n1", resumed: false, startedAt: 1_800_000_000, files: [])
        XCTAssertNil(list.problem)
        list.startedAt = .nan
        XCTAssertEqual(list.problem, "startedAt is not an instant between 1970 and 2100")
        list.startedAt = 1_800_000_000
        list.failure = String(repeating: "y", count: 4097)
        XCTAssertEqual(list.problem, "failure is longer than 4096 characters")
    }
}
