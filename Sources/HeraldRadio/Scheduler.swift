import Foundation
import Dispatch

/// A handle to a scheduled action.
public final class ScheduledTask {
    public private(set) var isCancelled = false
    public init() {}
    public func cancel() { isCancelled = true }
}

/// The one source of time for the sensor, its transports and its loggers.
///
/// Every action scheduled on a scheduler runs on that scheduler's one executor, one at a time,
/// so code driven by a scheduler needs no locks. `VirtualScheduler` runs in virtual time
/// (hours in seconds, byte-identical runs); `DispatchScheduler` runs in real time on a serial
/// queue, for agents on real radios.
public protocol Scheduler: AnyObject {
    /// The current time.
    var now: Date { get }
    /// Runs `action` after `delay` seconds (0 or less: as soon as possible, after what is queued).
    @discardableResult
    func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask
}

extension Scheduler {
    /// Runs `action` soon, on this scheduler's executor.
    public func execute(_ action: @escaping () -> Void) { schedule(after: 0, action) }

    /// Runs `action` every `interval` seconds, the first time after `initialDelay`, until the
    /// returned task is cancelled.
    @discardableResult
    public func scheduleRepeating(every interval: TimeInterval, initialDelay: TimeInterval? = nil, _ action: @escaping () -> Void) -> ScheduledTask {
        precondition(interval > 0, "a repeating interval must be positive")
        let handle = ScheduledTask()
        func arm(_ delay: TimeInterval) {
            schedule(after: delay) { [weak self] in
                guard !handle.isCancelled else { return }
                action()
                guard !handle.isCancelled, self != nil else { return }
                arm(interval)
            }
        }
        arm(initialDelay ?? interval)
        return handle
    }
}

/// A scheduler that is also a serial executor callers on other threads can run code on and wait
/// for (`sync`): what a component that keeps its state on its node's executor takes (the agent:
/// `DispatchScheduler` in a process, an in-memory lab's virtual time in tests).
public protocol SerialScheduler: Scheduler, Sendable {
    /// Runs `body` on the executor and waits for its result. Never call from the executor itself.
    func sync<T>(_ body: () throws -> T) rethrows -> T
    /// Traps unless the caller is on this executor.
    func assertOnExecutor()
}

/// Virtual time: actions run in time order (ties in the order they were scheduled) as fast as
/// the CPU allows. `run(until:)` advances the clock; nothing ever sleeps.
public final class VirtualScheduler: Scheduler {
    /// The heap holds plain keys (time, order, slot): moving them costs no reference counting.
    /// Each entry's task and action wait in `slots` until it runs; freed slots are reused.
    private struct Key {
        let time: Double
        let sequence: UInt64
        let slot: Int32
        @inline(__always) func precedes(_ other: Key) -> Bool {
            time < other.time || (time == other.time && sequence < other.sequence)
        }
    }
    private struct Slot {
        var task: ScheduledTask?
        var action: (() -> Void)?
    }

    private var heap: [Key] = []
    private var slots: [Slot] = []
    private var free: [Int32] = []
    private var sequence: UInt64 = 0
    private var current: Double
    public private(set) var executedCount: UInt64 = 0

    public init(start: Date) { current = start.timeIntervalSince1970 }

    public var now: Date { Date(timeIntervalSince1970: current) }

    public var pendingCount: Int { heap.count }

    /// When the earliest action waiting is due (nil: none waits); it may have been cancelled.
    public var nextDue: Date? { heap.first.map { Date(timeIntervalSince1970: $0.time) } }

    @discardableResult
    public func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        let task = ScheduledTask()
        sequence &+= 1
        let slot: Int32
        if let reused = free.popLast() {
            slot = reused
            slots[Int(slot)] = Slot(task: task, action: action)
        } else {
            slot = Int32(slots.count)
            slots.append(Slot(task: task, action: action))
        }
        push(Key(time: current + max(0, delay), sequence: sequence, slot: slot))
        return task
    }

    /// Runs every action due up to and including `end`, then sets the clock to `end`.
    public func run(until end: Date) {
        let limit = end.timeIntervalSince1970
        while let first = heap.first, first.time <= limit {
            let key = pop()
            let i = Int(key.slot)
            let task = slots[i].task.unsafelyUnwrapped
            let action = slots[i].action.unsafelyUnwrapped
            slots[i] = Slot()
            free.append(key.slot)
            if task.isCancelled { continue }
            current = key.time
            executedCount &+= 1
            action()
        }
        if limit > current { current = limit }
    }

    /// Advances the clock by `interval` seconds, running what falls due.
    public func advance(by interval: TimeInterval) { run(until: now.addingTimeInterval(interval)) }

    private func push(_ k: Key) {
        heap.append(k)
        heap.withUnsafeMutableBufferPointer { h in
            var i = h.count - 1
            while i > 0 {
                let parent = (i - 1) / 2
                if h[i].precedes(h[parent]) { h.swapAt(i, parent); i = parent } else { break }
            }
        }
    }

    private func pop() -> Key {
        let top = heap[0]
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap.withUnsafeMutableBufferPointer { h in
                h[0] = last
                var i = 0
                let n = h.count
                while true {
                    let l = 2 * i + 1, r = l + 1
                    var m = i
                    if l < n, h[l].precedes(h[m]) { m = l }
                    if r < n, h[r].precedes(h[m]) { m = r }
                    if m == i { break }
                    h.swapAt(i, m)
                    i = m
                }
            }
        }
        return top
    }
}

/// Real time on one serial dispatch queue. The queue is the executor: code driven by this
/// scheduler (the sensor, a transport, the loggers) must be touched only from it, through
/// `execute`.
// Invariant (unchecked Sendable): its stored properties are `let`s of a queue (thread-safe) and
// a Sendable clock; what it drives is touched only on `queue`.
public final class DispatchScheduler: SerialScheduler, @unchecked Sendable {
    public let queue: DispatchQueue
    private let clock: @Sendable () -> Date

    public init(label: String = "heraldlab.sensor", clock: @escaping @Sendable () -> Date = { Date() }) {
        queue = DispatchQueue(label: label)
        self.clock = clock
    }

    public var now: Date { clock() }

    @discardableResult
    public func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        let job = Job(action)
        let box = UncheckedBox(job)
        let work: @Sendable () -> Void = { box.value.run() }
        if delay <= 0 { queue.async(execute: work) } else { queue.asyncAfter(deadline: .now() + delay, execute: work) }
        return job.task
    }

    private final class Job {
        let task = ScheduledTask()
        let action: () -> Void
        init(_ action: @escaping () -> Void) { self.action = action }
        func run() { if !task.isCancelled { action() } }
    }

    /// Runs `body` on the queue and waits for its result. Never call from the queue itself.
    public func sync<T>(_ body: () throws -> T) rethrows -> T { try queue.sync(execute: body) }

    public func assertOnExecutor() { dispatchPrecondition(condition: .onQueue(queue)) }
}

/// Carries a value across a concurrency boundary whose safety the scheduler's single executor
/// guarantees (the value is only used on that executor).
public struct UncheckedBox<T>: @unchecked Sendable {
    public let value: T
    public init(_ value: T) { self.value = value }
}
