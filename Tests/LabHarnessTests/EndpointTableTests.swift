import XCTest
import LabPlan
@testable import LabAgent
@testable import LabCoordinator

/// One endpoint table for both sides (issue 39): what the agent and the coordinator route is
/// exactly LabPlan's `AgentAPI` and `CoordinatorAPI` (beside /health and the dashboard's pages),
/// and the clients build their paths from the same table.
final class EndpointTableTests: XCTestCase {
    var lab: MemoryLab?
    override func tearDown() async throws { await lab?.stop(); lab = nil }

    static func set(_ pairs: [(String, String)]) -> Set<String> { Set(pairs.map { "\($0.0) \($0.1)" }) }

    func testTheServersRouteExactlyTheTable() async throws {
        let lab = try await MemoryLab.make(agents: 1)
        self.lab = lab
        let agent = Self.set(lab.agents["agent1"]!.http.routeTable.map { ($0.method, $0.path) }).subtracting(["GET /health"])
        XCTAssertEqual(agent, Self.set(AgentAPI.all), "the agent routes the table, no more, no less")
        let api = Self.set(lab.coordinator.http.routeTable.map { ($0.method, $0.path) }.filter { $0.1.hasPrefix("/v1/") || $0.1 == "/metrics" })
        XCTAssertEqual(api, Self.set(CoordinatorAPI.all), "the coordinator's API routes are the table's")
    }

    func testPathsFillTheirParametersAsOneSegmentEach() {
        XCTAssertEqual(CoordinatorAPI.abort.path("r-1"), "/v1/runs/r-1/abort")
        XCTAssertEqual(AgentAPI.file.path("r 1", "a/b?c"), "/v1/runs/r%201/files/a%2Fb%3Fc")
        XCTAssertEqual(CoordinatorAPI.submit.path(query: "name=x"), "/v1/runs?name=x")
        XCTAssertEqual(CoordinatorAPI.heartbeat.parameters, ["name"])
    }
}
