import XCTest
@testable import LabPlan

/// Clock offsets from probes over a jittery link (the netlab tier's 20 ms ± 5 ms each way).
final class ClockSampleTests: XCTestCase {
    /// A small seeded generator (xorshift), so the test is the same every run.
    struct XorShift: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state }
    }

    func samples(offset: Double, count: Int, seed: UInt64) -> [LabWire.ClockSample] {
        var g = XorShift(state: seed)
        var t = 1_000_000.0
        return (0..<count).map { _ in
            let forward = Double.random(in: 0.015...0.025, using: &g), backward = Double.random(in: 0.015...0.025, using: &g)
            let t0 = t, t1 = t0 + forward + offset, t2 = t1 + 0.0001, t3 = t2 - offset + backward
            t = t3 + 0.001
            return LabWire.ClockSample(t0: t0, t1: t1, t2: t2, t3: t3)
        }
    }

    func testLeastDelaysEachWayGiveTheOffsetWithinAMillisecond() throws {
        var worstCombined = 0.0, worstBest = 0.0
        for seed in 1...200 as ClosedRange<UInt64> {
            let s = samples(offset: 0.0042, count: 32, seed: seed &* 0x9E37_79B9_7F4A_7C15)
            let combined = try XCTUnwrap(LabWire.ClockSample.combined(s)), best = try XCTUnwrap(LabWire.ClockSample.best(s))
            worstCombined = max(worstCombined, abs(combined.offset - 0.0042))
            worstBest = max(worstBest, abs(best.offset - 0.0042))
            XCTAssertGreaterThanOrEqual(combined.roundTrip, 0.030)
            XCTAssertLessThanOrEqual(combined.roundTrip, best.roundTrip + 1e-12)
        }
        XCTAssertLessThan(worstCombined, 0.001, "least delay each way: worst error \(worstCombined * 1000) ms over 200 seeds")
        XCTAssertGreaterThan(worstBest, worstCombined, "the best single sample does worse (\(worstBest * 1000) ms)")
    }

    func testUnusableSamplesAreIgnored() {
        XCTAssertNil(LabWire.ClockSample.combined([]))
        XCTAssertNil(LabWire.ClockSample.combined([LabWire.ClockSample(offset: .nan, roundTrip: 0.001)]))
        let ok = LabWire.ClockSample(offset: 0.002, roundTrip: 0.0004)
        XCTAssertEqual(LabWire.ClockSample.combined([ok, LabWire.ClockSample(offset: 1, roundTrip: -1)])?.offset ?? 0, 0.002, accuracy: 1e-12)
    }

    func testAgreeingSamplesGiveTheirCommonBoundsAndContradictingOnesNothing() throws {
        // [0.9, 1.1], [0.95, 1.35] and [0.7, 1.05] overlap in [0.95, 1.05].
        let s = [LabWire.ClockSample(offset: 1.0, roundTrip: 0.2), LabWire.ClockSample(offset: 1.15, roundTrip: 0.4), LabWire.ClockSample(offset: 0.875, roundTrip: 0.35)]
        let a = try XCTUnwrap(LabWire.ClockSample.agreeing(s))
        XCTAssertEqual(a.offset, 1.0, accuracy: 1e-12)
        XCTAssertEqual(a.roundTrip, 0.1, accuracy: 1e-12)
        let c = try XCTUnwrap(LabWire.ClockSample.combined(s))
        XCTAssertEqual(c.offset, a.offset, accuracy: 1e-12, "the same estimate as combined when they agree")
        XCTAssertEqual(c.roundTrip, a.roundTrip, accuracy: 1e-12)
        // A clock that stepped: [0.9, 1.1] and [1.9, 2.1] do not overlap. combined calls that a
        // perfect sample; agreeing calls it nothing.
        let stepped = [LabWire.ClockSample(offset: 1, roundTrip: 0.2), LabWire.ClockSample(offset: 2, roundTrip: 0.2)]
        XCTAssertEqual(LabWire.ClockSample.combined(stepped)?.roundTrip, 0)
        XCTAssertNil(LabWire.ClockSample.agreeing(stepped))
        XCTAssertNil(LabWire.ClockSample.agreeing([]))
        XCTAssertNil(LabWire.ClockSample.agreeing([s[0], LabWire.ClockSample(offset: .nan, roundTrip: 0.1)]), "an unusable sample is not skipped quietly")
        XCTAssertNil(LabWire.ClockSample.agreeing([s[0], LabWire.ClockSample(offset: 1, roundTrip: -0.1)]))
    }
}
