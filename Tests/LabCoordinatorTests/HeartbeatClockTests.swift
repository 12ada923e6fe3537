import Foundation
import HeraldCore
import XCTest
import LabHTTP
import LabPlan
import LabTestSupport
@testable import LabCoordinator

/// Clock samples carried by heartbeats (Coordinator+Clock): the coordinator's answer stamps, the
/// agent's stamps of that exchange in its next heartbeat, and when they are good enough to arm
/// without probes. The agent here is played by the test, with a clock `skew` ahead and a link
/// whose delays the test chooses.
final class HeartbeatClockTests: XCTestCase {
    var dir: URL!
    var coordinator: Coordinator!
    let url = "http://10.0.0.7:8701"
    var sequence: UInt64 = 0

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("hbclock-\(UUID().uuidString)")
        coordinator = try Coordinator(config: Coordinator.Config(results: dir), logger: LogCapture.quiet())
        try register(boot: "boot-0001")
    }

    override func tearDown() { try? FileManager.default.removeItem(at: dir) }

    func register(boot: String) throws {
        var info = LabWire.AgentInfo(name: "a1", url: url, tags: [], radio: .sim, adapter: nil, controller: nil)
        sequence += 1
        info.boot = boot
        info.sequence = sequence
        try coordinator.register(info, principal: nil, peerHost: "10.0.0.7")
    }

    /// One heartbeat carrying `clock`; returns the coordinator's answer.
    @discardableResult
    func beat(_ clock: LabWire.HeartbeatClock?, boot: String = "boot-0001") throws -> (UInt64, LabWire.ClockReply) {
        var s = LabWire.AgentStatus(name: "a1", state: .idle)
        sequence += 1
        s.boot = boot
        s.sequence = sequence
        s.clock = clock
        return (sequence, try coordinator.heartbeat("a1", s, principal: nil))
    }

    /// Heartbeats from an agent whose clock is `skew` ahead, each way `forward` and `backward`
    /// seconds on the link: `count` samples.
    func beats(_ count: Int, skew: Double, forward: Double = 0.0002, backward: Double = 0.0002, boot: String = "boot-0001") throws {
        var (number, reply) = try beat(nil, boot: boot)
        for _ in 0..<count {
            let stamps = LabWire.HeartbeatClock(sequence: number, sent: reply.received + skew - forward, answered: reply.sent + skew + backward)
            (number, reply) = try beat(stamps, boot: boot)
        }
    }

    var samples: [LabWire.ClockSample] { coordinator.registry.withRecords { s in s["a1"]?.clocks.map(\.sample) ?? [] } }

    func testEachHeartbeatAnswerAndTheNextHeartbeatMakeOneSample() throws {
        let (_, reply) = try beat(nil)
        XCTAssertLessThanOrEqual(reply.received, reply.sent)
        XCTAssertEqual(reply.sent, Date().timeIntervalSince1970, accuracy: 5)
        try beats(2, skew: 2.5, forward: 0.0003, backward: 0.0001)
        XCTAssertEqual(samples.count, 2)
        for s in samples {
            // Agent minus coordinator: the skew, off by half the asymmetry; the round trip is the link's.
            XCTAssertEqual(s.offset, 2.5 - 0.0001, accuracy: 1e-6)
            XCTAssertEqual(s.roundTrip, 0.0004, accuracy: 1e-6)
        }
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: url), "two samples are not enough")
        try beats(1, skew: 2.5, forward: 0.0003, backward: 0.0001)
        let clock = try XCTUnwrap(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        XCTAssertEqual(clock.offset, 2.5 - 0.0001, accuracy: 1e-6)
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: "http://10.0.0.8:8701"), "not for an agent now at another URL")
        XCTAssertNil(coordinator.registry.withRecords { s in s["a1"]?.status?.clock }, "the stamps are not kept as the agent's status")
    }

    func testStampsOfAnotherHeartbeatOrAContradictionMakeNoUsableClock() throws {
        try beats(4, skew: 1)
        XCTAssertEqual(samples.count, 4)
        // Stamps of a heartbeat the coordinator did not answer last (its answer was lost) make no sample.
        let (number, reply) = try beat(nil)
        try beat(LabWire.HeartbeatClock(sequence: number - 1, sent: reply.received + 1, answered: reply.sent + 1))
        XCTAssertEqual(samples.count, 4)
        // Stamps that make a negative round trip (the coordinator took 0.5 s to answer, the agent
        // saw 0.1 s pass: a clock stepped mid-exchange): none either.
        let (n2, r2) = try beat(nil)
        coordinator.registry.withRecords { s in s["a1"]!.clockPending!.sent += 0.5 }
        try beat(LabWire.HeartbeatClock(sequence: n2, sent: r2.received + 1, answered: r2.received + 1.1))
        XCTAssertEqual(samples.count, 4)
        XCTAssertNotNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        // The clock steps 0.2 s: the samples before and after contradict each other.
        try beats(3, skew: 1.2)
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
    }

    func testASlowOrJitteryLinkIsProbedInstead() throws {
        // Every exchange 1.1 ms each way: the offset is known only to ± 1.1 ms, over the ± 1 ms allowed.
        try beats(5, skew: 0, forward: 0.0011, backward: 0.0011)
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        // One fast exchange each way among slow ones is enough (the least delays bound it).
        try beats(1, skew: 0, forward: 0.0001, backward: 0.004)
        try beats(1, skew: 0, forward: 0.004, backward: 0.0001)
        let clock = try XCTUnwrap(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        XCTAssertEqual(clock.offset, 0, accuracy: 1e-6)
        XCTAssertEqual(clock.roundTrip, 0.0002, accuracy: 1e-6)
        // 0.9 ms each way on a fresh boot: within ± 1 ms.
        try register(boot: "boot-0003")
        try beats(3, skew: 0, forward: 0.0009, backward: 0.0009, boot: "boot-0003")
        XCTAssertEqual(try XCTUnwrap(coordinator.registry.heartbeatClock(agent: "a1", url: url)).roundTrip, 0.0018, accuracy: 1e-6)
    }

    func testSamplesOlderThanTheWindowOrFromAnotherBootAreNotUsed() throws {
        try beats(4, skew: 0.5)
        XCTAssertNotNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        coordinator.registry.withRecords { s in for i in s["a1"]!.clocks.indices { s["a1"]!.clocks[i].at -= 31 } }
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: url), "older than 30 s")
        try beats(4, skew: 0.5)
        XCTAssertNotNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        let kept = samples.count
        try register(boot: "boot-0001")
        XCTAssertEqual(samples.count, kept, "the same process registering again (a heartbeat of it failed) keeps its samples")
        try register(boot: "boot-0002")
        XCTAssertTrue(samples.isEmpty, "a new boot starts afresh")
        XCTAssertNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        XCTAssertEqual(samples.count, 0)
        try beats(3, skew: 0.5, boot: "boot-0002")
        XCTAssertNotNil(coordinator.registry.heartbeatClock(agent: "a1", url: url))
        // At most 64 are kept.
        try beats(100, skew: 0.5, boot: "boot-0002")
        XCTAssertEqual(samples.count, 64)
    }

    func testStampsThatAreNotTimesAreABadRequestNamingTheField() throws {
        let (number, _) = try beat(nil)
        for (clock, field) in [(LabWire.HeartbeatClock(sequence: number, sent: -1, answered: 5), "clock.sent"),
                               (LabWire.HeartbeatClock(sequence: number, sent: 5, answered: .infinity), "clock.answered"),
                               (LabWire.HeartbeatClock(sequence: number, sent: 1e300, answered: 1e300), "clock.sent"),
                               (LabWire.HeartbeatClock(sequence: number, sent: 100, answered: 99), "clock: answered"),
                               (LabWire.HeartbeatClock(sequence: number, sent: 100, answered: 100 + 3601), "clock: answered")] {
            XCTAssertThrowsError(try beat(clock), "\(clock)") { e in
                XCTAssertEqual((e as? LabRefusal)?.kind.status, 400, "\(e)")
                XCTAssertTrue("\(e)".contains(field), "\(e)")
            }
        }
        XCTAssertTrue(samples.isEmpty)
    }
}
