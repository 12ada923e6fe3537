import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LabPlan
import LabTestSupport
import NIOCore
import XCTest
@testable import LabAgent
@testable import LabCoordinator
@testable import LabHTTP

/// The agent's and the coordinator's API routes, registered from LabPlan's endpoint table, as
/// Hummingbird's router answers them (router mode: no socket).
final class RouterModeRoundTripTests: XCTestCase {
    var lab: MemoryLab?
    override func tearDown() async throws { await lab?.stop(); lab = nil }

    func testAnAgentAnswersItsEndpoints() async throws {
        let lab = try await MemoryLab.make(agents: 1)
        self.lab = lab
        let agent = Application(responder: lab.agents["agent1"]!.http.responder())
        let shared: HTTPFields = [.authorization: "Bearer air-secret"]
        try await agent.test(.router) { client in
            let stranger = try await client.execute(uri: AgentAPI.status.path(), method: .get)
            XCTAssertEqual(stranger.status, .unauthorized)
            let r = try await client.execute(uri: AgentAPI.status.path(), method: .get, headers: shared)
            XCTAssertEqual(r.status, .ok)
            XCTAssertEqual(try JSONDecoder().decode(LabWire.AgentStatus.self, from: Data(r.body.readableBytesView)).name, "agent1")
            let bad = try await client.execute(uri: AgentAPI.start.path(), method: .post, headers: shared, body: ByteBuffer(string: "{}"))
            XCTAssertEqual(bad.status, .badRequest)
            XCTAssertTrue(String(buffer: bad.body).hasPrefix(#"{"error":"request body is not a valid StartRequest: missing field"#), String(buffer: bad.body))
            let release = try await client.execute(uri: AgentAPI.release.path("no-such-run"), method: .post, headers: shared)
            XCTAssertEqual(release.status, .ok)
            XCTAssertEqual(String(buffer: release.body), #"{"released":"no-such-run"}"#, "the run parameter, from the table's template")
        }
    }

    func testTheCoordinatorAnswersItsEndpoints() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("routermode-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        var config = Coordinator.Config(results: dir)
        let token = "operator-0123456789abcdef0123456789"
        config.token = token
        let c = try Coordinator(config: config, logger: LogCapture.quiet())
        let op: HTTPFields = [.authorization: "Bearer \(token)"]
        let coordinator = Application(responder: c.http.responder())
        try await coordinator.test(.router) { client in
            let stranger = try await client.execute(uri: CoordinatorAPI.runs.path(), method: .get)
            XCTAssertEqual(stranger.status, .unauthorized)
            let r = try await client.execute(uri: CoordinatorAPI.runs.path(), method: .get, headers: op)
            XCTAssertEqual(r.status, .ok)
            XCTAssertEqual(String(buffer: r.body), "[]")
            let run = try await client.execute(uri: CoordinatorAPI.run.path("no-such-run"), method: .get, headers: op)
            XCTAssertEqual(run.status, .notFound)
            XCTAssertEqual(String(buffer: run.body), #"{"error":"no run no-such-run"}"#)
            let health = try await client.execute(uri: CoordinatorAPI.dongleHealth.path("d1"), method: .post, headers: op, body: ByteBuffer(string: #"{"health":"sick"}"#))
            XCTAssertEqual(health.status, .badRequest)
            XCTAssertTrue(String(buffer: health.body).hasPrefix(#"{"error":"request body is not a valid HealthRequest: "#), String(buffer: health.body))
            let page = try await client.execute(uri: "/lab", method: .get)
            XCTAssertEqual(page.status, .seeOther, "a dashboard page is public to the bearer check and sends a stranger to sign in")
            XCTAssertEqual(page.headers[.location], "/")
        }
    }
}
