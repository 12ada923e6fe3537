import XCTest
import HeraldCore
import HeraldLogs
import HeraldRadio
import HeraldSensor
import LabPlan
import RadioSim
@testable import LabNode

final class NodeRunnerTests: XCTestCase {
    var tmp: URL!
    override func setUp() { tmp = FileManager.default.temporaryDirectory.appendingPathComponent("runner-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    let plan = try! Plan.parse(yaml: "name: p\nduration: 2m\nnodes: [a, b]")

    func runner(power: any PowerSource, osVersion: String? = nil) -> (NodeRunner, VirtualScheduler) {
        let scheduler = VirtualScheduler(start: plan.start)
        let medium = SimMedium(scheduler: scheduler, seed: 1)
        let transport = medium.addNode(name: "a", x: 0, y: 0)
        let assignment = NodeAssignment(runId: "r", plan: plan, node: plan.nodes[0])
        let r = NodeRunner(assignment: assignment, transport: transport, directory: tmp.appendingPathComponent("a"), power: power, osVersion: osVersion)
        return (r, scheduler)
    }

    func text(_ file: String) throws -> String { try String(contentsOf: tmp.appendingPathComponent("a/\(file)"), encoding: .utf8) }

    func testLabNodesOnARealRadioSpreadTheirConnectionsAndSimulationsDoNot() throws {
        let (simulated, _) = runner(power: MainsPower())
        XCTAssertEqual(simulated.sensor.settings.connectionSpread, 0, "a simulation keeps Herald's timing")
        let bluez = try Plan.parse(yaml: "name: p\nduration: 2m\nnodes: [a, b]\nradio:\n  kind: bluez")
        let scheduler = VirtualScheduler(start: bluez.start)
        let transport = SimMedium(scheduler: scheduler, seed: 1).addNode(name: "a", x: 0, y: 0)
        let node = NodeRunner(assignment: NodeAssignment(runId: "r", plan: bluez, node: bluez.nodes[0]), transport: transport,
                              directory: tmp.appendingPathComponent("b"), power: MainsPower(), osVersion: "6.1")
        XCTAssertEqual(node.sensor.settings.connectionSpread, BLESensorSettings.labConnectionSpread)
    }

    func testDetectionAndStatusCarryTheKernelRelease() throws {
        let uname = Process()
        uname.executableURL = URL(fileURLWithPath: "/bin/uname")
        uname.arguments = ["-r"]
        let pipe = Pipe()
        uname.standardOutput = pipe
        try uname.run()
        uname.waitUntilExit()
        let release = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertFalse(release.isEmpty)
        XCTAssertEqual(HostSystem.kernelRelease(), release)

        let (r, scheduler) = runner(power: MainsPower())
        XCTAssertEqual(NodeAssignment(runId: "r", plan: plan, node: plan.nodes[0]).osVersion, nil, "an assignment leaves the version to the node")
        r.start()
        scheduler.run(until: plan.start.addingTimeInterval(5))
        r.stop()
        XCTAssertEqual(r.osVersion, release)
        XCTAssertEqual(r.status.osVersion, release, "the status carries it to the coordinator's manifest")
        XCTAssertEqual(try text("detection.csv"), "a,Linux,\(release),\(plan.nodes[0].shortName)\n")
    }

    func testBatteryComesFromThePowerSupplyFolder() throws {
        let ps = tmp.appendingPathComponent("power_supply")
        let bat = ps.appendingPathComponent("BAT0")
        try FileManager.default.createDirectory(at: bat, withIntermediateDirectories: true)
        func put(_ file: String, _ value: String) throws { try (value + "\n").write(to: bat.appendingPathComponent(file), atomically: true, encoding: .utf8) }
        try put("type", "Battery")
        try put("status", "Discharging")
        try put("capacity", "57")
        let (r, scheduler) = runner(power: SysfsPowerSupply(root: ps), osVersion: "6.1")
        r.start()
        scheduler.run(until: plan.start.addingTimeInterval(40))
        try put("capacity", "56")
        scheduler.run(until: plan.start.addingTimeInterval(50))
        try put("status", "Charging")
        scheduler.run(until: plan.start.addingTimeInterval(60))
        r.stop()
        let rows = try text("battery.csv").split(separator: "\n").map { $0.split(separator: ",").dropFirst().joined(separator: ",") }
        XCTAssertEqual(rows, ["source,level", "battery,57.0", "battery,57.0", "battery,56.0", "external,56.0"])
    }

    func testNoBatteryMeansMains() throws {
        let empty = tmp.appendingPathComponent("power_supply")
        try FileManager.default.createDirectory(at: empty, withIntermediateDirectories: true)
        let (r, scheduler) = runner(power: SysfsPowerSupply(root: empty), osVersion: "6.1")
        r.start()
        scheduler.run(until: plan.start.addingTimeInterval(1))
        r.stop()
        XCTAssertEqual(try text("battery.csv").split(separator: "\n").last.map { $0.split(separator: ",").dropFirst().joined(separator: ",") }, "external,100.0")
    }
}
