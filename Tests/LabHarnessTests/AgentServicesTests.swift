import Foundation
import Synchronization
import XCTest
import HeraldCore
import LabLink
import LabPlan
import LabTestSupport
@testable import LabAgent

/// The agent's long-lived work as `herald-lab agent` runs it: `Agent.services` in a group of
/// their own beside the HTTP server (the process's ServiceGroup), the agent started by its
/// server once it listens.
final class AgentServicesTests: XCTestCase {
    /// A coordinator that records what reaches it.
    final class RecordingLink: CoordinatorLink {
        let registrations = Mutex([LabWire.AgentInfo]())
        let beats = Mutex(0)
        var address: String { "recording" }
        func register(_ info: LabWire.AgentInfo) async throws(LinkError) { registrations.withLock { $0.append(info) } }
        func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer {
            beats.withLock { $0 += 1 }
            return HeartbeatAnswer(sent: 0, answered: 0, reply: nil)
        }
    }

    /// The heartbeats run from the group's start but register only once the agent has started
    /// (at the URL its server is listening at, not before it has one); cancelling the group ends
    /// them and the dongle's refreshes.
    func testTheServicesRunInTheProcesssGroupAndTheHeartbeatsWaitForTheStart() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("agentsvc-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        var c = Agent.Config(name: "a1", dataDirectory: dir)
        c.insecure = true
        c.heartbeatInterval = 0.05
        let link = RecordingLink()
        let agent = Agent(config: c, logger: LogCapture.quiet(), coordinatorLink: link)
        let services = agent.services
        XCTAssertEqual(services.map(\.name), ["heartbeats", "dongle refreshes"])
        let group = Task {
            await withDiscardingTaskGroup { g in for s in services { g.addTask { await s.run() } } }
        }
        let (ports, bound) = AsyncStream.makeStream(of: UInt16.self)
        let server = try agent.server { bound.yield($0) }
        let serving = Task { try await server.run() }
        var port: UInt16 = 0
        for await p in ports { port = p; break }
        try await eventually("the first registration") { !link.registrations.withLock { $0.isEmpty } }
        let first = link.registrations.withLock { $0.first }
        XCTAssertEqual(first?.url, "http://127.0.0.1:\(port)", "registered at the URL it listens at")
        XCTAssertEqual(first?.name, "a1")
        group.cancel()
        await group.value
        await agent.stop()
        serving.cancel()
        _ = await serving.result
    }

    /// Heartbeats cancelled before the agent ever starts end without a word to the coordinator.
    func testHeartbeatsCancelledBeforeTheStartEndWithoutRegistering() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("agentsvc-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let link = RecordingLink()
        let agent = Agent(config: Agent.Config(name: "a2", dataDirectory: dir), logger: LogCapture.quiet(), coordinatorLink: link)
        let heartbeats = try XCTUnwrap(agent.services.first { $0.name == "heartbeats" })
        let task = Task { await heartbeats.run() }
        task.cancel()
        await task.value
        XCTAssertEqual(link.beats.withLock { $0 }, 0)
        XCTAssertTrue(link.registrations.withLock { $0.isEmpty })
    }

    func testALatchLetsEveryWaiterGoOnceOpenAndACancelledOneAtOnce() async {
        let latch = Latch()
        let cancelled = Task { await latch.wait() }
        cancelled.cancel()
        let wasOpen = await cancelled.value
        XCTAssertFalse(wasOpen)
        async let a = latch.wait()
        async let b = latch.wait()
        latch.open()
        let (x, y) = await (a, b)
        XCTAssertTrue(x && y)
        let late = await latch.wait()
        XCTAssertTrue(late)
    }
}
