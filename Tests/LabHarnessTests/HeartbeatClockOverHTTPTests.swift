import Foundation
import XCTest
import LabHTTP
import LabLink
import LabNet
import LabPlan
import LabTestSupport
@testable import LabAgent
@testable import LabCoordinator

/// Heartbeat clock samples over the real HTTP adapters (HTTPCoordinatorLink on AsyncHTTPClient,
/// the coordinator on Hummingbird): with one clock on both sides the true offset, 0, lies within
/// every sample's bounds, unless a stamp was taken on the wrong side of its exchange.
final class HeartbeatClockOverHTTPTests: XCTestCase {
    func testEverySampleOverHTTPHoldsTheTrueOffsetWithinItsBounds() async throws {
        LabTrust.forget()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("hbhttp-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let token = LabToken.generate()
        var config = Coordinator.Config(results: dir.appendingPathComponent("results"))
        config.token = token
        let coordinator = try Coordinator(config: config, logger: LogCapture.quiet())
        let port = try await coordinator.start()
        var c = Agent.Config(name: "a1", dataDirectory: dir.appendingPathComponent("a1"))
        c.token = token
        c.coordinator = URL(string: "http://127.0.0.1:\(port)")!
        c.heartbeatInterval = 0.05
        let agent = Agent(config: c, logger: LogCapture.quiet())
        _ = try await agent.start()
        let deadline = Date().addingTimeInterval(30)
        var samples: [LabWire.ClockSample] = []
        while samples.count < 20 && Date() < deadline {
            try await Task.sleep(nanoseconds: 50_000_000)
            samples = coordinator.registry.withRecords { s in s["a1"]?.clocks.map(\.sample) ?? [] }
        }
        await agent.stop()
        await coordinator.stop()
        XCTAssertGreaterThanOrEqual(samples.count, 20, "a sample per heartbeat after the first")
        for s in samples {
            XCTAssertGreaterThanOrEqual(s.roundTrip, 0)
            XCTAssertLessThanOrEqual(abs(s.offset), s.roundTrip / 2 + 1e-6, "\(s)")
        }
        let estimate = try XCTUnwrap(LabWire.ClockSample.agreeing(samples), "one clock: the samples agree")
        XCTAssertLessThanOrEqual(abs(estimate.offset), estimate.roundTrip / 2 + 1e-6)
    }
}

/// An agent whose heartbeat answers are lost on the way back (the coordinator took the heartbeat,
/// the connection died before the answer): it reports no stamps for those, and stamps only of the
/// heartbeat just before, so every sample the coordinator makes is of one whole exchange.
final class HeartbeatClockLostAnswerTests: XCTestCase {
    /// Every third answer is lost after the coordinator has taken the heartbeat; the statuses sent are recorded.
    final class LosingLink: CoordinatorLink, @unchecked Sendable {
        let inner: LocalCoordinatorLink
        private let lock = NSLock()
        private var calls = 0
        private(set) var sent: [(status: LabWire.AgentStatus, lost: Bool)] = []
        init(_ inner: LocalCoordinatorLink) { self.inner = inner }
        var address: String { inner.address }
        var record: [(status: LabWire.AgentStatus, lost: Bool)] { lock.withLock { sent } }
        func register(_ info: LabWire.AgentInfo) async throws(LinkError) { try await inner.register(info) }
        func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer {
            let answer = try await inner.heartbeat(agent: name, status)
            let lost = lock.withLock { () -> Bool in
                calls += 1
                let lost = calls % 3 == 0
                sent.append((status, lost))
                return lost
            }
            if lost { throw LinkError(status: nil, message: "connection reset before the answer") }
            return answer
        }
    }

    func testAnAgentReportsStampsOnlyOfTheHeartbeatWhoseAnswerItGot() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("hblost-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let coordinator = try Coordinator(config: Coordinator.Config(results: dir.appendingPathComponent("results")), logger: LogCapture.quiet())
        coordinator.startUnserved()
        var c = Agent.Config(name: "a1", dataDirectory: dir.appendingPathComponent("a1"))
        c.heartbeatInterval = 0.02
        c.maxBackoff = 0.02
        let link = LosingLink(LocalCoordinatorLink(coordinator, agent: "a1"))
        let agent = Agent(config: c, logger: LogCapture.quiet(), coordinatorLink: link)
        try await agent.startUnserved(url: "http://a1.in-memory:8701")
        let deadline = Date().addingTimeInterval(30)
        while link.record.count < 30 && Date() < deadline { try await Task.sleep(nanoseconds: 20_000_000) }
        await agent.stop()
        await coordinator.stop()
        let beats = link.record
        XCTAssertGreaterThanOrEqual(beats.count, 30)
        for (previous, this) in zip(beats, beats.dropFirst()) {
            if previous.lost {
                XCTAssertNil(this.status.clock, "no stamps after an answer that never came")
            } else {
                XCTAssertEqual(this.status.clock?.sequence, previous.status.sequence, "the stamps of the heartbeat just before")
            }
        }
        let samples = coordinator.registry.withRecords { s in s["a1"]!.clocks.map(\.sample) }
        XCTAssertEqual(samples.count, zip(beats, beats.dropFirst()).filter { !$0.0.lost }.count, "one sample per answered exchange")
        XCTAssertTrue(samples.allSatisfy { abs($0.offset) <= $0.roundTrip / 2 + 1e-6 }, "\(samples)")
    }
}
