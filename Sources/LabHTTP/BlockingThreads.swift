import Foundation

/// Threads for blocking socket work (LabClient's requests), kept for reuse: a job runs at once
/// on an idle thread, or on a new one when none is idle, so no request ever waits behind
/// another (as with a thread per request), but a thread is not created and destroyed for each
/// of them: an agent's heartbeat every second, a coordinator's calls to a thousand agents. A
/// thread idle for `idleTimeout` seconds ends; at most `maxIdle` wait at any time.
final class BlockingThreads: @unchecked Sendable {
    static let shared = BlockingThreads()

    private let lock = NSCondition()
    private var jobs: [() -> Void] = []
    private var idle = 0
    private let maxIdle: Int
    private let idleTimeout: TimeInterval
    private let stackSize: Int

    init(maxIdle: Int = 64, idleTimeout: TimeInterval = 10, stackSize: Int = 1 << 20) {
        self.maxIdle = maxIdle
        self.idleTimeout = idleTimeout
        self.stackSize = stackSize
    }

    func run(_ job: @escaping @Sendable () -> Void) {
        lock.lock()
        // An idle thread not yet claimed by a queued job takes it; otherwise a new thread.
        if idle > jobs.count {
            jobs.append(job)
            lock.signal()
            lock.unlock()
            return
        }
        lock.unlock()
        let thread = Thread { [self] in
            job()
            worker()
        }
        thread.stackSize = stackSize
        thread.start()
    }

    /// After its first job, a thread waits for more, and ends after `idleTimeout` without one.
    private func worker() {
        lock.lock()
        while true {
            guard idle < maxIdle else { break }
            idle += 1
            let deadline = Date(timeIntervalSinceNow: idleTimeout)
            while jobs.isEmpty {
                if !lock.wait(until: deadline) { break }
            }
            idle -= 1
            guard !jobs.isEmpty else { break }
            let job = jobs.removeFirst()
            lock.unlock()
            job()
            lock.lock()
        }
        lock.unlock()
    }
}
