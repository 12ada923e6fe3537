import Foundation
import XCTest
@testable import HeraldLogs

/// Issue 36: the log rows' timestamp writer fed dates from a clock that says anything (1e300,
/// -1e300, NaN, ±infinity, before 1970): each row gets the nearest time the form holds, no trap.
final class HostileNumberTests: XCTestCase {
    func text(_ seconds: [Double]) -> [String] {
        var writer = TimestampWriter()
        return seconds.map { t in
            var out = [UInt8]()
            writer.append(Date(timeIntervalSince1970: t), to: &out)
            return String(decoding: out, as: UTF8.self)
        }
    }

    func testTimestampsOfHostileDates() {
        XCTAssertEqual(text([1e300, -1e300, .nan, .infinity, -.infinity, -5.5]), [
            "9999-12-31 23:59:59.999+0000", "0000-01-01 00:00:00.000+0000", "1970-01-01 00:00:00.000+0000",
            "9999-12-31 23:59:59.999+0000", "0000-01-01 00:00:00.000+0000", "1969-12-31 23:59:54.500+0000",
        ])
    }

    /// The cached second is reused and replaced across hostile and ordinary dates alike.
    func testOrdinaryDatesAroundHostileOnes() {
        XCTAssertEqual(text([1_607_468_105.25, 1_607_468_105.75, .nan, 1_607_468_106.0625, -1e300, 1_607_468_106.5]), [
            "2020-12-08 22:55:05.250+0000", "2020-12-08 22:55:05.750+0000", "1970-01-01 00:00:00.000+0000",
            "2020-12-08 22:55:06.062+0000", "0000-01-01 00:00:00.000+0000", "2020-12-08 22:55:06.500+0000",
        ])
    }
}
