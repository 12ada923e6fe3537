import Foundation
import XCTest
import HeraldCore
import LabPlan
import LabTestSupport
@testable import LabAgent

/// The agent's run rules as functions (issue 39 item 3), without HTTP and without a coordinator:
/// its `RunLifecycle` on a virtual time, driven step by step (nothing here sleeps on the clock,
/// so `step` alone moves time and runs the node's actions in order).
final class RunLifecycleTests: XCTestCase {
    var dir: URL!
    override func setUp() { dir = FileManager.default.temporaryDirectory.appendingPathComponent("lifecycle-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: dir) }

    func agent(_ time: VirtualTime) -> Agent {
        var c = Agent.Config(name: "a1", dataDirectory: dir)
        c.clock = time.clock
        c.scheduler = time
        c.stallThreshold = .infinity
        let media = SharedMedia(time)
        c.makeRadio = { try media.radio(for: $0) }
        return Agent(config: c, logger: LogCapture.quiet())
    }

    func testARunIsArmedStartedAtItsInstantEndedAtItsEndAndReleased() throws {
        let time = VirtualTime(start: 1_800_000_000)
        let a = agent(time)
        let life = a.lifecycle
        let plan = try Plan.parse(yaml: "name: p\nduration: 30s\nnodes: [n1, n2]\n")
        let arm = LabWire.ArmRequest(assignment: NodeAssignment(runId: "r1", plan: plan, node: plan.nodes[0]), air: nil)
        try a.scheduler.sync { try life.arm(arm) }
        try a.scheduler.sync { try life.arm(arm) } // the same assignment again: idempotent
        XCTAssertThrowsError(try a.scheduler.sync { try life.arm(LabWire.ArmRequest(assignment: NodeAssignment(runId: "r1", plan: plan, node: plan.nodes[1]), air: nil)) }) {
            XCTAssertEqual(($0 as? LabRefusal)?.kind, .conflict, "\($0)")
        }
        XCTAssertEqual(a.status.state, .armed)
        let startAt = time.seconds + 10
        try a.scheduler.sync { try life.schedule(LabWire.StartRequest(runId: "r1", startAt: startAt)) }
        time.step(notPast: startAt - 0.001)
        XCTAssertEqual(a.status.state, .armed, "not before its instant")
        time.step(notPast: startAt)
        let running = a.status
        XCTAssertEqual(running.state, .running)
        XCTAssertEqual(try XCTUnwrap(running.startedAt), startAt, "at the instant, in the agent's clock")
        XCTAssertEqual(running.lateBy, 0)
        XCTAssertThrowsError(try a.scheduler.sync { try life.release("r1") }, "nothing is deleted before it is gathered")
        time.step(notPast: startAt + 30)
        XCTAssertEqual(a.status.state, .finished)
        let list = try a.scheduler.sync { try life.fileList("r1") }
        XCTAssertEqual(list.files.map(\.name).sorted(), ["battery.csv", "contacts.csv", "detection.csv", "log.txt", "statistics.csv"])
        XCTAssertNil(list.gaps)
        try a.scheduler.sync { try life.release("r1") }
        XCTAssertEqual(a.status.held, [])
        XCTAssertFalse(FileManager.default.fileExists(atPath: dir.appendingPathComponent("runs/r1").path))
    }
}
