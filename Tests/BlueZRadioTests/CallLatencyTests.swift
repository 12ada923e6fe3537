// CallLatency: the timeouts a slow bluetoothd is allowed, from the answer times it is given (no
// clock).
import BlueZRadio
import XCTest

final class CallLatencyTests: XCTestCase {
    func testAPromptBluetoothdKeepsTheConfiguredTimeout() {
        var l = CallLatency(base: 10)
        for _ in 0..<5 { l.answered(after: 0.2) }
        XCTAssertEqual(l.timeout, 10)
        XCTAssertEqual(l.extraTime, 0)
        XCTAssertNil(l.summary(of: "StartDiscovery"))
    }

    func testSlowAnswersAreAllowedThreeTimesTheSlowestRecentAndForgottenLater() {
        var l = CallLatency(base: 10)
        l.answered(after: 8)
        XCTAssertEqual(l.timeout, 24)
        XCTAssertEqual(l.extraTime, 14)
        XCTAssertEqual(l.summary(of: "ReadValue"), "bluetoothd slow to answer ReadValue (answered in up to 8.0 s): allowed 24 s")
        // Once the slow answer is out of the window, the configured timeout is back.
        for _ in 0..<l.window { l.answered(after: 0.5) }
        XCTAssertEqual(l.timeout, 10)
    }

    func testEachTimeoutInARowDoublesTheAllowanceUpToTheCeiling() {
        var l = CallLatency(base: 10)
        l.timedOut()
        XCTAssertEqual(l.timeout, 20)
        XCTAssertEqual(l.summary(of: "StartDiscovery"), "bluetoothd slow to answer StartDiscovery (1 in a row timed out): allowed 20 s")
        l.timedOut()
        XCTAssertEqual(l.timeout, 40)
        l.timedOut()
        XCTAssertEqual(l.timeout, 60, "never more than the ceiling: a dongle that never answers is still found out")
        for _ in 0..<20 { l.timedOut() }
        XCTAssertEqual(l.timeout, 60)
        // An answer ends the run of timeouts; what it took is what counts now.
        l.answered(after: 15)
        XCTAssertEqual(l.timeoutsInRow, 0)
        XCTAssertEqual(l.timeout, 45)
    }

    func testNonsenseDurationsAreIgnored() {
        var l = CallLatency(base: 10)
        l.answered(after: -1)
        l.answered(after: .nan)
        l.answered(after: .infinity)
        XCTAssertTrue(l.answers.isEmpty)
        XCTAssertEqual(l.timeout, 10)
    }

    func testDiscoveryBacksOffOneTwoFourUpToSixteenSeconds() {
        XCTAssertEqual((0...7).map { CallLatency.discoveryBackoff(afterFailures: $0) }, [0, 1, 2, 4, 8, 16, 16, 16])
    }
}
