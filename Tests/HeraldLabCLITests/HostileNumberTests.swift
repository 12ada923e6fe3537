import Foundation
import XCTest
@testable import HeraldLabCLI

/// Issue 36: the command's text of a duration, which comes from a coordinator's run record as
/// well as from plans, fed 1e300, -1e300, NaN, ±infinity and a negative value.
final class HostileNumberTests: XCTestCase {
    func testDurationText() {
        XCTAssertEqual([1e300, -1e300, .nan, .infinity, -.infinity, -5].map(formatDuration), ["1e+300s", "-1e+300s", "–", "–", "–", "-5000ms"])
        // Ordinary durations as before.
        XCTAssertEqual([0, 0.25, 90, 3723, 7200, 604_800].map(formatDuration), ["0s", "250ms", "1m30s", "1h2m3s", "2h", "168h"])
        XCTAssertEqual(formatDuration(9e18), "2500000000000000h", "hours beyond Int32 whole")
    }
}
