import Foundation
import LabLog
import Logging

/// The tests' log: `logger(label)` hands a service a `Logger` whose handler keeps every event
/// (level, message, metadata) with its line as LabLogHandler writes it (outside text escaped),
/// in place of stderr. `quiet` drops everything, for tests that do not look at the log.
public final class LogCapture: @unchecked Sendable {
    public struct Entry: Sendable {
        public let label: String
        public let level: Logger.Level
        /// The message as logged (before escaping).
        public let message: String
        /// Metadata values as text (the handler's and the call's, the call's winning).
        public let metadata: [String: String]
        /// The whole line as LabLogHandler writes it (fixed timestamp).
        public let line: String
    }

    private let lock = NSLock()
    private var entries: [Entry] = []

    public init() {}

    /// A logger for `label`, at `level`, whose events are kept here.
    public func logger(_ label: String, level: Logger.Level = .trace) -> Logger {
        Logger(label: label) { [self] label in Handler(label: label, logLevel: level, capture: self) }
    }

    /// A logger that writes nothing.
    public static func quiet(_ label: String = "test") -> Logger {
        Logger(label: label) { _ in SwiftLogNoOpLogHandler() }
    }

    public var all: [Entry] { lock.lock(); defer { lock.unlock() }; return entries }
    /// Every line so far, as the services' handler writes them.
    public var lines: [String] { all.map(\.line) }

    func add(_ e: Entry) { lock.lock(); entries.append(e); lock.unlock() }

    struct Handler: LogHandler {
        let label: String
        var logLevel: Logger.Level
        var metadata: Logger.Metadata = [:]
        let capture: LogCapture

        init(label: String, logLevel: Logger.Level, capture: LogCapture) {
            self.label = label
            self.logLevel = logLevel
            self.capture = capture
        }

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            var all = metadata
            if let explicit = event.metadata { all.merge(explicit) { _, new in new } }
            if let error = event.error { all["error"] = .string("\(error)") }
            let message = event.message.description
            let line = LabLogHandler.format(date: Date(timeIntervalSince1970: 0), level: event.level, label: label, message: message, metadata: all)
            capture.add(Entry(label: label, level: event.level, message: message,
                              metadata: all.mapValues { "\($0)" }, line: line))
        }
    }
}
