import XCTest
import HeraldCore
import LabPlan
@testable import LabNode
@testable import RadioSim

final class SimulationTests: XCTestCase {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    var tmp: URL!

    override func setUp() { tmp = FileManager.default.temporaryDirectory.appendingPathComponent("sim-\(UUID().uuidString)") }
    override func tearDown() { try? FileManager.default.removeItem(at: tmp) }

    func plan(_ name: String) throws -> (Plan, String) {
        let path = Self.packageRoot.appendingPathComponent("plans/\(name).yaml").path
        return (try Plan.load(path: path), try String(contentsOfFile: path, encoding: .utf8))
    }

    func simulate(_ plan: Plan, text: String = "", seed: UInt64? = nil, into name: String) throws -> Simulation.Result {
        try Simulation(plan: plan, planText: text, seed: seed, output: tmp.appendingPathComponent(name)).run()
    }

    func contacts(_ bundle: URL, _ node: String) throws -> [[Substring]] {
        try String(contentsOf: bundle.appendingPathComponent("nodes/\(node)/contacts.csv"), encoding: .utf8)
            .split(separator: "\n").dropFirst().map { $0.split(separator: ",", omittingEmptySubsequences: false) }
    }

    func testOfficeTenEveryNodeDetectsAndReadsTheOtherNineAtTheExpectedRSSIRate() throws {
        let (plan, text) = try plan("office-10")
        let result = try simulate(plan, text: text, into: "office")
        let shortNames = plan.nodes.map(\.shortName)
        for (i, node) in plan.nodes.enumerated() {
            let bundle = result.bundle
            let detection = try String(contentsOf: bundle.appendingPathComponent("nodes/\(node.name)/detection.csv"), encoding: .utf8)
            let fields = detection.trimmingCharacters(in: .newlines).split(separator: ",").map(String.init)
            XCTAssertEqual(Array(fields.prefix(4)), [node.name, "Linux", "6.1", shortNames[i]])
            XCTAssertEqual(Array(fields.dropFirst(4)), shortNames.filter { $0 != shortNames[i] }.sorted(), "\(node.name) lists the other nine")

            let rows = try contacts(bundle, node.name)
            let reads = rows.filter { $0[4] == "2" }
            XCTAssertEqual(Set(reads.map { String($0[10]) }), Set(shortNames.filter { $0 != shortNames[i] }), "a read row for every peer")
            let readIds = Set(reads.map { $0[2] })
            let rssi = rows.filter { $0[5] == "3" }
            XCTAssertTrue(rssi.allSatisfy { readIds.contains($0[2]) }, "every RSSI row's id has a read row (Herald's analysis drops the others)")
            XCTAssertTrue(rssi.allSatisfy { $0[10].hasPrefix("RSSI:-") && $0[10].hasSuffix(".0") })
            // 9 peers x adverts per second x scan duty x (1 - loss) x duration
            let s = plan.sensor
            let duty = s.scanOn / (s.scanOn + s.scanRest + s.scanOff)
            let expected = 9 * (1 / (s.advertInterval + 0.005)) * duty * (1 - plan.radio.reportLoss) * plan.duration
            XCTAssertEqual(Double(rssi.count), expected, accuracy: expected * 0.05, "\(node.name) RSSI rows")
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: result.bundle.appendingPathComponent("nodes/node1").path).sorted(),
                       ["battery.csv", "contacts.csv", "detection.csv", "log.txt", "statistics.csv"], "exactly the Herald files")
    }

    func testSameSeedGivesByteIdenticalBundlesAndAnotherSeedDoesNot() throws {
        var (plan, text) = try plan("smoke")
        plan.duration = 60
        // Same run id (folder name) in different places, so that log.txt may be compared too.
        let a = try simulate(plan, text: text, seed: 11, into: "a/run"), b = try simulate(plan, text: text, seed: 11, into: "b/run"), c = try simulate(plan, text: text, seed: 12, into: "c/run")
        for node in plan.nodes {
            for file in NodeRunner.heraldFiles {
                XCTAssertEqual(a.manifest.nodes.first { $0.name == node.name }!.files[file], b.manifest.nodes.first { $0.name == node.name }!.files[file], "\(node.name)/\(file)")
            }
        }
        XCTAssertNotEqual(a.manifest.nodes[0].files["contacts.csv"], c.manifest.nodes[0].files["contacts.csv"])
        let ma = try Data(contentsOf: a.bundle.appendingPathComponent("manifest.json")), mb = try Data(contentsOf: b.bundle.appendingPathComponent("manifest.json"))
        XCTAssertEqual(ma, mb, "manifest.json is byte-identical too")
    }

    func testThreadsHandingReportsOverNeverChangeTheBundle() throws {
        // Power cycles, MAC rotation and crowding (collisions, report rate, connection limits)
        // on 12 nodes: every file of every node is the same with 1, 2 and 3 threads. Batches
        // are small, so that reports are handed over in parallel, behind the simulation's back
        // and by nodes' own events all the time.
        let saved = (DeliveryLanes.smallBatch, DeliveryLanes.fullFrom, DeliveryLanes.drainAt)
        (DeliveryLanes.smallBatch, DeliveryLanes.fullFrom, DeliveryLanes.drainAt) = (1, 48, 200)
        defer { (DeliveryLanes.smallBatch, DeliveryLanes.fullFrom, DeliveryLanes.drainAt) = saved }
        for crowding in ["off", "on"] {
            let plan = try Plan.parse(yaml: """
            name: lanes
            duration: 4m
            warmup: 10s
            nodes:
              count: 12
              prefix: n
              grid: {columns: 4, spacing: 1.5m}
            radio:
              shadowing: 4
              reportLoss: 0.1
              macRotation: 50s
              crowding: \(crowding)
            """)
            var powered = plan
            powered.nodes[3].power = [PowerInterval(off: 60, on: 100)]
            powered.nodes[7].power = [PowerInterval(off: 130, on: nil)]
            var manifests = [Data]()
            for threads in [1, 2, 3] {
                let out = tmp.appendingPathComponent("\(crowding)-\(threads)/run")
                let result = try Simulation(plan: powered, planText: "", output: out, threads: threads).run()
                XCTAssertGreaterThan(result.reportsDelivered, 10_000)
                manifests.append(try Data(contentsOf: out.appendingPathComponent("manifest.json")))
                for node in plan.nodes {
                    for file in NodeRunner.heraldFiles {
                        let this = try Data(contentsOf: out.appendingPathComponent("nodes/\(node.name)/\(file)"))
                        let one = try Data(contentsOf: tmp.appendingPathComponent("\(crowding)-1/run/nodes/\(node.name)/\(file)"))
                        XCTAssertEqual(this, one, "crowding \(crowding), \(threads) threads: \(node.name)/\(file)")
                    }
                }
            }
            XCTAssertEqual(Set(manifests).count, 1, "crowding \(crowding): manifest.json")
        }
    }

    func testManifestDescribesTheRun() throws {
        let (plan, text) = try plan("smoke")
        let result = try simulate(plan, text: text, into: "m")
        let m = try Manifest.read(from: result.bundle.appendingPathComponent("manifest.json"))
        XCTAssertEqual(m.format, "heraldlab-bundle/1")
        XCTAssertEqual(m.mode, .simulate)
        XCTAssertEqual(m.plan.name, "smoke")
        XCTAssertEqual(m.planText, text)
        XCTAssertEqual(m.contactEvent.start, plan.start.addingTimeInterval(10))
        XCTAssertEqual(m.contactEvent.end, plan.start.addingTimeInterval(120))
        XCTAssertEqual(m.nodes.map(\.name), ["alpha", "beta"])
        XCTAssertEqual(m.nodes.map(\.shortName), plan.nodes.map(\.shortName))
        let contacts = try Data(contentsOf: result.bundle.appendingPathComponent("nodes/alpha/contacts.csv"))
        XCTAssertEqual(m.nodes[0].files["contacts.csv"], Manifest.FileEntry(bytes: Int64(contacts.count), sha256: SHA256.hash(contacts)))
        XCTAssertThrowsError(try simulate(plan, text: text, into: "m"), "an existing bundle is never overwritten")
    }

    func testMACRotatingPeersStayOneDeviceEach() throws {
        let (plan, text) = try plan("mac-rotation")
        let result = try simulate(plan, text: text, into: "rot")
        for node in plan.nodes {
            let rows = try contacts(result.bundle, node.name)
            XCTAssertEqual(rows.filter { $0[3] == "1" }.count, 2, "\(node.name): one detection per peer despite ~10 MAC changes each")
            XCTAssertEqual(rows.filter { $0[4] == "2" }.count, 2, "\(node.name): each peer's payload read once")
            let ids = Set(rows.filter { $0[5] == "3" }.map { $0[2] })
            XCTAssertEqual(ids.count, 2, "\(node.name): RSSI rows stay under the first identifier")
            // RSSI keeps coming through to the end.
            let last = rows.filter { $0[5] == "3" }.last.map { String($0[0].prefix(19)) }
            XCTAssertEqual(last.map { String($0.prefix(16)) }, "2026-01-01 00:04", "\(node.name) still measuring at the end")
        }
    }

    func testPeerPoweredOffIsPurgedAsEvent7AndComesBack() throws {
        let plan = try Plan.parse(yaml: """
        name: power
        duration: 40m
        nodes:
          - {name: a, position: [0, 0]}
          - {name: b, position: [1, 0], power: [{off: 2m, on: 25m}]}
        """)
        let result = try simulate(plan, into: "power")
        let rows = try contacts(result.bundle, "a")
        let deletes = rows.filter { $0[9] == "7" }
        XCTAssertEqual(deletes.count, 1, "b is purged once")
        if let d = deletes.first {
            XCTAssertTrue(d[0].hasPrefix("2026-01-01 00:17"), "15 minutes after b went quiet: \(d[0])")
        }
        XCTAssertEqual(rows.filter { $0[3] == "1" }.count, 2, "b is detected again after it powers on")
        XCTAssertEqual(result.manifest.nodes[1].state, .complete)
        let bLog = try String(contentsOf: result.bundle.appendingPathComponent("nodes/b/log.txt"), encoding: .utf8)
        XCTAssertTrue(bLog.contains("radio poweredOff"))
        XCTAssertTrue(bLog.contains("radio on"))
    }
}
