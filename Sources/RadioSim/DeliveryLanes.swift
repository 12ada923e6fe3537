import Foundation
import Dispatch
import HeraldRadio
#if canImport(Glibc)
import Glibc
#endif

/// Scan reports handed to the nodes' sensors later and on another thread, with the output of
/// handing each over as it is decided.
///
/// Handing a report to a sensor (its device database, contacts.csv and statistics) is most of
/// a simulation's work, and it touches only the receiving node. So `simulate` queues each
/// decided report on its receiver, in a batch, and:
/// - before anything of node k runs (every event scheduled through its clock, `NodeClock`: its
///   sensor's scan cycle, its transport's answers, its loggers' timers), node k's reports are
///   handed over, on the simulation's thread; once the batch holds `fullFrom` reports it goes
///   to the other thread, which hands it over node by node while the simulation goes on
///   (deciding adverts into a new batch, running other nodes' events: a node still in that
///   batch is waited for, or taken over, before its own event runs);
/// - before a node reaches another through the medium (a GATT read or write served by the
///   other, a link dropped: both ends hear of it), the other's queue is handed over as if its
///   own event ran: nothing else of any node is touched, so no other queue need be;
/// - before anything that may reach any node (the medium's own events other than advertising:
///   power, MAC rotation; anything scheduled on the medium's shared clock), every queue is
///   handed over, both threads taking nodes in turn.
///
/// Each node still receives its reports in the order they were decided, each at the virtual
/// time it was decided at (the clock a thread sees while it hands reports over), and nothing
/// else of that node runs in between; every random draw stays on the simulation's thread.
/// Reports of one node are handed over in a row, which keeps the node's state in cache. A node
/// that scheduled work, or touched the medium, while handling a report would break this: it is
/// refused with a precondition failure naming the rule.
// Invariant (unchecked Sendable): the batch being filled, `inFlight`, `spare` and the targets are
// the simulation thread's alone; a batch in flight is shared only through `lock` (`next`, `state`)
// while the other threads read its queues and reports, which nobody writes until `join()` has
// waited for them; each thread writes only its own clock slot and `perThread` entry.
final class DeliveryLanes: @unchecked Sendable {
    struct Handoff { let report: Int32; let rssi: Int32 }

    /// Reports queued per receiving node, in the order the medium decided them.
    final class Batch {
        @exclusivity(unchecked) var queues: [[Handoff]]
        /// Nodes given reports, each once, in that order (some queues may since have been
        /// emptied by their node's own events).
        @exclusivity(unchecked) var active: [Int] = []
        @exclusivity(unchecked) var listed: [Bool]
        /// The reports (without their RSSI) and when each was decided
        /// (`Date.timeIntervalSinceReferenceDate`, so that a thread's clock gives the same Date).
        @exclusivity(unchecked) var reports: [ScanReport] = []
        @exclusivity(unchecked) var times: [Double] = []
        @exclusivity(unchecked) var pending = 0
        /// Which of `active` the threads look at next, and each node's state: queued, taken by
        /// a thread, handed over (under the lanes' lock).
        @exclusivity(unchecked) var next = 0
        @exclusivity(unchecked) var state: [UInt8]
        /// Counts resets: a batch is reused once handed over.
        @exclusivity(unchecked) var generation = 0
        static let queued: UInt8 = 0, taken: UInt8 = 1, done: UInt8 = 2
        init(nodes: Int) {
            queues = [[Handoff]](repeating: [], count: nodes)
            listed = [Bool](repeating: false, count: nodes)
            state = [UInt8](repeating: 0, count: nodes)
        }
        func grow(to nodes: Int) {
            while queues.count < nodes { queues.append([]); listed.append(false); state.append(0) }
        }
        func reset() {
            for node in active { queues[node].removeAll(keepingCapacity: true); listed[node] = false; state[node] = Batch.queued }
            active.removeAll(keepingCapacity: true)
            reports.removeAll(keepingCapacity: true)
            times.removeAll(keepingCapacity: true)
            pending = 0
            next = 0
            generation += 1
        }
    }

    let threads: Int
    /// The batch the medium adds to, and the one the other threads may still be handing over.
    @exclusivity(unchecked) private var current = Batch(nodes: 0)
    @exclusivity(unchecked) private var inFlight: Batch?
    @exclusivity(unchecked) private var spare: Batch?
    @exclusivity(unchecked) private var nodes = 0
    /// Receiving transports by node, held strongly until `finish()`.
    @exclusivity(unchecked) private var targets: [SimTransport?] = []
    private let worker: LaneWorker?
    /// Each thread's clock (0: the simulation's thread), read through thread-local storage.
    private let clocks: UnsafeMutablePointer<Double>
    /// Guards each batch's `next` and `state`; signalled when a node of a batch is handed over.
    private let lock = NSCondition()
    /// Each thread's own copies of the batch's reports (one copy per report and thread, not per
    /// report and receiver: the reports' storage is shared with the medium, and counting its
    /// references from two cores at once is slow).
    private final class ThreadReports {
        @exclusivity(unchecked) var batch: Batch?
        @exclusivity(unchecked) var generation = -1
        @exclusivity(unchecked) var reports: [ScanReport] = []
        @exclusivity(unchecked) var filled: [Bool] = []
    }
    private let perThread: [ThreadReports]

    /// Below this many reports a full drain runs on the calling thread alone (waking the others
    /// costs more than it saves). Tests set 1, so that small plans use every thread.
    nonisolated(unsafe) static var smallBatch = 48
    /// Once the batch holds this many reports it goes to the other threads while the medium
    /// goes on deciding adverts into a new one (memory stays bounded; the larger, the more of a
    /// node's reports are handed over in a row while its state is in cache).
    nonisolated(unsafe) static var drainAt = 32768
    /// A node's own event empties every queue, in parallel, rather than only its own when the
    /// batch holds at least this many reports.
    nonisolated(unsafe) static var fullFrom = 4096


    init(threads: Int) {
        self.threads = max(1, threads)
        clocks = .allocate(capacity: self.threads)
        clocks.initialize(repeating: 0, count: self.threads)
        worker = self.threads > 1 ? LaneWorker(threads: self.threads - 1) : nil
        perThread = (0..<self.threads).map { _ in ThreadReports() }
    }

    deinit { clocks.deallocate() }

    var pending: Int { current.pending }

    func setTarget(_ transport: SimTransport, node: Int) {
        join()
        while targets.count <= node { targets.append(nil) }
        targets[node] = transport
        nodes = targets.count
        current.grow(to: nodes)
        spare?.grow(to: nodes)
    }

    /// Adds a report decided now; returns its number.
    @inline(__always) func add(_ report: ScanReport, at now: Date) -> Int32 {
        current.reports.append(report)
        current.times.append(now.timeIntervalSinceReferenceDate)
        return Int32(current.reports.count - 1)
    }

    @inline(__always) func handoff(_ report: Int32, rssi: Int, to node: Int) {
        let b = current
        if !b.listed[node] { b.listed[node] = true; b.active.append(node) }
        b.queues[node].append(Handoff(report: report, rssi: Int32(truncatingIfNeeded: rssi)))
        b.pending += 1
    }

    /// After an advert: a full batch goes to the other threads (the previous one finished first).
    @inline(__always) func advertDecided() {
        if current.pending >= Self.drainAt { submit() }
    }

    private func submit() {
        guard let worker, current.pending >= Self.smallBatch else { drainAll(); return }
        join()
        let b = current
        inFlight = b
        current = spare ?? Batch(nodes: nodes)
        spare = nil
        worker.run { thread in self.work(b, thread: thread + 1) }
    }

    /// Waits for the batch the other threads are handing over, helping with it.
    private func join() {
        guard let b = inFlight, let worker else { return }
        work(b, thread: 0)
        worker.wait()
        b.reset()
        spare = b
        inFlight = nil
    }

    /// Hands one node its reports before something of that node runs: in the batch the other
    /// threads are handing over, it waits for that node (or takes it, if no thread has); the
    /// batch being filled it hands over itself, and sends the rest to the other threads once
    /// it holds `fullFrom` reports.
    func drain(node: Int) {
        if let b = inFlight, node < b.listed.count, b.listed[node] { finish(node, of: b) }
        guard node < current.queues.count, !current.queues[node].isEmpty else { return }
        run(current, node, thread: 0)
        current.pending -= current.queues[node].count
        current.queues[node].removeAll(keepingCapacity: true)
        if current.pending >= Self.fullFrom { submit() }
    }

    /// Returns once `node`'s reports in batch `b` are handed over, handing them over itself if
    /// no thread has taken them yet.
    private func finish(_ node: Int, of b: Batch) {
        lock.lock()
        if b.state[node] == Batch.queued {
            b.state[node] = Batch.taken
            lock.unlock()
            run(b, node, thread: 0)
            lock.lock()
            b.state[node] = Batch.done
            lock.broadcast()
            lock.unlock()
            return
        }
        while b.state[node] != Batch.done { lock.wait() }
        lock.unlock()
    }

    /// Hands every queue over, nodes shared among the threads, and returns when all are handled.
    func drainAll() {
        join()
        let b = current
        guard b.pending > 0 else { return }
        if let worker, b.pending >= Self.smallBatch {
            worker.run { thread in self.work(b, thread: thread + 1) }
            work(b, thread: 0)
            worker.wait()
        } else {
            work(b, thread: 0)
        }
        b.reset()
    }

    private func work(_ b: Batch, thread: Int) {
        while true {
            lock.lock()
            var node = -1
            while b.next < b.active.count {
                let k = b.active[b.next]
                b.next += 1
                if b.state[k] == Batch.queued { b.state[k] = Batch.taken; node = k; break }
            }
            lock.unlock()
            guard node >= 0 else { return }
            if !b.queues[node].isEmpty { run(b, node, thread: thread) }
            lock.lock()
            b.state[node] = Batch.done
            lock.broadcast()
            lock.unlock()
        }
    }

    /// Hands `node` its queue; the thread's clock reads each report's time meanwhile.
    private func run(_ b: Batch, _ node: Int, thread: Int) {
        let clock = clocks + thread
        let outer = pthread_getspecific(NodeClock.key)
        pthread_setspecific(NodeClock.key, clock)
        defer { pthread_setspecific(NodeClock.key, outer) }
        guard let target = targets[node] else { return }
        let mine = perThread[thread]
        if mine.batch !== b || mine.generation != b.generation {
            mine.batch = b
            mine.generation = b.generation
            mine.reports.removeAll(keepingCapacity: true)
            mine.filled.removeAll(keepingCapacity: true)
        }
        let count = b.reports.count
        if mine.filled.count < count {
            mine.filled.append(contentsOf: repeatElement(false, count: count - mine.filled.count))
            mine.reports.append(contentsOf: repeatElement(Self.blank, count: count - mine.reports.count))
        }
        b.queues[node].withUnsafeBufferPointer { handoffs in
            mine.reports.withUnsafeMutableBufferPointer { reports in
                for h in handoffs {
                    let i = Int(h.report)
                    if !mine.filled[i] { mine.filled[i] = true; reports[i] = b.reports[i] }
                    clock.pointee = b.times[i]
                    reports[i].rssi = Int(h.rssi)
                    target.deliver(reports[i])
                }
            }
        }
    }

    private static let blank = ScanReport(address: RadioAddress(""), rssi: 0)

    /// Hands the last reports over, drops the transports and stops the threads.
    func finish() {
        drainAll()
        for t in perThread { t.batch = nil; t.reports.removeAll() }
        targets.removeAll()
        worker?.stop()
    }

    /// Whether the calling thread is handing reports over.
    static var inLane: Bool { pthread_getspecific(NodeClock.key) != nil }

    static func refuse(_ what: String) -> Never {
        preconditionFailure("a node \(what) while handling a scan report: in `simulate` reports are handed over later and in parallel, so handling one may touch only the receiving node's own state (RadioSim/DeliveryLanes.swift)")
    }
}

/// A clock of a medium whose reports are handed over later (`DeliveryLanes`): the scheduler's
/// time, except on a thread handing reports over, where it is the time the report being
/// handled was decided. What is scheduled through a node's clock first has that node's queue
/// handed over; through the medium's shared clock (`node` nil), every queue.
final class NodeClock: Scheduler {
    static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "no thread-local storage key left")
        return key
    }()

    let base: any Scheduler
    let node: Int?
    weak var medium: SimMedium?

    init(base: any Scheduler, node: Int?, medium: SimMedium?) {
        self.base = base
        self.node = node
        self.medium = medium
    }

    var now: Date {
        if let slot = pthread_getspecific(Self.key) {
            return Date(timeIntervalSinceReferenceDate: slot.assumingMemoryBound(to: Double.self).pointee)
        }
        return base.now
    }

    @discardableResult
    func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        if DeliveryLanes.inLane { DeliveryLanes.refuse("scheduled work") }
        if let node {
            return base.schedule(after: delay) { [weak medium] in
                medium?.flushDeliveries(to: node)
                action()
            }
        }
        return base.schedule(after: delay) { [weak medium] in
            medium?.flushDeliveries()
            action()
        }
    }
}

/// Threads that help drain the queues, woken by a semaphore each.
// Invariant (unchecked Sendable): `job` and `stopping` are written before the semaphores that
// wake the threads are signalled and read only after, so each write happens before its reads.
final class LaneWorker: @unchecked Sendable {
    private let go: [DispatchSemaphore]
    private let done = DispatchSemaphore(value: 0)
    private var job: ((Int) -> Void)?
    private var stopping = false
    private let threads: Int

    init(threads: Int) {
        self.threads = threads
        go = (0..<threads).map { _ in DispatchSemaphore(value: 0) }
        for k in 0..<threads {
            let thread = Thread { [self] in
                while true {
                    go[k].wait()
                    if stopping { break }
                    job?(k)
                    done.signal()
                }
                done.signal()
            }
            thread.name = "deliveries \(k + 1)"
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    func run(_ job: @escaping (Int) -> Void) {
        self.job = job
        for s in go { s.signal() }
    }

    func wait() {
        for _ in 0..<threads { done.wait() }
        job = nil
    }

    func stop() {
        guard !stopping else { return }
        stopping = true
        for s in go { s.signal() }
        for _ in 0..<threads { done.wait() }
    }
}
