import XCTest
@testable import LabPlan

/// Every numeric field of a plan has a sane upper bound, and bad documents (alias bombs, deep
/// nesting, huge or non-UTF-8 files, FIFOs) are refused with a field path, never a crash.
final class PlanLimitsTests: XCTestCase {
    func problems(_ yaml: String) -> [String] { planProblems(yaml) }
    let nodes = "nodes: [a, b]\n"

    func testHugeDurationsAreFieldErrors() {
        for d in ["1e308h", "9223372036854775807h", "10000000000000000000s", "8d", "169h", "inf s", "nan s"] {
            let p = problems("name: x\nduration: \(d)\n" + nodes)
            XCTAssertEqual(p.count, 1, "\(d): \(p)")
            XCTAssertTrue(p.first?.hasPrefix("duration: ") ?? false, "\(d): \(p)")
        }
        XCTAssertEqual(problems("name: x\nduration: 168h\n" + nodes), [])
        XCTAssertTrue(problems("name: x\nduration: 1e308h\n" + nodes)[0].contains("at most 7 days"))
    }

    func testEveryDurationFieldIsBounded() {
        let cases = [("sensor: {scan: {on: 2h}}", "sensor.scan.on"), ("sensor: {scan: {on: 1ms}}", "sensor.scan.on"),
                     ("sensor: {scan: {off: 1e300s}}", "sensor.scan.off"), ("sensor: {purgeAfter: 1e20h}", "sensor.purgeAfter"),
                     ("sensor: {connectionTimeout: 1h}", "sensor.connectionTimeout"), ("radio: {connectLatency: 2m}", "radio.connectLatency"),
                     ("radio: {macRotation: 1e10s}", "radio.macRotation"), ("thresholds: {timeToFirstRead: 1e300h}", "thresholds.timeToFirstRead"),
                     ("warmup: 1e300h", "warmup")]
        for (yaml, path) in cases {
            let p = problems("name: x\nduration: 1h\n" + nodes + yaml + "\n")
            XCTAssertTrue(p.contains { $0.hasPrefix(path + ": ") }, "\(yaml): \(p)")
        }
    }

    func testNonFiniteOrFarPositionsAreFieldErrors() {
        let p = problems("name: x\nduration: 1m\nnodes:\n  - {name: a, position: [nan, 0]}\n  - {name: b, position: [1e400, -inf]}\n  - {name: c, position: [20km, 10001]}\n")
        XCTAssertTrue(p.contains("nodes[0].position[0]: \"nan\" is not a finite distance"), "\(p)")
        XCTAssertTrue(p.contains { $0.hasPrefix("nodes[1].position[0]: ") }, "\(p)")
        XCTAssertTrue(p.contains { $0.hasPrefix("nodes[1].position[1]: ") }, "\(p)")
        XCTAssertTrue(p.contains { $0.hasPrefix("nodes[2].position[0]: ") }, "\(p)")
        XCTAssertTrue(p.contains("nodes[2].position[1]: 10001 m is out of range; at most 10000 m from the origin"), "\(p)")
        let grid = problems("name: x\nduration: 1m\nnodes: {count: 10, grid: {spacing: 1e308m}}\n")
        XCTAssertTrue(grid.contains { $0.hasPrefix("nodes.grid.spacing: ") }, "\(grid)")
        let wide = problems("name: x\nduration: 1m\nnodes: {count: 1000, grid: {columns: 1000, spacing: 100m}}\n")
        XCTAssertTrue(wide.contains { $0.hasPrefix("nodes.grid: spans") }, "\(wide)")
    }

    func testOtherNumbersAndTextsAreBounded() {
        XCTAssertTrue(problems("name: x\nduration: 1m\n" + nodes + "seed: 99999999999999999999999\n").contains { $0.hasPrefix("seed: ") })
        XCTAssertTrue(problems("name: x\nduration: 1m\n" + nodes + "start: 0001-01-01T00:00:00Z\n").contains { $0.hasPrefix("start: ") })
        XCTAssertTrue(problems("name: x\nduration: 1m\n" + nodes + "description: \(String(repeating: "x", count: 70_000))\n").contains { $0.hasPrefix("description: ") })
        XCTAssertTrue(problems("name: x\nduration: 1m\n" + nodes + "radio: {referencePower: nan}\n").contains { $0.hasPrefix("radio.referencePower: ") })
        XCTAssertTrue(problems("name: x\nduration: 1m\nnodes: {count: 1e308}\n").contains { $0.hasPrefix("nodes.count: ") })
    }

    func testAliasBombIsRefusedBeforeItIsWalked() {
        var yaml = "name: x\nduration: 1m\n" + nodes + "description: &a0 [l, l, l, l, l, l, l, l, l, l]\n"
        for i in 1..<12 { yaml += "x\(i): &a\(i) [" + Array(repeating: "*a\(i - 1)", count: 10).joined(separator: ", ") + "]\n" }
        yaml += "agents: {names: *a11}\n"
        let started = Date()
        let p = problems(yaml)
        XCTAssertEqual(p.count, 1)
        XCTAssertTrue(p[0].contains("aliases are expanded"), "\(p)")
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
    }

    func testDeepNestingIsAnErrorNotACrash() {
        for deep in [String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000),
                     String(repeating: "- ", count: 10_000) + "x",
                     String(repeating: "{a: ", count: 10_000) + "1" + String(repeating: "}", count: 10_000)] {
            let p = problems("name: x\nduration: 1m\nnodes: \(deep)\n")
            XCTAssertEqual(p.count, 1)
            XCTAssertLessThan(p[0].count, 2000, "the message stays short")
        }
    }

    func testFilesThatAreNotPlansAreRefused() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("planlimits-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        func loadProblem(_ path: String) -> String {
            do { _ = try Plan.load(path: path); return "" } catch { return error.problems.map(\.message).joined(separator: "; ") }
        }
        let fifo = dir.appendingPathComponent("fifo.yaml").path
        XCTAssertEqual(mkfifo(fifo, 0o600), 0)
        XCTAssertTrue(loadProblem(fifo).contains("not a regular file"))
        XCTAssertTrue(loadProblem("/dev/zero").contains("not a regular file"))
        XCTAssertTrue(loadProblem(dir.path).contains("not a regular file"))
        let bad = dir.appendingPathComponent("bad.yaml")
        try Data("name: x\nduration: 1m\nnodes: [a, b]\ndescription: \u{FF}".utf8 + [0xFF, 0xFE]).write(to: bad)
        XCTAssertTrue(loadProblem(bad.path).contains("not UTF-8"))
        let big = dir.appendingPathComponent("big.yaml")
        try Data(repeating: 0x20, count: PlanLimits.maximumFileBytes + 1).write(to: big)
        XCTAssertTrue(loadProblem(big.path).contains("at most"))
    }

    func testDecodedPlansAreRangeChecked() {
        var plan = Plan(name: "x", duration: 60, nodes: [NodeSpec(name: "a", position: Position(x: .nan, y: 0)), NodeSpec(name: "b", position: Position(x: 1, y: 0))])
        XCTAssertEqual(plan.rangeProblems.first?.hasPrefix("nodes[0].position[0]"), true)
        plan.nodes[0].position = Position(x: 0, y: 0)
        XCTAssertEqual(plan.rangeProblems, [])
        plan.duration = 1e19
        XCTAssertEqual(plan.rangeProblems.first?.hasPrefix("duration"), true)
        XCTAssertEqual(Plan.parseDuration("30s"), 30)
        XCTAssertNil(Plan.parseDuration("1e308h"))
        XCTAssertNil(Plan.parseDuration("nan s"))
    }

    /// `plan check` and `simulate` treat every duration alike (issue 19, item 7): one parser
    /// reads durations (a decimal number that starts with a digit: no sign, no leading '.', no
    /// hexadecimal), and a plan it accepts passes the range check simulate makes.
    func testPlanCheckAndSimulateAgreeOnDurations() {
        let nodes = "nodes: [a, b]\n"
        for text in ["+.5ms", ".5s", "+5s", "0x10s", "inf s", "-.5ms", "0.5ms", "0.9ms", "1e-4s", " +1m"] {
            let yaml = "name: x\nduration: \"\(text)\"\n" + nodes
            XCTAssertThrowsError(try Plan.parse(yaml: yaml), text) { e in
                XCTAssertTrue("\(e)".contains("duration: "), "\(text): \(e)")
            }
        }
        XCTAssertNil(Plan.parseDuration("+.5ms"))
        XCTAssertNil(Plan.parseDuration(".5s"))
        for (text, seconds) in [("1ms", 0.001), ("0.5s", 0.5), ("5.25s", 5.25), ("1e3ms", 1.0), ("2m", 120.0), ("1.5h", 5400.0)] {
            let plan = try? Plan.parse(yaml: "name: x\nduration: \"\(text)\"\n" + nodes)
            XCTAssertEqual(plan?.duration, seconds, text)
            XCTAssertEqual(plan?.rangeProblems, [], text)
        }
    }
}
