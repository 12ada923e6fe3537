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

/// Virtual time: actions run in time order (ties in the order they were scheduled) as fast as
/// the CPU allows. `run(until:)` advances the clock; nothing ever sleeps.
public final class VirtualScheduler: Scheduler {
    private struct Entry {
        let time: Double
        let sequence: UInt64
        let task: ScheduledTask
        let action: () -> Void
        @inline(__always) func precedes(_ other: Entry) -> Bool {
            time < other.time || (time == other.time && sequence < other.sequence)
        }
    }

    private var heap: [Entry] = []
    private var sequence: UInt64 = 0
    private var current: Double
    public private(set) var executedCount: UInt64 = 0

    public init(start: Date) { current = start.timeIntervalSince1970 }

    public var now: Date { Date(timeIntervalSince1970: current) }

    public var pendingCount: Int { heap.count }

    @discardableResult
    public func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        let task = ScheduledTask()
        sequence &+= 1
        push(Entry(time: current + max(0, delay), sequence: sequence, task: task, action: action))
        return task
    }

    /// Runs every action due up to and including `end`, then sets the clock to `end`.
    public func run(until end: Date) {
        let limit = end.timeIntervalSince1970
        while let first = heap.first, first.time <= limit {
            let entry = pop()
            if entry.task.isCancelled { continue }
            current = entry.time
            executedCount &+= 1
            entry.action()
        }
        if limit > current { current = limit }
    }

    /// Advances the clock by `interval` seconds, running what falls due.
    public func advance(by interval: TimeInterval) { run(until: now.addingTimeInterval(interval)) }

    private func push(_ e: Entry) {
        heap.append(e)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if heap[i].precedes(heap[parent]) { heap.swapAt(i, parent); i = parent } else { break }
        }
    }

    private func pop() -> Entry {
        let top = heap[0]
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            var i = 0
            let n = heap.count
            while true {
                let l = 2 * i + 1, r = l + 1
                var m = i
                if l < n, heap[l].precedes(heap[m]) { m = l }
                if r < n, heap[r].precedes(heap[m]) { m = r }
                if m == i { break }
                heap.swapAt(i, m)
                i = m
            }
        }
        return top
    }
}

/// Real time on one serial dispatch queue. The queue is the executor: code driven by this
/// scheduler (the sensor, a transport, the loggers) must be touched only from it, through
/// `execute`.
public final class DispatchScheduler: Scheduler, @unchecked Sendable {
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
}

/// Carries a value across a concurrency boundary whose safety the scheduler's single executor
/// guarantees (the value is only used on that executor).
public struct UncheckedBox<T>: @unchecked Sendable {
    public let value: T
    public init(_ value: T) { self.value = value }
}
