import XCTest
import HeraldCore
import LabPlan
@testable import LabNode

/// Plans with `radio.crowding`: every part off is the idealised radio byte for byte; a crowded
/// grid loses reports and reads; a seed gives the same run.
final class CrowdingSimulationTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = FileManager.default.temporaryDirectory.appendingPathComponent("crowd-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func run(_ yaml: String, into name: String) throws -> (Simulation.Result, [String: Data]) {
        let plan = try Plan.parse(yaml: yaml, source: name)
        let result = try Simulation(plan: plan, planText: yaml, output: tmp.appendingPathComponent(name)).run()
        var files = [String: Data]()
        for node in plan.nodes {
            for file in ["contacts.csv", "detection.csv", "statistics.csv"] {
                files["\(node.name)/\(file)"] = try Data(contentsOf: result.bundle.appendingPathComponent("nodes/\(node.name)/\(file)"))
            }
        }
        return (result, files)
    }

    func grid(_ count: Int, _ radio: String) -> String {
        "name: g\nduration: 2m\nwarmup: 10s\nnodes: {count: \(count), prefix: node, grid: {columns: 10, spacing: 2m}}\n" + radio
    }

    func testEveryPartOffIsByteIdenticalToNoCrowding() throws {
        let (_, plain) = try run(grid(6, ""), into: "plain")
        let (r, off) = try run(grid(6, "radio:\n  crowding: {collisions: off, capture: off, scanWindow: off, reportRate: off, maxConnections: off, discoveryTime: 0s, connectLoad: off}\n"), into: "off")
        XCTAssertEqual(plain, off)
        XCTAssertEqual(r.collisionsLost + r.reportsDropped + r.connectionsRefused, 0)
    }

    func testCrowdingIsDeterministicAndCostsReports() throws {
        let (a, filesA) = try run(grid(40, "radio:\n  crowding: on\n"), into: "a")
        let (_, filesB) = try run(grid(40, "radio:\n  crowding: on\n"), into: "b")
        XCTAssertEqual(filesA, filesB, "same seed, byte-identical logs")
        let (ideal, _) = try run(grid(40, ""), into: "ideal")
        XCTAssertGreaterThan(a.collisionsLost, 0)
        XCTAssertLessThan(a.reportsDelivered, ideal.reportsDelivered)
    }
}
