import XCTest
import HeraldCore
@testable import LabPlan

final class PlanTests: XCTestCase {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func problems(_ yaml: String) -> [String] {
        do {
            _ = try Plan.parse(yaml: yaml, source: "t.yaml")
            return []
        } catch {
            return error.problems.map { "\($0.path): \($0.message)" }
        }
    }

    func testShippedPlansParse() throws {
        for name in ["smoke", "office-10", "longevity-10", "mac-rotation", "personas"] {
            let plan = try Plan.load(path: Self.packageRoot.appendingPathComponent("plans/\(name).yaml").path)
            XCTAssertEqual(plan.name, name)
        }
        let office = try Plan.load(path: Self.packageRoot.appendingPathComponent("plans/office-10.yaml").path)
        XCTAssertEqual(office.nodes.count, 10)
        XCTAssertEqual(office.duration, 1800)
        XCTAssertEqual(office.nodes[6].position, Position(x: 2, y: 2), "node7 sits in row 2, column 2 of a 5-wide grid with 2 m spacing")
        XCTAssertEqual(office.nodes[0].name, "node1")
        XCTAssertEqual(office.nodes[0].shortName, "hBWwSg", "node1's identifier is derived as PROTOCOL.md says")
        let longevity = try Plan.load(path: Self.packageRoot.appendingPathComponent("plans/longevity-10.yaml").path)
        XCTAssertEqual(longevity.duration, 8 * 3600)
    }

    func testDefaultsAndUnits() throws {
        let plan = try Plan.parse(yaml: """
        name: p
        duration: 1.5h
        warmup: 500ms
        nodes: [a, b]
        sensor: {scan: {on: 3s}, advertInterval: 100ms}
        radio: {macRotation: 2m}
        """)
        XCTAssertEqual(plan.duration, 5400)
        XCTAssertEqual(plan.warmup, 0.5)
        XCTAssertEqual(plan.sensor.scanOn, 3)
        XCTAssertEqual(plan.sensor.scanRest, 1)
        XCTAssertEqual(plan.sensor.advertInterval, 0.1, accuracy: 1e-9)
        XCTAssertEqual(plan.radio.macRotation, 120)
        XCTAssertEqual(plan.nodes.map(\.name), ["a", "b"])
        XCTAssertEqual(plan.thresholds.detectionPct, 100)
    }

    func testPinnedIdentifier() throws {
        let plan = try Plan.parse(yaml: """
        name: p
        duration: 1m
        nodes:
          - {name: a, identifier: 1784521062}
          - {name: b, identifier: -502964310, position: [150cm, 2]}
        """)
        XCTAssertEqual(plan.nodes.map(\.shortName), ["ZqFdag", "ql8F4g"])
        XCTAssertEqual(plan.nodes[1].position, Position(x: 1.5, y: 2))
    }

    func testPersonas() throws {
        let plan = try Plan.parse(yaml: """
        name: p
        duration: 1m
        nodes:
          - {name: a}
          - {name: b, persona: android}
          - {name: c, persona: ios-background}
          - {name: d, persona: ios-foreground}
          - {name: e, persona: linux}
        """)
        XCTAssertEqual(plan.nodes.map(\.persona), [nil, .android, .iosBackground, .iosForeground, nil])
        // A Linux node's JSON (manifests, assignments) is what it was before personas existed.
        let json = String(decoding: try JSONEncoder().encode(plan.nodes[0]), as: UTF8.self)
        XCTAssertFalse(json.contains("persona"))
        XCTAssertEqual(try JSONDecoder().decode(NodeSpec.self, from: JSONEncoder().encode(plan.nodes[2])), plan.nodes[2])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes:\n  - {name: a}\n  - {name: b, persona: windows-phone}"),
                       ["nodes[1].persona: \"windows-phone\" is not a persona; use android, ios-background, ios-foreground, android-receive-only, or linux (the default: a Linux node)"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes:\n  - {name: a}\n  - {name: b, persona: [ios]}"), ["nodes[1].persona: expected text"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes:\n  - {name: a}\n  - {name: b, persona: android}\nradio: {kind: bluez}"),
                       ["nodes[1].persona: android is a simulated phone: personas need radio kind sim (a lab drives Linux nodes only)"])
        var bluez = plan
        bluez.radio.kind = .bluez
        XCTAssertEqual(bluez.rangeProblems.count, 3, "plans built in code are checked too")
    }

    func testBadPlansNameTheFieldAndTheProblem() {
        XCTAssertEqual(problems("name: p\nduration: 30\nnodes: [a, b]"), ["duration: \"30\" has no unit; write a duration with one, such as 30s (units ms, s, m, h, d)"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {scan: {on: -4s}}"), ["sensor.scan.on: negative duration \"-4s\""])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b, a]"), ["nodes[2].name: duplicate node name \"a\" (also nodes[0])"])
        let unknown = problems("name: p\nduration: 1m\nnodes: [a, b]\nradio: {reportLos: 0.1}")
        XCTAssertEqual(unknown.count, 1)
        XCTAssertTrue(unknown[0].hasPrefix("radio.reportLos: unknown field (did you mean reportLoss? known: kind, adapter"), unknown[0])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nradio: {reportLoss: 1.5}"), ["radio.reportLoss: 1.5 is out of range; expected a probability from 0 to 1"])
        XCTAssertEqual(problems("name: ../etc\nduration: 1m\nnodes: [a, b]"), ["name: \"../etc\" must not start with '.'"])
        // A run id starts with the plan's name and reaches tar's command line (issue 36).
        XCTAssertEqual(problems("name: \"-g\"\nduration: 1m\nnodes: [a, b]"), ["name: \"-g\" must not start with '-'"])
        XCTAssertEqual(problems("name: \"-C\"\nduration: 1m\nnodes: [\"--x\", b]"), ["name: \"-C\" must not start with '-'", "nodes[0]: \"--x\" must not start with '-'"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, \"b/c\"]"), ["nodes[1]: \"b/c\" may hold only letters, digits, '-', '_' and '.' (found \"/\")"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nwarmup: 2m\nnodes: [a, b]"), ["warmup: must be shorter than duration"])
        XCTAssertEqual(problems("duration: 1m\nnodes: [a, b]"), ["name: required: the plan's name"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes:\n  - {name: a, identifier: 5}\n  - {name: b, identifier: 5}"),
                       ["nodes[1].identifier: gives shortName \"BQAAAA\", the same as nodes[0] (a); logs could not tell them apart"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: [a, b]\nsensor: {logLevel: loud}"), ["sensor.logLevel: \"loud\" is not a level; use debug, info or fault"])
        XCTAssertEqual(problems("name: p\nduration: 1m\nnodes: {count: 3, grid: {spacing: 2ft}}"), ["nodes.grid.spacing: \"2ft\" is not a distance; write metres such as 2, 2m or 150cm"])
        XCTAssertFalse(problems("name: [unclosed").isEmpty)
        XCTAssertEqual(problems(""), [": the file is empty; a plan needs at least name, duration and nodes"])
    }

    func testErrorsCarryLineNumbersAndAllProblems() {
        do {
            _ = try Plan.parse(yaml: "name: p\nduration: 10\nnodes: [a]\n", source: "x.yaml")
            XCTFail("should fail")
        } catch {
            XCTAssertEqual(error.problems.count, 2)
            XCTAssertTrue(error.description.contains("x.yaml: duration: \"10\" has no unit"), error.description)
            XCTAssertEqual(error.problems.first?.line, 2)
        }
    }

    func testManifestRoundTripsWithISOTimes() throws {
        let plan = try Plan.parse(yaml: "name: p\nduration: 2m\nwarmup: 10s\nnodes: [a, b]")
        let ce = plan.contactEvent(startingAt: plan.start)
        var node = Manifest.Node(name: "a", identifier: plan.nodes[0].identifier, shortName: plan.nodes[0].shortName, osVersion: "6.1", position: plan.nodes[0].position, radio: "sim")
        node.files["contacts.csv"] = .init(bytes: 10, sha256: "00")
        let m = Manifest(runId: "r1", createdAt: plan.start, mode: .simulate, seed: 3, plan: plan, planText: "x", contactEvent: ce, nodes: [node])
        let json = String(decoding: try m.encoded(), as: UTF8.self)
        XCTAssertTrue(json.contains("\"start\" : \"2026-01-01T00:00:10.000Z\""), json)
        XCTAssertTrue(json.contains("\"format\" : \"heraldlab-bundle/1\""))
        let back = try Manifest.decoder.decode(Manifest.self, from: Data(json.utf8))
        XCTAssertEqual(back, m)
    }
}
