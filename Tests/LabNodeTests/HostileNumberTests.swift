import Foundation
import XCTest
import HeraldCore
import HeraldRadio
@testable import LabNode

/// Issue 36: the node's status counters on a clock that says anything (1e300, -1e300, NaN,
/// ±infinity, before 1970): the second saturates and is held to ±2^62, the ring of the last
/// minute takes seconds before 1970, and the counts stay right.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5.5]

    func testSecondsOfHostileTimes() {
        XCTAssertEqual(Self.hostile.map { NodeCounters.second(of: Date(timeIntervalSince1970: $0)) }, [1 << 62, -(1 << 62), 0, 1 << 62, -(1 << 62), -6])
        XCTAssertEqual(NodeCounters.second(of: Date(timeIntervalSince1970: 1_767_225_600.9)), 1_767_225_600)
    }

    func testCountersOnAHostileClock() {
        let peer = FixedPayloadSupplier(identifier: 1_784_521_062).payloadData
        for t in Self.hostile {
            let scheduler = VirtualScheduler(start: Date(timeIntervalSince1970: t))
            let counters = NodeCounters(scheduler: scheduler, ownShortName: "own")
            counters.sensor(.BLE, didRead: peer, fromTarget: "A")
            for _ in 0..<3 { counters.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "A") }
            XCTAssertEqual(counters.rssiLastMinute, 3, "\(t)")
            XCTAssertEqual(counters.rssiTotal, 3)
            XCTAssertEqual(counters.recentPeers, [peer.shortName], "\(t)")
        }
    }

    /// Before 1970 the ring's buckets are found as after it: a minute later, the old counts are gone.
    func testTheLastMinuteBefore1970() {
        let scheduler = VirtualScheduler(start: Date(timeIntervalSince1970: -125))
        let counters = NodeCounters(scheduler: scheduler, ownShortName: "own")
        for _ in 0..<60 {
            counters.sensor(.BLE, didMeasure: .rssi(-50), fromTarget: "A")
            scheduler.advance(by: 1)
        }
        XCTAssertEqual(counters.rssiLastMinute, 59, "one a second for the last 59 seconds (the clock is one past the last)")
        scheduler.advance(by: 61)
        XCTAssertEqual(counters.rssiLastMinute, 0)
        XCTAssertEqual(counters.rssiTotal, 60)
    }
}
