import XCTest
import LabNode
import LabPlan

/// A plan that never went through the YAML checks (built in code, decoded from JSON) is still
/// range-checked before it is simulated.
final class SimulationLimitsTests: XCTestCase {
    func testOutOfRangePlansAreRefusedNotSimulated() throws {
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("simlimits-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: out) }
        for bad: (inout Plan) -> Void in [{ $0.nodes[0].position.x = .nan }, { $0.duration = .infinity }, { $0.duration = 1e19 }, { $0.sensor.scanOn = 1e-300 }] {
            var plan = Plan(name: "x", duration: 10, nodes: [NodeSpec(name: "a", position: Position(x: 0, y: 0)), NodeSpec(name: "b", position: Position(x: 1, y: 0))])
            bad(&plan)
            XCTAssertThrowsError(try Simulation(plan: plan, planText: "", output: out).run()) { error in
                XCTAssertTrue("\(error)".hasPrefix("the plan cannot be simulated: "), "\(error)")
            }
        }
    }
}
