import XCTest
import HeraldCore
import LabPlan
import RadioSim
import HeraldRadio
@testable import LabNode

/// `radio.devices` and `radio.environment` in simulations: off is byte for byte what earlier
/// versions wrote; on, a seed still gives byte-identical logs, a device keeps its character
/// across seeds, and a new seed changes the run's noise and room.
final class VarianceSimulationTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = FileManager.default.temporaryDirectory.appendingPathComponent("variance-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func run(_ yaml: String, seed: UInt64? = nil, into name: String) throws -> (Manifest, [String: Data]) {
        let plan = try Plan.parse(yaml: yaml, source: name)
        let result = try Simulation(plan: plan, planText: yaml, seed: seed, output: tmp.appendingPathComponent(name), runId: "r").run()
        var files = [String: Data]()
        for node in plan.nodes {
            for file in NodeRunner.heraldFiles {
                files["\(node.name)/\(file)"] = try Data(contentsOf: result.bundle.appendingPathComponent("nodes/\(node.name)/\(file)"))
            }
        }
        return (result.manifest, files)
    }

    func grid(_ radio: String) -> String {
        "name: g\nduration: 3m\nwarmup: 10s\nnodes: {count: 6, prefix: node, grid: {columns: 3, spacing: 2m}}\nradio:\n  macRotation: 50s\n" + radio
    }

    /// SHA-256 of each persona's contacts.csv for plans/personas.yaml, written by the simulator
    /// before devices and environments existed (commit ea0abd0): both off must not change a byte.
    func testOffIsWhatEarlierVersionsWrote() throws {
        let yaml = try String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../plans/personas.yaml"), encoding: .utf8)
        let off = yaml.replacingOccurrences(of: "radio:\n  kind: sim\n", with: "radio:\n  kind: sim\n  devices: off\n  environment: off\n")
        XCTAssertNotEqual(off, yaml)
        let (_, files) = try run(off, into: "personas")
        let expected = [
            "android": "40a4709230d296a5063d99f6a440b32f1dee143e272f8cc4745ddb9b72f2c883",
            "iphone-bg": "75427dd07a45e74f6ab7a8199e49c171ace9b535b8675f875e9ad4ac887aadb1",
            "iphone-fg": "6911491f46a93210a2fcca6e091fb1666cdda4031404dd27623d0d9bcea37982",
            "linux": "af202bd4b7bc0521e2744744b5ebfbe72d5ca8c74ad97ff42a927b700c9f470e",
        ]
        for (node, sha) in expected {
            XCTAssertEqual(SHA256.hash(try XCTUnwrap(files["\(node)/contacts.csv"])), sha, node)
        }
    }

    func testOnIsDeterministicAndDevicesKeepTheirCharacterAcrossSeeds() throws {
        let yaml = grid("  devices: on\n  environment: {burstRate: 120, burstLength: 10s}\n")
        let (m1, a) = try run(yaml, seed: 11, into: "a")
        let (_, b) = try run(yaml, seed: 11, into: "b")
        XCTAssertEqual(a, b, "same seed, byte-identical logs")
        let (m2, c) = try run(yaml, seed: 12, into: "c")
        XCTAssertNotEqual(a["node1/contacts.csv"], c["node1/contacts.csv"], "a new seed is a new run")
        XCTAssertEqual(m1.nodes.map(\.character), m2.nodes.map(\.character), "the same devices in both runs")
        XCTAssertEqual(m1.nodes[0].character, DeviceVariation().character(of: "node1"), "drawn by identity")
        XCTAssertNotEqual(m1.nodes[0].character, m1.nodes[1].character)
        let e1 = try XCTUnwrap(m1.environment), e2 = try XCTUnwrap(m2.environment)
        XCTAssertNotEqual(e1.pathLossOffset, e2.pathLossOffset, "each run its own room")
        XCTAssertGreaterThan(e1.bursts, 0, "120 bursts an hour over 3 minutes")
        let (plain, _) = try run(grid(""), seed: 11, into: "plain")
        XCTAssertNil(plain.environment)
        XCTAssertTrue(plain.nodes.allSatisfy { $0.character == nil })
    }

    func testDevicesDifferWhereTheyStandAlike() throws {
        var p = RadioParameters()
        p.shadowing = 0
        func spread(_ devices: DeviceVariation?) -> Double {
            var q = p
            q.devices = devices
            let medium = SimMedium(scheduler: VirtualScheduler(start: Date(timeIntervalSince1970: 0)), parameters: q, seed: 1)
            // Eight devices on a circle around a ninth: every path is 2 m.
            _ = medium.addNode(name: "centre", x: 0, y: 0)
            for k in 0..<8 {
                let angle: Double = Double(k) * Double.pi / 4
                _ = medium.addNode(name: "d\(k)", x: 2 * cos(angle), y: 2 * sin(angle))
            }
            let heard = (1...8).map { medium.meanRSSI(from: $0, to: 0) }
            return heard.max()! - heard.min()!
        }
        XCTAssertEqual(spread(nil), 0, accuracy: 1e-9, "identical devices at one distance")
        XCTAssertGreaterThan(spread(DeviceVariation()), 3, "devices of one make differ by several dB")
    }

    func testEnvironmentMovesThePathsDuringARun() throws {
        var p = RadioParameters()
        var e = RunEnvironment()
        e.burstRate = 0
        p.environment = e
        let scheduler = VirtualScheduler(start: Date(timeIntervalSince1970: 0))
        let medium = SimMedium(scheduler: scheduler, parameters: p, seed: 3)
        _ = medium.addNode(name: "a", x: 0, y: 0)
        _ = medium.addNode(name: "b", x: 2, y: 0)
        var seen = [Double]()
        for k in 1...60 {
            scheduler.run(until: Date(timeIntervalSince1970: Double(k) * 60))
            seen.append(medium.meanRSSI(from: 0, to: 1))
        }
        let mean = seen.reduce(0, +) / Double(seen.count)
        let sd = (seen.map { ($0 - mean) * ($0 - mean) }.reduce(0, +) / Double(seen.count - 1)).squareRoot()
        XCTAssertGreaterThan(sd, 1, "an hour of people and furniture moving")
        XCTAssertLessThan(sd, 4 * e.fieldSpread)
    }
}
