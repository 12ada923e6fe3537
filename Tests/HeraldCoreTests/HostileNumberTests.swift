import Foundation
import XCTest
@testable import HeraldCore

/// Issue 36: no Double-to-integer conversion can trap. HeraldCore's conversions of outside
/// numbers fed 1e300, -1e300, NaN, ±infinity and a negative value: each returns, with its answer.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5.5]

    func testSaturatingAtEveryEdge() {
        XCTAssertEqual(Saturating.int(-.infinity), .min)
        XCTAssertEqual(Saturating.int(.infinity), .max)
        XCTAssertEqual(Saturating.int(.nan), 0)
        XCTAssertEqual(Saturating.int(-5.5), -5, "toward zero, as Int(x)")
        XCTAssertEqual(Saturating.uint64(.infinity), .max)
        XCTAssertEqual(Saturating.uint64(-.infinity), 0)
        XCTAssertEqual(Saturating.nanoseconds(.infinity), .max)
        XCTAssertEqual(Saturating.nanoseconds(-.infinity), 0)
        XCTAssertEqual(Saturating.nanoseconds(-5.5), 0)
        XCTAssertEqual(Saturating.milliseconds(.nan), 0)
        XCTAssertEqual(Saturating.milliseconds(.infinity), .max)
        XCTAssertEqual(Saturating.milliseconds(-5.5), 0)
        // Ordinary values are what the trapping conversions gave.
        for x in [0.0, 1.5, -1.5, 86_400.25, 1e15, -1e15, 1_767_225_600.999] {
            XCTAssertEqual(Saturating.int64(x), Int64(x))
            XCTAssertEqual(Saturating.int(x), Int(x))
            XCTAssertEqual(Saturating.nanoseconds(abs(x) / 1e6), Int64(abs(x) / 1e6 * 1e9))
        }
    }

    /// Dates from outside are written as the nearest the form holds (years 0000 to 9999), 1970 for NaN.
    func testTimestampsOfHostileDates() {
        let expected = [
            "9999-12-31 23:59:59.999+0000", "0000-01-01 00:00:00.000+0000", "1970-01-01 00:00:00.000+0000",
            "9999-12-31 23:59:59.999+0000", "0000-01-01 00:00:00.000+0000", "1969-12-31 23:59:54.500+0000",
        ]
        for (t, want) in zip(Self.hostile, expected) {
            let date = Date(timeIntervalSince1970: t)
            XCTAssertEqual(HeraldTimestamp.utcMillis(date), want, "\(t)")
            XCTAssertEqual(HeraldTimestamp.utcSeconds(date), String(want.prefix(19)), "\(t)")
            XCTAssertEqual(HeraldTimestamp.iso8601(date), String(want.prefix(23)).replacingOccurrences(of: " ", with: "T") + "Z", "\(t)")
        }
        XCTAssertEqual(HeraldTimestamp.utcMillis(Date(timeIntervalSince1970: 1_767_225_600.25)), "2026-01-01 00:00:00.250+0000")
    }

    /// A ticket's times are whole seconds held to ±1e15; a time that is not a number is 0.
    func testTicketSecondsOfHostileTimes() {
        let expected: [Int64] = [1_000_000_000_000_000, -1_000_000_000_000_000, 0, 0, 0, -5]
        for (t, want) in zip(Self.hostile, expected) { XCTAssertEqual(NodeTicket.seconds(t), want, "\(t)") }
        XCTAssertEqual(NodeTicket.seconds(1_767_225_600.7), 1_767_225_600)
    }
}
