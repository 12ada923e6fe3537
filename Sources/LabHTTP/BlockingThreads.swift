import Foundation

/// Threads for blocking socket work, kept for reuse: a job runs at once on an idle thread, or on
/// a new one while fewer than `maxThreads` exist, else it waits in order for the next free
/// thread. A thread is not created and destroyed for each job (an agent's heartbeat every
/// second, a coordinator's calls to a thousand agents). A thread idle for `idleTimeout` seconds
/// ends; at most `maxIdle` wait at any time.
///
/// `shared` (LabClient's requests) has no bound, so that no request ever waits behind another;
/// the HTTP server's workers (`EventLoop.workers`) are bounded.
final class BlockingThreads: @unchecked Sendable {
    static let shared = BlockingThreads()

    private let lock = NSCondition()
    private var jobs: [() -> Void] = []
    private var head = 0
    private var idle = 0
    private var threads = 0
    private let maxThreads: Int
    private let maxIdle: Int
    private let idleTimeout: TimeInterval
    private let stackSize: Int

    init(maxThreads: Int = Int.max, maxIdle: Int = 64, idleTimeout: TimeInterval = 10, stackSize: Int = 1 << 20) {
        self.maxThreads = max(1, maxThreads)
        self.maxIdle = maxIdle
        self.idleTimeout = idleTimeout
        self.stackSize = stackSize
    }

    private var queued: Int { jobs.count - head }

    /// Threads running a job now, and jobs waiting for a thread (tests check that a pool goes
    /// back to idle).
    var busy: (running: Int, queued: Int) {
        lock.lock(); defer { lock.unlock() }
        return (threads - idle, queued)
    }

    func run(_ job: @escaping @Sendable () -> Void) {
        lock.lock()
        // An idle thread not yet claimed by a queued job takes it; otherwise a new thread, while
        // the bound allows; otherwise it waits for the next thread to finish its job.
        if idle > queued || threads >= maxThreads {
            jobs.append(job)
            lock.signal()
            lock.unlock()
            return
        }
        threads += 1
        lock.unlock()
        let thread = Thread { [self] in
            job()
            worker()
        }
        thread.stackSize = stackSize
        thread.start()
    }

    /// After its first job, a thread takes queued jobs, waits for more, and ends after
    /// `idleTimeout` without one.
    private func worker() {
        lock.lock()
        while true {
            if queued == 0 {
                guard idle < maxIdle else { break }
                idle += 1
                let deadline = Date(timeIntervalSinceNow: idleTimeout)
                while queued == 0 {
                    if !lock.wait(until: deadline) { break }
                }
                idle -= 1
                guard queued > 0 else { break }
            }
            let job = jobs[head]
            head += 1
            if head == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 1024 {
                jobs.removeFirst(head)
                head = 0
            }
            lock.unlock()
            job()
            lock.lock()
        }
        threads -= 1
        lock.unlock()
    }
}
