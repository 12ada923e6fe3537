import XCTest
import HeraldCore

/// Double to integer conversions fed what outside numbers can be: huge, negative, NaN, infinite.
final class SaturatingTests: XCTestCase {
    func testHugeNegativeNaNAndInfiniteValuesNeverTrap() {
        XCTAssertEqual(Saturating.int64(1e300), .max)
        XCTAssertEqual(Saturating.int64(-1e300), .min)
        XCTAssertEqual(Saturating.int64(.infinity), .max)
        XCTAssertEqual(Saturating.int64(-.infinity), .min)
        XCTAssertEqual(Saturating.int64(.nan), 0)
        XCTAssertEqual(Saturating.int64(9.3e18), .max)
        XCTAssertEqual(Saturating.int64(-5.7), -5)
        XCTAssertEqual(Saturating.int64(1.9), 1)
        XCTAssertEqual(Saturating.int64(9_000_000_000_000_000_000.0), 9_000_000_000_000_000_000)
        XCTAssertEqual(Saturating.int(1e300), Int(Int64.max))
        XCTAssertEqual(Saturating.uint64(1e300), .max)
        XCTAssertEqual(Saturating.uint64(-1e300), 0)
        XCTAssertEqual(Saturating.uint64(.nan), 0)
        XCTAssertEqual(Saturating.uint64(-3), 0)
        XCTAssertEqual(Saturating.uint64(1.5e19), 15_000_000_000_000_000_000)
    }

    func testDurationsAreNeverNegative() {
        XCTAssertEqual(Saturating.nanoseconds(1.5), 1_500_000_000)
        XCTAssertEqual(Saturating.nanoseconds(5e11), .max, "the start delay an agent's clock once made")
        XCTAssertEqual(Saturating.nanoseconds(-2), 0)
        XCTAssertEqual(Saturating.nanoseconds(.nan), 0)
        XCTAssertEqual(Saturating.milliseconds(1e300), .max)
        XCTAssertEqual(Saturating.milliseconds(-1e300), 0)
        XCTAssertEqual(Saturating.milliseconds(0.25), 250)
    }

    func testTimestampsOfAbsurdDatesAreTextNotATrap() {
        for t in [1e300, -1e300, Double.nan, 5e11] {
            let date = Date(timeIntervalSince1970: t)
            XCTAssertFalse(HeraldTimestamp.iso8601(date).isEmpty)
            XCTAssertFalse(HeraldTimestamp.utcMillis(date).isEmpty)
            XCTAssertFalse(HeraldTimestamp.utcSeconds(date).isEmpty)
        }
    }
}
