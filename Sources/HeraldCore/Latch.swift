import Synchronization

/// A one-shot signal: opened once; `wait()` returns when it is open (true), or at once when its
/// task is cancelled (false), however many wait (an agent's start for its heartbeats, a run's
/// stop for its work in the coordinator's `RunDriver`).
public final class Latch: Sendable {
    private struct State {
        var isOpen = false
        var waiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        var next: UInt64 = 0
    }
    private let state = Mutex(State())

    public init() {}

    public func open() {
        let waiters = state.withLock { s in
            s.isOpen = true
            defer { s.waiters = [:] }
            return s.waiters.values
        }
        for w in waiters { w.resume(returning: true) }
    }

    public func wait() async -> Bool {
        let id = state.withLock { s in s.next += 1; return s.next }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
                let now: Bool? = state.withLock { s in
                    if s.isOpen { return true }
                    if Task.isCancelled { return false }
                    s.waiters[id] = c
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            state.withLock { s in s.waiters.removeValue(forKey: id) }?.resume(returning: false)
        }
    }
}
