import Foundation
import HeraldCore

/// detection.csv: one line, no header, rewritten whole (atomically) on each change:
/// `<deviceName>,<OS>,<OSVersion>,<ownShortName>,<seen1>,<seen2>,...`, seen names sorted,
/// self excluded; from didRead and didShare. With `.batch` writing a change is written at
/// `flush()` or `close()` instead (the same line, later).
public final class DetectionLog: SensorDelegate {
    public let url: URL
    private let writing: LogWriting
    private var dirty = false
    private let deviceName: String
    private let os: String
    private let osVersion: String
    private let ownShortName: String
    public private(set) var seen = Set<String>()

    public init(url: URL, deviceName: String, os: String = "Linux", osVersion: String, ownShortName: String, writing: LogWriting = .live) {
        self.url = url
        self.writing = writing
        self.deviceName = deviceName
        self.os = os
        self.osVersion = osVersion
        self.ownShortName = ownShortName
        // A node resumed after a restart keeps what it had seen: the names already in the file.
        if FileManager.default.fileExists(atPath: url.path) {
            do {
                let text = try String(contentsOf: url, encoding: .utf8)
                if let first = text.split(whereSeparator: \.isNewline).first {
                    for name in Self.fields(first).dropFirst(4) where !name.isEmpty && name != ownShortName { seen.insert(name) }
                }
            } catch {
                // Rewriting it would lose what the node had seen: keep it and say why.
                writeError = "detection.csv: cannot read what the node had seen before (\(error.localizedDescription)); left as it was"
                unreadable = true
                return
            }
        }
        write()
    }

    /// The fields of a line written by `line` (values wrapped in quotes when they hold a comma).
    static func fields(_ line: Substring) -> [String] {
        var out = [String](), current = "", quoted = false
        for c in line {
            if c == "\"" { quoted.toggle() } else if c == ",", !quoted { out.append(current); current = "" } else { current.append(c) }
        }
        out.append(current)
        return out
    }

    /// The last failure to write the file, if any.
    public private(set) var writeError: String?

    /// The line as written.
    public var line: String {
        var out = [UInt8]()
        for (i, v) in ([deviceName, os, osVersion, ownShortName] + seen.sorted()).enumerated() {
            if i > 0 { out.append(44) }
            Bytes.appendCSV(v, to: &out)
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The file held lines this logger could not read: it is never overwritten.
    private var unreadable = false

    private func write() {
        guard !unreadable else { return }
        writeError = AtomicFile.write(line + "\n", to: url, durable: writing == .live)
        dirty = writeError != nil
    }

    private func add(_ name: String) {
        guard !name.isEmpty, name != ownShortName, !seen.contains(name) else { return }
        seen.insert(name)
        if writing == .batch { dirty = true } else { write() }
    }

    /// Writes a change not yet written (`.batch`), or retries a failed write.
    public func flush() { if dirty { write() } }
    public func close() { flush() }

    public func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) { add(didRead.shortName) }
    public func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) {
        for p in didShare { add(p.shortName) }
    }
}
