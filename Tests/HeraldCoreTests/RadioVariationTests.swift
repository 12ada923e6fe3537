import XCTest
import HeraldCore

/// `radio.devices`: a device's character depends on its identity and the population, never on
/// a run's seed; spreads of 0 give the identical devices of earlier versions.
final class RadioVariationTests: XCTestCase {
    func testACharacterBelongsToItsIdentity() {
        let v = DeviceVariation()
        XCTAssertEqual(v.character(of: "dongle-7"), v.character(of: "dongle-7"), "the same dongle in every run and seed")
        XCTAssertNotEqual(v.character(of: "dongle-7"), v.character(of: "dongle-8"))
        var other = v
        other.population = 2
        XCTAssertNotEqual(v.character(of: "dongle-7").txOffset, other.character(of: "dongle-7").txOffset, "another population, another device")
    }

    func testSpreadsShapeTheDraws() {
        var v = DeviceVariation()
        let n = 2000
        let tx = (0..<n).map { v.character(of: "d\($0)").txOffset }
        let mean = tx.reduce(0, +) / Double(n)
        let sd = (tx.map { ($0 - mean) * ($0 - mean) }.reduce(0, +) / Double(n - 1)).squareRoot()
        XCTAssertEqual(mean, 0, accuracy: 0.25)
        XCTAssertEqual(sd, v.txSpread, accuracy: 0.25, "standard deviation of the TX offsets")
        XCTAssertTrue(tx.allSatisfy { abs($0) <= 3 * v.txSpread + 1e-9 }, "cut at 3 standard deviations")
        let orient = (0..<n).map { v.character(of: "d\($0)").orientationLoss }
        XCTAssertTrue(orient.allSatisfy { $0 >= 0 && $0 <= v.orientationLoss })
        XCTAssertTrue((0..<n).allSatisfy { let c = v.character(of: "d\($0)").connectFactor; return c > 0.5 && c <= 1 })
        // Changing one spread leaves the others' draws alone.
        let before = v.character(of: "d1")
        v.txSpread = 0
        let after = v.character(of: "d1")
        XCTAssertEqual(after.txOffset, 0)
        XCTAssertEqual(after.rxOffset, before.rxOffset)
        XCTAssertEqual(after.clockDriftPPM, before.clockDriftPPM)
    }

    func testZeroSpreadsAreTheNeutralDevice() {
        var v = DeviceVariation()
        for f in DeviceVariation.limits { v.set(f.field, 0) }
        let c = v.character(of: "x")
        XCTAssertEqual(c, DeviceCharacter(identity: "x"))
        XCTAssertEqual(c.intervalFactor, 1)
    }

    func testProblemsNameTheField() {
        var v = DeviceVariation()
        v.txSpread = 40
        v.clockDrift = .nan
        XCTAssertEqual(v.problems(at: "radio.devices"), ["radio.devices.txSpread: 40.0dB is out of range (0.0 to 20.0dB)",
                                                         "radio.devices.clockDrift: nanppm is out of range (0.0 to 500.0ppm)"])
        var e = RunEnvironment()
        e.burstLoss = -1
        XCTAssertEqual(e.problems(at: "radio.environment"), ["radio.environment.burstLoss: -1.0 is out of range (0.0 to 1.0)"])
        XCTAssertEqual(RunEnvironment().problems(at: "r"), [])
        XCTAssertEqual(DeviceVariation().problems(at: "r"), [])
    }
}
