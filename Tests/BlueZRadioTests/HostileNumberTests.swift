import Foundation
import XCTest
@testable import BlueZRadio
@testable import DBus

/// Issue 36: BlueZ's timeouts (configuration, or bluetoothd's measured latency) and advertising
/// intervals (a plan's) fed 1e300, -1e300, NaN, ±infinity and a negative value: saturated into the
/// call's Duration and the interval's UInt32, never a trap.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5]

    func testCallTimeouts() {
        XCTAssertEqual(Self.hostile.map(BlueZ.callTimeout), [.milliseconds(Int64.max), .milliseconds(Int64.min), .zero, .milliseconds(Int64.max),
                                                              .milliseconds(Int64.min), .milliseconds(-5000)])
        XCTAssertEqual(BlueZ.callTimeout(20), .seconds(20))
        XCTAssertEqual(BlueZ.callTimeout(0.0125), .milliseconds(12), "whole milliseconds, toward zero, as before")
        // What the D-Bus call's timer makes of them: a year at most, 1 ms at least.
        XCTAssertEqual(Self.hostile.map { DBusConnection.milliseconds(BlueZ.callTimeout($0)) }, [31_536_000_000, 1, 1, 31_536_000_000, 1, 1])
    }

    func testAdvertisingIntervals() {
        XCTAssertEqual(Self.hostile.map(BlueZ.intervalMilliseconds), [.max, 0, 0, .max, 0, 0])
        XCTAssertEqual(BlueZ.intervalMilliseconds(0.1), 100)
        XCTAssertEqual(BlueZ.intervalMilliseconds(0.0625), 63, "rounded, as before")
    }
}
