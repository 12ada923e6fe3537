import Foundation
import Synchronization
import HeraldCore
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// The coordinator's durable queue in front of the shared store (issue 41): every run's write
/// is first a file here, and leaves only once the store has committed it. PostgreSQL down, the
/// network gone or the coordinator killed mid-write: the run is on disk and lands, once, on a
/// later drain ((lab, run id) is unique in the store, so a write that landed but whose file was
/// not yet removed is a no-op when sent again).
///
/// Order of the disk operations: the JSON is written to a temporary name, fsynced, renamed to
/// its final name and the folder fsynced (Durable.write), so a crash leaves either no entry or a
/// whole one; an entry is unlinked, and the folder fsynced, only after the store's COMMIT.
public final class ResultsOutbox: Sendable {
    public let directory: URL
    /// Entries named by this process so far (part of each name, with the time and the pid).
    private let counter = Mutex<UInt64>(0)

    /// The usual place: `<results>/.history-outbox`.
    public static func beside(results: URL) -> URL { results.appendingPathComponent(".history-outbox", isDirectory: true) }

    public init(directory: URL) throws {
        self.directory = directory
        try Durable.refuseLink(directory)
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch { throw ResultsStoreError.outbox("cannot create \(directory.path): \(error.localizedDescription)") }
    }

    /// Queues `run` durably; returns its file. Names sort in the order they were queued.
    @discardableResult
    public func enqueue(_ run: SharedRun) throws -> URL {
        try run.validate()
        var entry = run
        entry.id = nil
        let data: Data
        do { data = try SharedRun.encoder().encode(entry) } catch { throw ResultsStoreError.outbox("cannot encode run \(run.runId.debugDescription): \(error)") }
        return try write(data, suffix: ".json")
    }

    /// Queues `study` durably (a `.study.json` entry, drained in order with the runs); returns its file.
    @discardableResult
    public func enqueue(_ study: SharedStudy) throws -> URL {
        try study.validate()
        var entry = study
        entry.id = nil
        let data: Data
        do { data = try SharedRun.encoder().encode(entry) } catch { throw ResultsStoreError.outbox("cannot encode study \(study.name.debugDescription): \(error)") }
        return try write(data, suffix: Self.studySuffix)
    }

    /// How a study's entry is named (a run's ends in `.json` alone).
    static let studySuffix = ".study.json"

    private func write(_ data: Data, suffix: String) throws -> URL {
        let name: String = counter.withLock { counter in
            counter += 1
            let now = UInt64(max(0, Date().timeIntervalSince1970 * 1_000_000))
            return String(format: "%016llx-%08x-%06llx", now, getpid(), counter) + suffix
        }
        let url = directory.appendingPathComponent(name)
        do { try Durable.write(data, to: url, mode: 0o600) } catch { throw ResultsStoreError.outbox("\(error)") }
        return url
    }

    /// The queued entries, oldest first.
    public func pending() throws -> [URL] {
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: directory.path) } catch {
            throw ResultsStoreError.outbox("cannot list \(directory.path): \(error.localizedDescription)")
        }
        return names.filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }.sorted().map { directory.appendingPathComponent($0) }
    }

    /// What a drain did: entries sent (stored now or found there already), left queued, and the
    /// store's failure that stopped it; entries that cannot be read are moved to `rejected/`.
    public struct Drained: Sendable, Equatable {
        public var sent = 0
        public var left = 0
        public var rejected = 0
        public var failure: String?
    }

    /// Sends the entries to `store`, oldest first, each removed only after its insert committed;
    /// stops at the first failure of the store (the rest stay queued, in order); a row the server
    /// refuses for its data is set aside in `rejected/` like an unreadable entry. One drain at a
    /// time per outbox folder, across processes (flock on `.lock`).
    public func drain(into store: SharedResultsStore, logger: Logger? = nil) async -> Drained {
        var result = Drained()
        let lockFD = open(directory.appendingPathComponent(".lock").path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lockFD >= 0 else {
            result.failure = "cannot open \(directory.path)/.lock"
            result.left = (try? pending().count) ?? 0
            return result
        }
        defer { close(lockFD) }
        // Another process draining: leave it to that one.
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            result.left = (try? pending().count) ?? 0
            return result
        }
        defer { flock(lockFD, LOCK_UN) }
        let entries: [URL]
        do { entries = try pending() } catch {
            result.failure = "\(error)"
            return result
        }
        for (k, url) in entries.enumerated() {
            let isStudy = url.lastPathComponent.hasSuffix(Self.studySuffix)
            let run: SharedRun?, study: SharedStudy?
            do {
                let data = try Data(contentsOf: url)
                if isStudy {
                    study = try SharedRun.decoder().decode(SharedStudy.self, from: data)
                    try study!.validate()
                    run = nil
                } else {
                    run = try SharedRun.decoder().decode(SharedRun.self, from: data)
                    try run!.validate()
                    study = nil
                }
            } catch {
                reject(url, because: "\(error)", logger: logger)
                result.rejected += 1
                continue
            }
            do {
                if let run { try await store.record(run) }
                if let study { try await store.record(study) }
            } catch ResultsStoreError.rowRefused(let why) {
                // Never storable as it is: set aside, the others go on.
                reject(url, because: why, logger: logger)
                result.rejected += 1
                continue
            } catch {
                result.failure = "\(error)"
                result.left = entries.count - k
                return result
            }
            // Only now: the store has committed it.
            if unlink(url.path) != 0 && errno != ENOENT {
                result.failure = "cannot remove \(url.path) after storing it (\(String(cString: strerror(errno))))"
                result.left = entries.count - k
                return result
            }
            // Harmless if it fails: a removal lost in a crash sends the entry again, which the
            // store takes once (UNIQUE (lab, run_id), ON CONFLICT DO NOTHING).
            try? Durable.syncDirectory(directory)
            result.sent += 1
        }
        return result
    }

    private func reject(_ url: URL, because why: String, logger: Logger?) {
        let dir = directory.appendingPathComponent("rejected", isDirectory: true)
        // A folder that cannot be made makes the rename below fail, which is handled there.
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let target = dir.appendingPathComponent(url.lastPathComponent)
        if rename(url.path, target.path) == 0 {
            // The note is a courtesy beside the kept entry; the entry itself is what is kept.
            try? Durable.write(Data("\(why)\n".utf8), to: target.appendingPathExtension("why"), mode: 0o600)
            try? Durable.syncDirectory(directory)
        }
        logger?.error("history outbox: \(url.lastPathComponent) cannot be read (\(why)); moved to \(dir.path)")
    }

    /// Queues `run` durably, then drains the outbox into `store`: the one way a coordinator writes
    /// to the shared store. Throws only when the run cannot be queued.
    @discardableResult
    public func record(_ run: SharedRun, into store: SharedResultsStore, logger: Logger? = nil) async throws -> Drained {
        try enqueue(run)
        return await drain(into: store, logger: logger)
    }
}
