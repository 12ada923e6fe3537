import Foundation
import HeraldRadio

/// log.txt: `<timestamp>,<level>,<subsystem>,<category>,<message>`, levels debug < info < fault.
/// Double quotes in the message become `'`; a message containing `,` is wrapped in quotes.
/// Bounded: past `maximumBytes` only faults are written, after one line saying so (the node
/// folder must hold exactly Herald's files, so there is no rotation into other files).
public final class SensorLogger {
    public enum Level: Int, Comparable, Sendable {
        case debug = 0, info = 1, fault = 2
        public var name: String { ["debug", "info", "fault"][rawValue] }
        public init?(name: String) {
            switch name { case "debug": self = .debug; case "info": self = .info; case "fault": self = .fault; default: return nil }
        }
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
    }

    private let file: LogFile
    private let scheduler: any Scheduler
    public let minimumLevel: Level
    public let maximumBytes: Int64
    private var capped = false
    private var timestamps = TimestampWriter()

    public init(url: URL, scheduler: any Scheduler, minimumLevel: Level = .info, maximumBytes: Int64 = 50 * 1024 * 1024,
                flushInterval: TimeInterval? = 2) {
        self.scheduler = scheduler
        self.minimumLevel = minimumLevel
        self.maximumBytes = maximumBytes
        file = LogFile(url: url, scheduler: scheduler, flushInterval: flushInterval)
    }

    public func isEnabled(_ level: Level) -> Bool { level >= minimumLevel && (!capped || level == .fault) }

    public func log(_ level: Level, subsystem: String, category: String, _ message: String) {
        guard isEnabled(level) else { return }
        if !capped, file.size >= maximumBytes {
            capped = true
            write(.fault, "SensorLogger", "Log", "log.txt reached \(maximumBytes) bytes: only faults are written from now on")
            if level != .fault { return }
        }
        write(level, subsystem, category, message)
    }

    private func write(_ level: Level, _ subsystem: String, _ category: String, _ message: String) {
        let now = scheduler.now
        let text = message.replacingOccurrences(of: "\"", with: "'")
        file.appendLine { out in
            timestamps.append(now, to: &out)
            out.append(44)
            Bytes.appendRaw(level.name, to: &out)
            out.append(44)
            Bytes.appendRaw(subsystem, to: &out)
            out.append(44)
            Bytes.appendRaw(category, to: &out)
            out.append(44)
            if text.contains(",") {
                out.append(34); Bytes.appendRaw(text, to: &out); out.append(34)
            } else {
                Bytes.appendRaw(text, to: &out)
            }
        }
    }

    public func flush() { file.flush() }
    /// The file's last write failure, if any.
    public var writeError: String? { file.writeError }
    public func close() { file.close() }
}
