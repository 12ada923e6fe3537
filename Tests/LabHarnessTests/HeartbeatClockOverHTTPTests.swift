import Foundation
import XCTest
import LabHTTP
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
            samples = coordinator.withLock { coordinator.agents["a1"]?.clocks.map(\.sample) ?? [] }
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
