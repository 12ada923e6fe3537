// How slow bluetoothd has been seen to answer, and the timeouts and retries that follow from it.
//
// bluetoothd serialises every adapter's management commands through one kernel socket, so on a
// busy host (many adapters on one bluetoothd, a loaded CPU) a StartDiscovery or a ReadValue can
// take several seconds and still succeed. A fixed 10-s timeout then gives up on calls that were
// about to succeed, and the retry queues behind the abandoned one. The transport therefore
// measures each answer and allows a call a multiple of the slowest recent answer (never less than
// the configured timeout), doubles the allowance after each timeout in a row (bluetoothd's late
// answer is lost to us, so the timeout itself is the only evidence), and backs off between
// discovery attempts. Each kind of call (D-Bus member) has its own: SetDiscoveryFilter is
// answered at once while the StartDiscovery after it waits for the kernel. All of it is plain arithmetic over the durations it is given, so it is
// tested without a clock.
import Foundation

public struct CallLatency: Sendable, Equatable {
    /// The configured timeout: never allow less.
    public var base: TimeInterval
    /// A call is allowed this many times the slowest recent answer.
    public var factor: Double = 3
    /// Never allow more (a dongle that does not answer at all must still be found out).
    public var ceiling: TimeInterval = 60
    /// How many recent answers count.
    public var window = 16
    /// The most recent answer times, oldest first.
    public private(set) var answers: [TimeInterval] = []
    /// Calls that timed out since the last answer.
    public private(set) var timeoutsInRow = 0

    public init(base: TimeInterval) {
        self.base = base
    }

    /// A call was answered (a reply or an error reply) after `seconds`.
    public mutating func answered(after seconds: TimeInterval) {
        guard seconds.isFinite, seconds >= 0 else { return }
        answers.append(seconds)
        if answers.count > max(1, window) { answers.removeFirst(answers.count - max(1, window)) }
        timeoutsInRow = 0
    }

    /// A call was not answered within its timeout.
    public mutating func timedOut() {
        timeoutsInRow = min(timeoutsInRow + 1, 16)
    }

    /// The slowest of the recent answers (0 before any).
    public var slowestRecent: TimeInterval { answers.max() ?? 0 }

    /// What the next call may take.
    public var timeout: TimeInterval {
        let measured = max(base, factor * slowestRecent)
        return min(max(base, ceiling), measured * pow(2, Double(timeoutsInRow)))
    }

    /// Time allowed beyond the configured timeout (0 while bluetoothd answers promptly): what a
    /// caller adds to its own deadlines for work made of several calls.
    public var extraTime: TimeInterval { max(0, timeout - base) }

    /// How long to wait before discovery attempt `failures + 1` after `failures` in a row failed.
    public static func discoveryBackoff(afterFailures failures: Int) -> TimeInterval {
        guard failures > 0 else { return 0 }
        return min(16, pow(2, Double(min(failures, 5) - 1)))
    }

    /// One line for log.txt and the node's status when bluetoothd is slow to answer `call`; nil
    /// when it is not.
    public func summary(of call: String) -> String? {
        guard timeout > base else { return nil }
        let cause = timeoutsInRow > 0 ? "\(timeoutsInRow) in a row timed out" : String(format: "answered in up to %.1f s", slowestRecent)
        return String(format: "bluetoothd slow to answer %@ (%@): allowed %.0f s", call, cause, timeout)
    }
}
