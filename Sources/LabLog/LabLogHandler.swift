import Foundation
import HeraldCore
import Logging

/// The services' log handler (coordinator, agent, air): one line per event, written whole,
///
///     2026-11-27T01:40:12.345Z info herald-lab.coordinator: run started node=n1 run=r7
///
/// timestamp (UTC, milliseconds), level, label, message, then metadata as key=value sorted by
/// key. Every piece of outside text (message, metadata keys and values) goes through
/// OutsideText, so a peer's text can never add a line or act on a terminal: messages through
/// `OutsideText.line`; a metadata value with a space, `"` or `=` in it, or an empty one, is
/// shown quoted with `OutsideText.escaped(quotes: true)`.
/// A node's log.txt (the bundle format) never goes through here.
public struct LabLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let sink: @Sendable (String) -> Void
    private let now: @Sendable () -> Date

    /// `sink` gets each line without its newline (default: stderr, one write per line).
    public init(label: String, level: Logger.Level = .info,
                now: @escaping @Sendable () -> Date = { Date() },
                sink: @escaping @Sendable (String) -> Void = LabLogHandler.stderr) {
        self.label = label
        self.logLevel = level
        self.now = now
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let explicit = event.metadata { all.merge(explicit) { _, new in new } }
        if let error = event.error { all["error"] = .string("\(error)") }
        sink(Self.format(date: now(), level: event.level, label: label, message: event.message.description, metadata: all))
    }

    /// One event as its log line (no newline).
    public static func format(date: Date, level: Logger.Level, label: String, message: String,
                              metadata: Logger.Metadata) -> String {
        var out = timestamp(date) + " " + level.rawValue + " " + OutsideText.line(label) + ": " + OutsideText.line(message)
        for key in metadata.keys.sorted() {
            out += " " + OutsideText.escaped(key) + "=" + value(metadata[key]!)
        }
        return out
    }

    /// A metadata value as shown after `key=`.
    static func value(_ v: Logger.Metadata.Value) -> String {
        let text: String
        switch v {
        case .string(let s): text = s
        case .stringConvertible(let c): text = c.description
        case .array(let a): text = "[" + a.map { value($0) }.joined(separator: ",") + "]"
        case .dictionary(let d): text = "{" + d.keys.sorted().map { "\($0):" + value(d[$0]!) }.joined(separator: ",") + "}"
        }
        if text.isEmpty || text.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" }) {
            return "\"" + OutsideText.escaped(text, quotes: true) + "\""
        }
        return OutsideText.escaped(text)
    }

    static func timestamp(_ date: Date) -> String {
        let ms = Saturating.int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        var t = time_t(ms / 1000)
        var tm = tm()
        gmtime_r(&t, &tm)
        func pad(_ v: Int32, _ w: Int) -> String { let s = String(v); return String(repeating: "0", count: max(0, w - s.count)) + s }
        return pad(tm.tm_year + 1900, 4) + "-" + pad(tm.tm_mon + 1, 2) + "-" + pad(tm.tm_mday, 2) + "T"
            + pad(tm.tm_hour, 2) + ":" + pad(tm.tm_min, 2) + ":" + pad(tm.tm_sec, 2) + "."
            + pad(Int32(ms % 1000), 3) + "Z"
    }

    /// Writes `line` and a newline to stderr in one call (lines from threads never interleave).
    public static let stderr: @Sendable (String) -> Void = { line in
        let bytes = Array((line + "\n").utf8)
        bytes.withUnsafeBufferPointer { b in
            var done = 0
            while done < b.count {
                let n = write(2, b.baseAddress! + done, b.count - done)
                if n < 0 { if errno == EINTR { continue }; return }
                done += n
            }
        }
    }
}

/// `--log-level`: trace, debug, info, notice, warning, error or critical.
public enum LabLogLevel {
    public static let names = Logger.Level.allCases.map(\.rawValue)

    /// The level named `text`, or an error naming the flag and the allowed values.
    public static func parse(_ text: String) throws -> Logger.Level {
        guard let level = Logger.Level(rawValue: text) else {
            throw LabLogLevelError(text: text)
        }
        return level
    }
}

public struct LabLogLevelError: Error, CustomStringConvertible {
    public let text: String
    public var description: String {
        "--log-level: '\(OutsideText.escaped(text))' is not a log level (one of \(LabLogLevel.names.joined(separator: "|")))"
    }
}
