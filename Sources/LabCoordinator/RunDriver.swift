import Foundation
import HeraldCore
import Logging
import Synchronization

/// The one owner of the coordinator's run work (issue 39 item 3): each run's course (`drive`:
/// arm, barrier, watch, gather) and each notice to the air runs as a child task of `run()`, one
/// task group fed by a stream, instead of a fire-and-forget `Task` per run.
///
/// - `launch` and `notify` only queue: the stream buffers them until `run()` takes them, so a
///   run submitted or resumed before the driver runs is not lost.
/// - A run's work is raced against its stop signal (`stop(_:)`, fired by abort and cancel by
///   id, or `stopAll`): whichever ends first cancels the other, so stopping one run ends its work
///   at once and leaves the others running. The signal exists from `launch` on: a stop that comes
///   before the work begins still ends it as soon as it begins.
/// - Cancelling the task that runs `run()` (the coordinator's `stop`, the process's ServiceGroup
///   at shutdown) ends the stream, cancels every child, and `run()` returns once they have all
///   ended; launches still queued are dropped (their runs are recorded and resume at the next start).
///
/// It runs once: the coordinator's one background task, or the process's ServiceGroup, holds it.
final class RunDriver: Sendable {
    /// A run's stop signal: opened at most once, and seen by a waiter that comes after.
    typealias Stop = Latch

    enum Work: Sendable {
        case run(String, Stop)
        case notice(NodeTicket.Notice)
    }

    private let work: AsyncStream<Work>
    private let queue: AsyncStream<Work>.Continuation
    /// The stop signal of each run launched and not yet ended, by run id (a run launched again
    /// while its earlier work still ends replaces it here, as the task by id did before).
    private let stops = Mutex<[String: Stop]>([:])
    /// Whether `run()` has begun (it runs once).
    private let began = Mutex(false)
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
        (work, queue) = AsyncStream.makeStream(of: Work.self)
    }

    /// Queues a run's work (its course from wherever its record is).
    func launch(_ id: String) {
        let stop = Stop()
        stops.withLock { $0[id] = stop }
        if case .terminated = queue.yield(.run(id, stop)) {
            stops.withLock { s in if s[id] === stop { s[id] = nil } }
            logger.notice("the coordinator is stopping: the run is not driven now and resumes at its next start", metadata: ["run": .string(id)])
        }
    }

    /// Queues a notice to the air (sent by `tell`, in a child task of its own).
    func notify(_ notice: NodeTicket.Notice) {
        if case .terminated = queue.yield(.notice(notice)) {
            logger.warning("the coordinator is stopping: a notice is not sent to the air; the tickets concerned still expire at their run's latest end",
                           metadata: ["notice": "\(notice)"])
        }
    }

    /// Stops the work of run `id`, if any (abort, cancel): it is cancelled, the others go on.
    func stop(_ id: String) { stops.withLock { $0[id] }?.open() }

    /// Stops the work of every run (the coordinator stops; the runs resume at its next start).
    func stopAll() { for s in stops.withLock({ Array($0.values) }) { s.open() } }

    /// The runs whose work is queued or running.
    var live: [String] { stops.withLock { $0.keys.sorted() } }

    /// Runs each queued run (`drive`) and notice (`tell`) as a child task until cancelled, then
    /// waits for them all to end.
    func run(drive: @escaping @Sendable (String) async -> Void, tell: @escaping @Sendable (NodeTicket.Notice) async -> Void) async {
        let first = began.withLock { b in
            defer { b = true }
            return !b
        }
        guard first else {
            logger.error("the run driver is already running: a second one is not started")
            return
        }
        await withDiscardingTaskGroup { group in
            for await item in work {
                switch item {
                case .run(let id, let stop):
                    group.addTask { [self] in
                        await Self.race(drive: { await drive(id) }, against: stop)
                        stops.withLock { s in if s[id] === stop { s[id] = nil } }
                    }
                case .notice(let notice):
                    group.addTask { await tell(notice) }
                }
            }
        }
        // Cancelled: what was queued and never began is not run now (each such run resumes
        // from its record at the next start).
        stops.withLock { $0.removeAll() }
    }

    /// Runs `drive` until it ends or `stop` fires, whichever is first; the other is cancelled.
    private static func race(drive: @escaping @Sendable () async -> Void, against stop: Stop) async {
        await withTaskGroup(of: Void.self) { inner in
            inner.addTask { await drive() }
            inner.addTask { _ = await stop.wait() }
            await inner.next()
            inner.cancelAll()
        }
    }
}
