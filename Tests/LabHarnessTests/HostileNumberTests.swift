import Foundation
import XCTest
@testable import LabAgent

/// Issue 36: no Double-to-integer conversion of the agent can trap. Its heartbeat backoff (from
/// configuration) and its wait for a run's start (from a coordinator) fed 1e300, -1e300, NaN,
/// ±infinity and a negative value.
final class HostileNumberTests: XCTestCase {
    static let hostile: [Double] = [1e300, -1e300, .nan, .infinity, -.infinity, -5]

    func testBackoffInWholeSeconds() {
        XCTAssertEqual(Self.hostile.map { CoordinatorHeartbeats.backoffSeconds(3, base: $0, cap: 30) }, [30, Int.min, 30, 30, Int.min, -20])
        XCTAssertEqual(Self.hostile.map { CoordinatorHeartbeats.backoffSeconds(3, base: 1, cap: $0) }, [4, Int.min, 0, 4, Int.min, -5])
        XCTAssertEqual(CoordinatorHeartbeats.backoffSeconds(.max, base: 1e300, cap: .infinity), Int.max)
        XCTAssertEqual(CoordinatorHeartbeats.backoffSeconds(1, base: 1.5, cap: 30), 1)
        XCTAssertEqual(CoordinatorHeartbeats.backoffSeconds(6, base: 1, cap: 30), 30)
    }

    /// One sleep of the wait for a start: at most useconds_t's largest, 0 for what is not ahead.
    func testPauseBeforeAStart() {
        XCTAssertEqual(Self.hostile.map(RunLifecycle.pause), [.max, 0, 0, .max, 0, 0])
        XCTAssertEqual(RunLifecycle.pause(0.0035), 2000)
        XCTAssertEqual(RunLifecycle.pause(4_000), 3_999_998_500, "66 minutes: within useconds_t")
        XCTAssertEqual(RunLifecycle.pause(5_000), .max, "beyond useconds_t, it sleeps its largest and looks again")
    }

    /// A start that is not a time is not waited for (NaN used to spin for ever, infinity to trap);
    /// a start in the past returns at once.
    func testWaitForHostileStarts() {
        let began = Date()
        for t in [Double.nan, .infinity, -.infinity, -1e300, -5] { RunLifecycle.wait(until: t) }
        XCTAssertLessThan(Date().timeIntervalSince(began), 1)
        let soon = Date().timeIntervalSince1970 + 0.05
        RunLifecycle.wait(until: soon)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince1970, soon)
    }
}
