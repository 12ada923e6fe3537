import Foundation
@testable import LabCoordinator
import LabPlan
import XCTest
@testable import HeraldLabCLI

/// Issue 40, item 5: `plan check` says what a plan needs of a lab (agents with radio and tags,
/// dongles by make or firmware), in its text and its --json; `run STUDY` measures the lab the
/// coordinator lists against it. Pure functions, and the command run as a process when it is
/// built (no lab: in `make test`).
final class PlanCheckNeedsTests: XCTestCase {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let binary = root.appendingPathComponent(".build/debug/herald-lab")

    func testTheNeedsLinesSayAgentsRadioTagsAndDongles() throws {
        let sim = try Plan.parse(yaml: "name: p\nduration: 1m\nnodes: {count: 3}\nagents: {tags: [east]}\n")
        XCTAssertEqual(PlanCommand.Check.needsLines(PlanCommand.Check.needs(sim, runs: nil)), ["  needs on a lab: 3 agents with radio sim with tags east"])
        let bluez = try Plan.parse(yaml: "name: p\nduration: 1m\nnodes: {count: 5}\nradio: {kind: bluez}\nagents: {manufacturer: Intel, firmware: [8870], spares: 1}\n")
        XCTAssertEqual(PlanCommand.Check.needsLines(PlanCommand.Check.needs(bluez, runs: nil)),
                       ["  needs on a lab: 5 agents with radio bluez and dongles of make Intel, firmware 8870, and up to 1 more as spares (checked with them, each standing in for a dongle that fails its pre-flight)"])
        let personas = try Plan.parse(yaml: "name: p\nduration: 1m\nnodes: [{name: a}, {name: b, persona: ios-foreground}]\n")
        XCTAssertEqual(PlanCommand.Check.needs(personas, runs: nil), [])
        XCTAssertTrue(PlanCommand.Check.needsLines([])[0].contains("not runnable"))
    }

    func testTheStudysNeedsAreInTheJSON() throws {
        let text = try String(contentsOf: Self.root.appendingPathComponent("plans/adv-interval-study.yaml"), encoding: .utf8)
        let plan = try Plan.parse(yaml: text)
        let checked = try PlanCommand.Check.checked(plan, text: text, source: "adv-interval-study.yaml")
        XCTAssertEqual(checked.needs, [AgentNeeds(agents: 25, radio: .sim)])
        XCTAssertEqual(checked.runs?.count, 10)
        let json = try XCTUnwrap(JSONSerialization.jsonObject(with: JSONEncoder().encode(checked)) as? [String: Any])
        let needs = try XCTUnwrap(json["needs"] as? [[String: Any]])
        XCTAssertEqual(needs.first?["agents"] as? Int, 25)
        XCTAssertEqual(needs.first?["radio"] as? String, "sim")
    }

    /// The lab as the coordinator lists it: busy agents (a run not ended holds them) and
    /// quarantined dongles do not fit.
    func testTheLabIsReadFromTheCoordinatorsLists() throws {
        func view(_ name: String, _ state: Coordinator.Liveness, dongle: String? = nil) -> Coordinator.AgentView {
            var info = LabWire.AgentInfo(name: name, url: "http://127.0.0.1/\(name)", tags: [], radio: dongle == nil ? .sim : .bluez, adapter: nil, controller: nil)
            if let dongle { info.dongle = LabWire.DongleInfo(id: dongle, name: name, present: true) }
            return Coordinator.AgentView(info: info, state: state, lastSeen: nil, status: nil, inInventory: false)
        }
        let running = RunRecord(id: "r1", plan: "p", planText: "", state: .running, created: 0, duration: 60, warmup: 0, air: nil,
                                nodes: [RunRecord.Node(name: "n1", agent: "a2", agentURL: "http://127.0.0.1/a2", state: .running, files: [])])
        var ended = running
        ended.state = .complete
        ended.nodes[0].agent = "a3"
        ended.nodes[0].agentURL = "http://127.0.0.1/a3"
        var bad = LabWire.DongleView(id: "F0:00:00:00:00:05", info: LabWire.DongleInfo(id: "F0:00:00:00:00:05", name: "d5", present: true), health: .bad,
                                     failures: 2, outliers: 0, firstSeen: 0, lastSeen: 0, history: [])
        bad.healthReason = "failed 2 checks"
        let offers = RunCommand.offers(agents: [view("a1", .alive), view("a2", .alive), view("a3", .alive), view("a4", .lost), view("a5", .alive, dongle: "F0:00:00:00:00:05")],
                                       runs: [running, ended], dongles: [bad])
        XCTAssertEqual(offers.map(\.alive), [true, true, true, false, true])
        XCTAssertEqual(offers.map(\.busy), [false, true, false, false, false])
        XCTAssertEqual(offers[4].unusable, "dongle d5 (F0:00:00:00:00:05) is bad: failed 2 checks")
        XCTAssertEqual(AgentNeeds(agents: 25, radio: .sim).fit(offers).reason,
                       "needs 25 agents with radio sim, but 2 fit (a1, a3); not alive: a4; busy with another run: a2")
    }

    func testPlanCheckPrintsTheNeeds() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.binary.path) else { throw XCTSkip("build herald-lab first") }
        func run(_ args: [String]) throws -> (Int32, String) {
            let p = Process()
            p.executableURL = Self.binary
            p.arguments = args
            let out = Pipe()
            p.standardOutput = out
            p.standardError = out
            try p.run()
            let data = out.fileHandleForReading.readDataToEndOfFile()
            p.waitUntilExit()
            return (p.terminationStatus, String(decoding: data, as: UTF8.self))
        }
        let study = Self.root.appendingPathComponent("plans/adv-interval-study.yaml").path
        let (code, text) = try run(["plan", "check", study])
        XCTAssertEqual(code, 0, text)
        XCTAssertTrue(text.contains("  needs on a lab: 25 agents with radio sim\n"), text)
        let (jc, json) = try run(["plan", "check", study, "--json"])
        XCTAssertEqual(jc, 0, json)
        let doc = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
        XCTAssertEqual((doc["needs"] as? [[String: Any]])?.first?["agents"] as? Int, 25)
        let (bc, bluez) = try run(["plan", "check", Self.root.appendingPathComponent("plans/dongles-5.yaml").path])
        XCTAssertEqual(bc, 0, bluez)
        XCTAssertTrue(bluez.contains("needs on a lab: 5 agents with radio bluez"), bluez)
    }
}
