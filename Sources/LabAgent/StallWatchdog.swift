import Foundation
import HeraldCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Notices when the whole process did not run for a while: a thread that wakes every quarter
/// second and compares the monotonic clock with its last wake. Under SIGSTOP every thread stops,
/// so the first wake after SIGCONT sees the pause. The pause is reported in the agent's clock
/// (`clock`), the one its runs' instants are in.
///
/// A Dispatch timer on a queue of its own (no thread is kept for it): it wakes every quarter
/// second, and its handler alone reads and writes the last wake (`last`). The timer cancels
/// itself at its first wake after `stop` (or once the watchdog is gone).
final class StallWatchdog: Sendable {
    private let last: Mutex<(monotonic: Double, wall: Double)>
    private let stopped = Mutex(false)

    private let clock: any LabClock

    init(threshold: TimeInterval, clock: any LabClock, onStall: @escaping @Sendable (_ from: Double, _ to: Double) -> Void) {
        self.clock = clock
        last = Mutex((Self.monotonic(), clock.now()))
        let source = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "heraldlab.agent.stall"))
        source.schedule(deadline: .now() + .milliseconds(250), repeating: .milliseconds(250), leeway: .milliseconds(10))
        source.setEventHandler { [weak self] in
            guard let self, !self.stopped.withLock({ $0 }) else { source.cancel(); return }
            self.woke(threshold: threshold, onStall)
        }
        source.resume()
    }

    private func woke(threshold: TimeInterval, _ onStall: @Sendable (_ from: Double, _ to: Double) -> Void) {
        let m = Self.monotonic(), wall = clock.now()
        let previous = last.withLock { l in
            defer { l = (m, wall) }
            return l
        }
        if m - previous.monotonic > threshold { onStall(previous.wall, wall) }
    }

    func stop() { stopped.withLock { $0 = true } }

    static func monotonic() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}
