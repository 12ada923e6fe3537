import Foundation
import Dispatch
import HeraldRadio
#if canImport(Glibc)
import Glibc
#endif

/// Scan reports handed to the nodes' sensors on several threads, with the output of one.
///
/// Handing a report to a sensor (its device database, contacts.csv and statistics) is most of
/// a simulation's work, and it touches only the receiving node. So `simulate` does not hand
/// reports over as adverts are decided: it queues them per lane (a lane is a fixed set of
/// receiving nodes), and before anything else runs (any event that is not the medium's own
/// advertising) the lanes are drained at once, one per thread. Each node still receives its
/// reports in the order they were decided, each at the virtual time it was decided at (the
/// clock a lane's thread sees), and nothing a node does while handling a report reaches the
/// other nodes, the medium or the scheduler; every random draw stays on the simulation's own
/// thread. The logs are byte-identical to handing each report over at once.
///
/// A node that scheduled work, or touched the medium, while handling a report would break
/// that: it is refused with a precondition failure naming the rule.
final class DeliveryLanes: @unchecked Sendable {
    struct Handoff { let receiver: Int32; let rssi: Int32; let report: Int32 }

    let count: Int
    /// Per lane, in the order the medium decided them.
    private var lanes: [[Handoff]]
    /// The reports of this batch (without their RSSI) and when each was decided
    /// (`Date.timeIntervalSinceReferenceDate`, so that the clock in a lane is the same Date).
    private var reports: [ScanReport] = []
    private var times: [Double] = []
    private(set) var pending = 0
    /// Receiving transports by node, held strongly until `finish()`.
    private var targets: [SimTransport?] = []
    private let worker: LaneWorker?
    /// Each lane's clock, read through thread-local storage by `LaneClock`.
    private let clocks: UnsafeMutablePointer<Double>
    /// Below this many reports a batch is drained on the calling thread (waking the other
    /// thread costs more than it saves). Tests set 1, so that small plans use every lane.
    nonisolated(unsafe) static var smallBatch = 48
    /// A batch is drained once it holds this many reports, wherever it is (memory stays bounded).
    static let largeBatch = 1 << 15

    init(lanes: Int) {
        count = max(1, lanes)
        self.lanes = [[Handoff]](repeating: [], count: count)
        clocks = .allocate(capacity: count)
        clocks.initialize(repeating: 0, count: count)
        worker = count > 1 ? LaneWorker(lanes: count - 1) : nil
        for k in 0..<count { self.lanes[k].reserveCapacity(1024) }
    }

    deinit { clocks.deallocate() }

    func setTarget(_ transport: SimTransport, node: Int) {
        while targets.count <= node { targets.append(nil) }
        targets[node] = transport
    }

    /// Adds a report of this batch, decided now; returns its number.
    @inline(__always) func add(_ report: ScanReport, at now: Date) -> Int32 {
        reports.append(report)
        times.append(now.timeIntervalSinceReferenceDate)
        return Int32(reports.count - 1)
    }

    @inline(__always) func handoff(_ report: Int32, rssi: Int, to node: Int) {
        lanes[node % count].append(Handoff(receiver: Int32(node), rssi: Int32(truncatingIfNeeded: rssi), report: report))
        pending += 1
    }

    /// Hands every queued report over, lanes in parallel, and returns when all are handled.
    func drain() {
        guard pending > 0 else { return }
        if let worker, pending >= Self.smallBatch {
            worker.run { lane in self.run(lane + 1) }
            run(0)
            worker.wait()
        } else {
            for k in 0..<count { run(k) }
        }
        for k in 0..<count { lanes[k].removeAll(keepingCapacity: true) }
        reports.removeAll(keepingCapacity: true)
        times.removeAll(keepingCapacity: true)
        pending = 0
    }

    private func run(_ lane: Int) {
        let clock = clocks + lane
        let outer = pthread_getspecific(LaneClock.key)
        pthread_setspecific(LaneClock.key, clock)
        defer { pthread_setspecific(LaneClock.key, outer) }
        lanes[lane].withUnsafeBufferPointer { handoffs in
            var current: Int32 = -1
            var report = ScanReport(address: RadioAddress(""), rssi: 0)
            for h in handoffs {
                if h.report != current {
                    current = h.report
                    report = reports[Int(current)]
                    clock.pointee = times[Int(current)]
                }
                report.rssi = Int(h.rssi)
                targets[Int(h.receiver)]?.deliver(report)
            }
        }
    }

    /// Drops the transports and stops the thread (the lanes are empty).
    func finish() {
        drain()
        targets.removeAll()
        worker?.stop()
    }

    /// Whether the calling thread is handing reports over.
    static var inLane: Bool { pthread_getspecific(LaneClock.key) != nil }

    static func refuse(_ what: String) -> Never {
        preconditionFailure("a node \(what) while handling a scan report: in `simulate` reports are handed over in parallel lanes, so handling one may touch only the receiving node's own state (RadioSim/DeliveryLanes.swift)")
    }
}

/// The clock nodes see on a medium with lanes: the scheduler's, except on a lane's thread
/// while it hands reports over, where it is the time the report being handled was decided.
/// Everything scheduled through it first has pending reports handed over.
final class LaneClock: Scheduler {
    nonisolated(unsafe) static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "no thread-local storage key left")
        return key
    }()

    let base: any Scheduler
    weak var medium: SimMedium?

    init(base: any Scheduler) { self.base = base }

    var now: Date {
        if let slot = pthread_getspecific(Self.key) {
            return Date(timeIntervalSinceReferenceDate: slot.assumingMemoryBound(to: Double.self).pointee)
        }
        return base.now
    }

    @discardableResult
    func schedule(after delay: TimeInterval, _ action: @escaping () -> Void) -> ScheduledTask {
        if DeliveryLanes.inLane { DeliveryLanes.refuse("scheduled work") }
        return base.schedule(after: delay) { [weak medium] in
            medium?.flushDeliveries()
            action()
        }
    }
}

/// Threads that run one lane each per batch, woken by a semaphore.
final class LaneWorker: @unchecked Sendable {
    private let go: [DispatchSemaphore]
    private let done = DispatchSemaphore(value: 0)
    private var job: ((Int) -> Void)?
    private var stopping = false
    private let threads: Int

    init(lanes: Int) {
        threads = lanes
        go = (0..<lanes).map { _ in DispatchSemaphore(value: 0) }
        for k in 0..<lanes {
            let thread = Thread { [self] in
                while true {
                    go[k].wait()
                    if stopping { break }
                    job?(k)
                    done.signal()
                }
                done.signal()
            }
            thread.name = "lane \(k + 1)"
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
