import Foundation
import Synchronization
import HeraldCore
import Logging

/// The coordinator's log lines of each run (those with metadata `run`), kept in memory for the
/// run's dashboard page: the last `perRun` lines of the last `maxRuns` runs. The service's own
/// log is unchanged (`RunLogTee` passes every event on); a restart forgets these, as it forgets
/// the sessions.
final class RunEvents: Sendable {
    struct Event: Codable, Equatable, Sendable {
        /// Coordinator clock.
        var at: Double
        var level: String
        /// The message with its other metadata as `key=value`, as one line of the log (escaped
        /// for a terminal by `OutsideText.line`; for a page it is text, never HTML).
        var text: String
    }

    static let perRun = 200
    static let maxRuns = 32

    /// Each run's lines, and when each run last had one, under one lock.
    private struct Kept {
        var events: [String: [Event]] = [:]
        var touched: [String: Double] = [:]
    }
    private let kept = Mutex(Kept())

    func record(run: String, _ e: Event) {
        kept.withLock { k in
            if k.events[run] == nil, k.events.count >= Self.maxRuns, let oldest = k.touched.min(by: { $0.value < $1.value })?.key {
                k.events[oldest] = nil
                k.touched[oldest] = nil
            }
            var list = k.events[run] ?? []
            list.append(e)
            if list.count > Self.perRun { list.removeFirst(list.count - Self.perRun) }
            k.events[run] = list
            k.touched[run] = e.at
        }
    }

    func of(_ run: String) -> [Event] { kept.withLock { $0.events[run] ?? [] } }
}

/// A log handler that passes every event to the service's logger and keeps those of a run (info
/// and above, metadata `run`) in `RunEvents`.
struct RunLogTee: LogHandler {
    let inner: Logger
    let events: RunEvents
    /// The coordinator's clock, stamping each kept line.
    let clock: any LabClock
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    /// The run's lines are kept from info up, whatever the service writes.
    var logLevel: Logger.Level {
        get { min(inner.logLevel, .info) }
        set { }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let explicit = event.metadata { all.merge(explicit) { _, new in new } }
        if inner.logLevel <= event.level {
            inner.log(level: event.level, event.message, error: event.error, metadata: all.isEmpty ? nil : all, source: event.source, file: event.file, function: event.function, line: event.line)
        }
        if let error = event.error { all["error"] = .string("\(error)") }
        guard event.level >= .info, case .string(let run)? = all["run"] else { return }
        var text = OutsideText.line(event.message.description)
        for key in all.keys.sorted() where key != "run" { text += " \(OutsideText.escaped(key))=\(OutsideText.line("\(all[key]!)"))" }
        events.record(run: run, RunEvents.Event(at: clock.now(), level: event.level.rawValue, text: String(text.prefix(2000))))
    }
}
