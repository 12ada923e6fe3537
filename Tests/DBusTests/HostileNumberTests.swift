import Foundation
import XCTest
@testable import DBus

/// Issue 36: a call's timeout as the timer's milliseconds, for any Duration a caller can make
/// (BlueZ saturates its seconds into one): at least 1 ms, at most a year, never an overflow.
final class HostileNumberTests: XCTestCase {
    let year = 86_400 * 365 * 1000

    func testTimeoutsOfEveryMagnitude() {
        XCTAssertEqual(DBusConnection.milliseconds(.milliseconds(Int64.max)), year, "what BlueZ makes of 1e300 s and of infinity")
        XCTAssertEqual(DBusConnection.milliseconds(.milliseconds(Int64.min)), 1, "of -1e300 s and of -infinity")
        XCTAssertEqual(DBusConnection.milliseconds(.zero), 1, "of NaN")
        XCTAssertEqual(DBusConnection.milliseconds(.milliseconds(-5000)), 1, "of -5 s")
        XCTAssertEqual(DBusConnection.milliseconds(.seconds(Int64.max)), year)
        XCTAssertEqual(DBusConnection.milliseconds(.seconds(Int64.min)), 1, "seconds that would overflow when multiplied")
        XCTAssertEqual(DBusConnection.milliseconds(.seconds(-0.5)), 1)
        // Ordinary timeouts as before.
        XCTAssertEqual(DBusConnection.milliseconds(.seconds(25)), 25_000)
        XCTAssertEqual(DBusConnection.milliseconds(.milliseconds(2500)), 2500)
        XCTAssertEqual(DBusConnection.milliseconds(.microseconds(1500)), 1)
        XCTAssertEqual(DBusConnection.milliseconds(.seconds(86_400 * 400)), year)
    }
}
