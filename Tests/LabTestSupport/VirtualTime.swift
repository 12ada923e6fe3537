import Foundation
import HeraldCore
import HeraldRadio

/// One virtual time for an in-memory lab (issue 39 item 5): the clock the coordinator's and the
/// agents' rules read and sleep on (`clock`, a `LabClock`), and the executor their nodes' radios
/// and the agents' runs are on (this object, a `SerialScheduler` over a `VirtualScheduler`).
/// Nothing moves it but its driver: `settle()` waits until the lab is quiescent, `step(notPast:)`
/// then moves time to the next instant something waits for.
///
/// Quiescence (`settle`), the rule the driver advances by: time moves only when
/// (1) no call between the lab's parts is in flight (its links wrap every coordinator-to-agent
///     and agent-to-coordinator call in `begin`/`end`: time holds still however long a call
///     takes, fsyncs and checksums included);
/// (2) no task is counted as running: a task is counted from the moment `step` wakes it or a
///     call of it returns, until it parks on the clock again or begins another call (tasks by
///     identity); so the work a rule does between two waits (persisting a record, computing the
///     start instant) holds time still too;
/// (3) nothing touched this time (read it, parked, woke, scheduled or ran on its executor, began
///     or ended a call) for `rounds` consecutive checks `window` apart.
/// Why it is sound: every task of the lab's coordinator and agents is, at any moment, parked on
/// this clock (it cannot act before the driver wakes it), inside a counted call, or counted as
/// running; so when (1) and (2) hold, nothing is left that could still read the time before it
/// moves. (3) covers the start of a task nobody woke (a run the test submits), which touches the
/// clock first thing. The one thing not observable is a task's end: a task counted as running
/// that ends without parking (a child task whose call returned, a wait loop that is done) keeps
/// (2) from holding, so after `presumeAfter` checks with nothing touched and nothing in flight it
/// is taken to have ended. A task that computed that long without touching the clock or a link
/// would find time moved on, as it would under a loaded wall clock; none of the rules does.
/// The radio's actions never need a settle: they run on the executor in the driver's own call,
/// in time order, before any sleeper due at the same instant wakes.
// Invariant (unchecked Sendable): every stored `var` and the scheduler are touched only while
// `lock` is held (recursive: actions run under it schedule more actions); the lets are constant.
public final class VirtualTime: SerialScheduler, @unchecked Sendable {
    private let lock = NSRecursiveLock()
    private let scheduler: VirtualScheduler
    private var sleepers: [UInt64: (deadline: Double, task: Int?, wake: CheckedContinuation<Void, any Error>)] = [:]
    private var nextSleeper: UInt64 = 0
    private var touches: UInt64 = 0
    /// `settle`'s wait for the next touch, ended by the touch or by its deadline (by its id).
    private var touchWaiter: (id: UInt64, wake: CheckedContinuation<Bool, Never>)?
    private var nextWaiter: UInt64 = 0
    private var inFlight = 0
    /// Tasks that may be working outside a call: woken by `step`, or back from a call, and not
    /// parked or in a call again since (by task identity).
    private var running: Set<Int> = []
    private let ownerKey: String
    /// Checks of `settle` with nothing touched, and the real time between them; after
    /// `presumeAfter` such checks, tasks still counted as running are taken to have ended.
    public var rounds = 3
    public var window: Double = 0.001
    public var presumeAfter = 40
    /// The clock reading this time.
    public var clock: Clock { Clock(time: self) }

    public init(start: Double) {
        scheduler = VirtualScheduler(start: Date(timeIntervalSince1970: start))
        ownerKey = "heraldlab.virtual-time.\(UUID().uuidString)"
    }

    /// `LabClock` over this time.
    public struct Clock: LabClock {
        let time: VirtualTime
        public func now() -> Double { time.seconds }
        public func sleep(until deadline: Double) async throws { try await time.park(until: deadline) }
    }

    /// Seconds since 1970 in this time.
    public var seconds: Double {
        locked { touch(); return scheduler.now.timeIntervalSince1970 }
    }

    private func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        let outer = Thread.current.threadDictionary[ownerKey] == nil
        if outer { Thread.current.threadDictionary[ownerKey] = true }
        defer {
            if outer { Thread.current.threadDictionary[ownerKey] = nil }
            lock.unlock()
        }
        return try body()
    }

    // MARK: SerialScheduler

    public var now: Date { locked { touch(); return scheduler.now } }

    @discardableResult
    public func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        locked { touch(); return scheduler.schedule(after: delay, action) }
    }

    public func sync<T>(_ body: () throws -> T) rethrows -> T {
        try locked { touch(); return try body() }
    }

    public func assertOnExecutor() {
        precondition(Thread.current.threadDictionary[ownerKey] != nil, "not on the virtual time's executor")
    }

    // MARK: Sleepers and calls

    /// The current task's identity (nil outside a task).
    private static func currentTask() -> Int? { withUnsafeCurrentTask { $0?.hashValue } }

    func park(until deadline: Double) async throws {
        let task = Self.currentTask()
        let id = locked { () -> UInt64 in
            nextSleeper &+= 1
            if let task { running.remove(task) }
            return nextSleeper
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let now = locked { () -> Double? in
                    touch()
                    let t = scheduler.now.timeIntervalSince1970
                    if deadline <= t || Task.isCancelled { return t }
                    sleepers[id] = (deadline, task, c)
                    return nil
                }
                if now != nil {
                    if Task.isCancelled { c.resume(throwing: CancellationError()) } else { c.resume() }
                }
            }
        } onCancel: {
            let s = locked { sleepers.removeValue(forKey: id) }
            s?.wake.resume(throwing: CancellationError())
        }
    }

    /// Runs `body` as a call between the lab's parts: time does not move while it is in flight.
    public func working<T, E: Error>(_ body: () async throws(E) -> T) async throws(E) -> T {
        begin()
        defer { end() }
        return try await body()
    }

    /// A call between the lab's parts begins (`end` when it ends): time does not move meanwhile.
    public func begin() {
        let task = Self.currentTask()
        locked {
            touch()
            inFlight += 1
            if let task { running.remove(task) }
        }
    }
    public func end() {
        let task = Self.currentTask()
        locked {
            touch()
            inFlight -= 1
            if let task { running.insert(task) }
        }
    }

    /// Counts a touch (under `lock`) and ends `settle`'s wait for one.
    private func touch() {
        touches &+= 1
        if let w = touchWaiter {
            touchWaiter = nil
            w.wake.resume(returning: true)
        }
    }

    /// True as soon as anything touches this time; false when `seconds` of real time pass first.
    private func touched(within seconds: Double) async -> Bool {
        await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let id = locked { () -> UInt64 in
                nextWaiter &+= 1
                touchWaiter = (nextWaiter, c)
                return nextWaiter
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in
                let wake = locked { () -> CheckedContinuation<Bool, Never>? in
                    guard let w = touchWaiter, w.id == id else { return nil }
                    touchWaiter = nil
                    return w.wake
                }
                wake?.resume(returning: false)
            }
        }
    }

    // MARK: The driver

    /// Returns once the lab is quiescent (the rule above).
    public func settle() async {
        var seen = snapshot()
        var still = 0
        while !Task.isCancelled {
            await Task.yield()
            // A check: the next touch, or `window` of real time without one (the other tasks of
            // the lab run meanwhile); a touch starts the count of quiet checks again.
            let changed = await touched(within: window)
            let s = snapshot()
            guard !changed, s.touches == seen.touches, s.inFlight == 0 else { still = 0; seen = s; continue }
            still += 1
            if s.running == 0, still >= rounds { return }
            if still >= presumeAfter { locked { running.removeAll() }; return }
        }
    }

    private func snapshot() -> (touches: UInt64, inFlight: Int, running: Int) { locked { (touches, inFlight, running.count) } }

    /// Moves time to the earliest sleeper's deadline (or `limit`, if sooner), running the
    /// executor's actions due until then in time order, then wakes the sleepers due. Call it when
    /// the lab is quiescent (`settle`). Returns the new time.
    @discardableResult
    public func step(notPast limit: Double) -> Double {
        let (due, now) = locked { () -> ([CheckedContinuation<Void, any Error>], Double) in
            let target = min(limit, sleepers.values.map(\.deadline).min() ?? limit)
            if target > scheduler.now.timeIntervalSince1970 { scheduler.run(until: Date(timeIntervalSince1970: target)) }
            let t = scheduler.now.timeIntervalSince1970
            let ids = sleepers.filter { $0.value.deadline <= t }.sorted { ($0.value.deadline, $0.key) < ($1.value.deadline, $1.key) }.map(\.key)
            touch()
            var wake = [CheckedContinuation<Void, any Error>]()
            for id in ids {
                guard let s = sleepers.removeValue(forKey: id) else { continue }
                if let task = s.task { running.insert(task) }
                wake.append(s.wake)
            }
            return (wake, t)
        }
        for c in due { c.resume() }
        return now
    }

    /// Tasks parked on the clock now.
    public var sleeping: Int { locked { sleepers.count } }

    /// Ends every sleep still parked (the lab is going away): they throw `CancellationError`.
    public func cancelSleepers() {
        let all = locked { () -> [CheckedContinuation<Void, any Error>] in
            defer { sleepers.removeAll() }
            return sleepers.values.map(\.wake)
        }
        for c in all { c.resume(throwing: CancellationError()) }
    }
}
