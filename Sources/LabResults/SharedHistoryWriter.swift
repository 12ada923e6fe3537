import Foundation
import HeraldAnalysis
import Logging

/// A coordinator's writer to the shared store (issue 41): each analysed run is queued durably
/// in the outbox before `record` returns (the run's end never waits for PostgreSQL), then sent
/// in the background; while the store cannot be reached the queue is retried every
/// `retryEvery` seconds (`run`), and on start.
public final class SharedHistoryWriter: Sendable {
    public let lab: String
    public let store: SharedResultsStore
    public let outbox: ResultsOutbox
    private let logger: Logger
    private let drainer: Drainer

    /// Serializes drains in this process; a kick during a drain asks for one more after it.
    private actor Drainer {
        var running = false
        var again = false
        func begin() -> Bool {
            if running { again = true; return false }
            running = true
            return true
        }
        func end() -> Bool {
            if again { again = false; return true }
            running = false
            return false
        }
    }

    public init(lab: String, store: SharedResultsStore, outbox: ResultsOutbox, logger: Logger) throws {
        guard !lab.isEmpty, lab.count <= SharedRun.maximumLabName, !lab.utf8.contains(0) else {
            throw ResultsStoreError.refused("lab: a name of 1 to \(SharedRun.maximumLabName) characters without NUL (--lab NAME)")
        }
        self.lab = lab
        self.store = store
        self.outbox = outbox
        self.logger = logger
        drainer = Drainer()
    }

    /// Queues `r` (its bundle at `bundle`) durably and starts sending it. Throws only when it
    /// cannot be queued.
    public func record(_ r: AnalysisResult, bundle: URL, at date: Date = Date()) throws {
        try outbox.enqueue(try SharedRun(r, lab: lab, bundleURL: bundle.path, at: date))
        kick()
    }

    /// Queues `study` (its `lab` set to this writer's) durably and starts sending it. Throws only
    /// when it cannot be queued.
    public func record(_ study: SharedStudy) throws {
        var entry = study
        entry.lab = lab
        try outbox.enqueue(entry)
        kick()
    }

    /// Sends what is queued, in the background.
    public func kick() {
        Task { await self.drain() }
    }

    /// Sends what is queued now; returns what the last pass did.
    @discardableResult
    public func drain() async -> ResultsOutbox.Drained {
        guard await drainer.begin() else { return ResultsOutbox.Drained(left: (try? outbox.pending().count) ?? 0) }
        var d: ResultsOutbox.Drained
        repeat {
            d = await outbox.drain(into: store, logger: logger)
            if d.sent > 0 { logger.info("shared history \(store.location): \(d.sent) run\(d.sent == 1 ? "" : "s") stored") }
            if let f = d.failure { logger.warning("shared history \(store.location): \(d.left) run\(d.left == 1 ? "" : "s") kept in \(outbox.directory.path) until it can be reached (\(f))") }
        } while await drainer.end()
        return d
    }

    /// Retries the queue every `retryEvery` seconds until cancelled.
    public func run(retryEvery: Double = 60) async {
        while !Task.isCancelled {
            // An outbox that cannot be listed is said, and drained anyway (the drain reports
            // what it cannot do): read as empty it would leave queued runs unsent for good.
            do {
                if try outbox.pending().count > 0 { await drain() }
            } catch {
                logger.error("shared history: cannot list the outbox \(outbox.directory.path): \(error)")
                await drain()
            }
            try? await Task.sleep(nanoseconds: UInt64(max(1, retryEvery) * 1e9))
        }
    }
}
