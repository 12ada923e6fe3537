import XCTest
@testable import LabPlan

/// `radio.crowding`: on, off, or parts, each with field-path errors and range limits.
final class CrowdingPlanTests: XCTestCase {
    let head = "name: x\nduration: 1m\nnodes: [a, b]\n"

    func parse(_ radio: String) throws(PlanError) -> Plan { try Plan.parse(yaml: head + "radio:\n  crowding: " + radio + "\n", source: "t.yaml") }

    func problems(_ radio: String) -> [String] {
        do { _ = try parse(radio); return [] } catch { return error.problems.map { "\($0.path): \($0.message)" } }
    }

    func testOnOffAndParts() throws {
        XCTAssertNil(try Plan.parse(yaml: head, source: "t").radio.crowding, "off unless a plan asks")
        XCTAssertNil(try parse("off").radio.crowding)
        XCTAssertEqual(try parse("on").radio.crowding, CrowdingSettings())
        let c = try XCTUnwrap(try parse("{collisions: on, capture: off, scanWindow: 30ms, scanInterval: 60ms, reportRate: 100, maxConnections: 4, discoveryTime: 2s, connectLoad: 0.05}").radio.crowding)
        XCTAssertTrue(c.collisions)
        XCTAssertNil(c.capture)
        XCTAssertEqual(c.scanWindow!, 0.03, accuracy: 1e-12)
        XCTAssertEqual(c.scanInterval, 0.06, accuracy: 1e-12)
        XCTAssertEqual(c.reportRate, 100)
        XCTAssertEqual(c.maxConnections, 4)
        XCTAssertEqual(c.discoveryTime, 2)
        XCTAssertEqual(c.connectLoad, 0.05)
        let off = try XCTUnwrap(try parse("{collisions: off, scanWindow: off, reportRate: off, maxConnections: off, connectLoad: off}").radio.crowding)
        XCTAssertFalse(off.collisions)
        XCTAssertNil(off.scanWindow)
        XCTAssertNil(off.reportRate)
        XCTAssertNil(off.maxConnections)
        XCTAssertEqual(off.connectLoad, 0)
        XCTAssertEqual(try parse("{scanInterval: 40ms}").radio.crowding?.scanWindow, 0.04, "an interval alone: listening all the time")
        XCTAssertEqual(try parse("on").rangeProblems, [])
    }

    func testBadValuesAreFieldErrors() {
        let cases: [(String, String)] = [
            ("maybe", "radio.crowding: "),
            ("{reportRate: -1}", "radio.crowding.reportRate: "),
            ("{reportRate: 1e9}", "radio.crowding.reportRate: "),
            ("{reportRate: nan}", "radio.crowding.reportRate: "),
            ("{maxConnections: 0}", "radio.crowding.maxConnections: "),
            ("{maxConnections: 2.5}", "radio.crowding.maxConnections: "),
            ("{maxConnections: 65}", "radio.crowding.maxConnections: "),
            ("{scanWindow: 5}", "radio.crowding.scanWindow: "),
            ("{scanWindow: 1ms}", "radio.crowding.scanWindow: "),
            ("{scanInterval: 11s}", "radio.crowding.scanInterval: "),
            ("{scanWindow: 20ms, scanInterval: 10ms}", "radio.crowding.scanWindow: "),
            ("{capture: 50}", "radio.crowding.capture: "),
            ("{capture: loud}", "radio.crowding.capture: "),
            ("{connectLoad: 1.5}", "radio.crowding.connectLoad: "),
            ("{discoveryTime: 2m}", "radio.crowding.discoveryTime: "),
            ("{collisions: sometimes}", "radio.crowding.collisions: "),
            ("{loud: on}", "radio.crowding.loud: "),
            ("[on]", "radio.crowding: "),
        ]
        for (yaml, path) in cases {
            let p = problems(yaml)
            XCTAssertTrue(p.contains { $0.hasPrefix(path) }, "\(yaml): \(p)")
        }
        XCTAssertTrue(problems("{scanWindow: 5}")[0].contains("no unit"))
    }

    func testDecodedPlansAreRangeChecked() throws {
        var plan = try parse("on")
        plan.radio.crowding?.reportRate = 0
        plan.radio.crowding?.scanWindow = 1
        plan.radio.crowding?.maxConnections = 1000
        let p = plan.rangeProblems
        XCTAssertTrue(p.contains { $0.hasPrefix("radio.crowding.reportRate:") }, "\(p)")
        XCTAssertTrue(p.contains { $0.hasPrefix("radio.crowding.scanWindow:") }, "\(p)")
        XCTAssertTrue(p.contains { $0.hasPrefix("radio.crowding.maxConnections:") }, "\(p)")
    }

    func testJSONRoundTripAndOldManifestsDecode() throws {
        let plan = try parse("{reportRate: off, capture: 6}")
        let back = try JSONDecoder().decode(Plan.self, from: JSONEncoder().encode(plan))
        XCTAssertEqual(back, plan)
        let old = try Plan.parse(yaml: head, source: "t")
        let json = String(decoding: try JSONEncoder().encode(old), as: UTF8.self)
        XCTAssertFalse(json.contains("crowding"), "an idealised plan encodes as before")
    }
}
