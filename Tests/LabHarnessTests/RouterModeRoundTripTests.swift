import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LabPlan
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

    func testAnAgentAndTheCoordinatorAnswerTheirEndpoints() async throws {
        let lab = try await MemoryLab.make(agents: 1)
        self.lab = lab
        let agent = Application(responder: lab.agents["agent1"]!.http.responder())
        try await agent.test(.router) { client in
            let r = try await client.execute(uri: AgentAPI.status.path(), method: .get)
            XCTAssertEqual(r.status, .ok)
            XCTAssertEqual(try JSONDecoder().decode(LabWire.AgentStatus.self, from: Data(r.body.readableBytesView)).name, "agent1")
            let bad = try await client.execute(uri: AgentAPI.start.path(), method: .post, body: ByteBuffer(string: "{}"))
            XCTAssertEqual(bad.status, .badRequest)
            XCTAssertTrue(String(buffer: bad.body).hasPrefix(#"{"error":"request body is not a valid StartRequest: missing field"#), String(buffer: bad.body))
            let release = try await client.execute(uri: AgentAPI.release.path("no-such-run"), method: .post)
            XCTAssertEqual(release.status, .notFound, String(buffer: release.body))
        }
        let coordinator = Application(responder: lab.coordinator.http.responder())
        try await coordinator.test(.router) { client in
            let r = try await client.execute(uri: CoordinatorAPI.agents.path(), method: .get)
            XCTAssertEqual(r.status, .ok)
            XCTAssertEqual(try JSONDecoder().decode([Coordinator.AgentView].self, from: Data(r.body.readableBytesView)).map(\.info.name), ["agent1"])
            let run = try await client.execute(uri: CoordinatorAPI.run.path("no-such-run"), method: .get)
            XCTAssertEqual(run.status, .notFound)
            XCTAssertEqual(String(buffer: run.body), #"{"error":"no run no-such-run"}"#)
        }
    }
}
