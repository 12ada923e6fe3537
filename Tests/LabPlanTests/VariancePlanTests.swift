import XCTest
import HeraldCore
@testable import LabPlan

/// `radio.devices` and `radio.environment`: on, off, or fields, each range-checked with its path.
final class VariancePlanTests: XCTestCase {
    let head = "name: x\nduration: 1m\nnodes: [a, b]\nradio:\n"

    func parse(_ radio: String) throws(PlanError) -> Plan { try Plan.parse(yaml: head + radio + "\n", source: "t.yaml") }

    func problems(_ radio: String) -> [String] {
        do { _ = try parse(radio); return [] } catch { return error.problems.map { "\($0.path): \($0.message)" } }
    }

    func testOnOffAndFields() throws {
        let plain = try Plan.parse(yaml: "name: x\nduration: 1m\nnodes: [a, b]\n", source: "t")
        XCTAssertNil(plain.radio.devices, "off unless a plan asks: earlier plans give byte-identical runs")
        XCTAssertNil(plain.radio.environment)
        XCTAssertEqual(try parse("  devices: on").radio.devices, DeviceVariation())
        XCTAssertNil(try parse("  devices: off").radio.devices)
        XCTAssertEqual(try parse("  environment: on").radio.environment, RunEnvironment())
        let d = try XCTUnwrap(try parse("  devices: {txSpread: 2dB, rxSpread: 1.5, clockDrift: 40ppm, population: 7}").radio.devices)
        XCTAssertEqual(d.txSpread, 2)
        XCTAssertEqual(d.rxSpread, 1.5)
        XCTAssertEqual(d.clockDrift, 40)
        XCTAssertEqual(d.population, 7)
        XCTAssertEqual(d.orientationLoss, DeviceVariation().orientationLoss, "unset fields keep their defaults")
        let e = try XCTUnwrap(try parse("  environment: {fieldTime: 5m, burstLength: 500ms, burstRate: 12, burstLoss: 0.3}").radio.environment)
        XCTAssertEqual(e.fieldTime, 300)
        XCTAssertEqual(e.burstLength, 0.5)
        XCTAssertEqual(e.burstRate, 12)
        XCTAssertEqual(e.burstLoss, 0.3)
        XCTAssertEqual(try parse("  devices: on\n  environment: on").rangeProblems, [])
    }

    func testBadValuesNameTheFieldAndTheLimit() {
        XCTAssertEqual(problems("  devices: {txSpread: 40dB}"), ["radio.devices.txSpread: 40dB is more than 20dB"])
        XCTAssertEqual(problems("  devices: {rxSpread: -1dB}"), ["radio.devices.rxSpread: -1dB is less than 0dB"])
        XCTAssertEqual(problems("  devices: {clockDrift: 900ppm}"), ["radio.devices.clockDrift: 900ppm is more than 500ppm"])
        XCTAssertEqual(problems("  devices: {txSpread: loud}"), ["radio.devices.txSpread: expected a number of dB, got \"loud\""])
        XCTAssertEqual(problems("  devices: {txSpread: .nan}"), ["radio.devices.txSpread: expected a number of dB, got \".nan\""])
        XCTAssertEqual(problems("  environment: {burstLoss: 2}"), ["radio.environment.burstLoss: 2 is more than 1"])
        XCTAssertEqual(problems("  environment: {fieldTime: 1s}"), ["radio.environment.fieldTime: \"1s\" is too short; at least 10s"])
        XCTAssertEqual(problems("  environment: {burstRate: 1e9}"), ["radio.environment.burstRate: 1e9 is more than 3600 per hour"])
        XCTAssertEqual(problems("  devices: maybe"), ["radio.devices: expected true or false, got \"maybe\""])
        let unknown = problems("  devices: {txSpred: 1}")
        XCTAssertEqual(unknown.count, 1)
        XCTAssertTrue(unknown[0].hasPrefix("radio.devices.txSpred: unknown field (did you mean txSpread?"), unknown[0])
    }

    func testRangeProblemsForPlansBuiltInCode() {
        var plan = Plan(name: "x", duration: 60, nodes: [])
        var d = DeviceVariation()
        d.txSpread = .infinity
        plan.radio.devices = d
        XCTAssertEqual(plan.rangeProblems, ["radio.devices.txSpread: infdB is out of range (0.0 to 20.0dB)"])
    }
}
