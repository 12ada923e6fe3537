import Foundation
import HeraldRadio

/// Where a node's power comes from.
public protocol PowerSource: AnyObject {
    /// (`battery` or `external`, level 0-100).
    func read() -> (source: String, level: Double)
}

/// A mains-powered node: `external,100.0`.
public final class MainsPower: PowerSource {
    public init() {}
    public func read() -> (source: String, level: Double) { ("external", 100) }
}

/// Reads /sys/class/power_supply: a battery with a capacity gives `battery,<capacity>`
/// (or `external` while it charges or is full on mains), anything else `external,100.0`.
public final class SysfsPowerSupply: PowerSource {
    public let root: URL
    public init(root: URL = URL(fileURLWithPath: "/sys/class/power_supply")) { self.root = root }

    public func read() -> (source: String, level: Double) {
        let fm = FileManager.default
        guard let entries = try? fm.contentsOfDirectory(atPath: root.path) else { return ("external", 100) }
        for e in entries.sorted() {
            let dir = root.appendingPathComponent(e)
            func value(_ name: String) -> String? {
                (try? String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            guard value("type") == "Battery", let cap = value("capacity").flatMap(Double.init) else { continue }
            let status = value("status") ?? ""
            return (status == "Charging" || status == "Full" ? "external" : "battery", min(100, max(0, cap)))
        }
        return ("external", 100)
    }
}

/// battery.csv: `time,source,level`, a row every 30 s of scheduler time and whenever the source
/// or level changes (checked every `pollInterval`).
public final class BatteryLog {
    public static let header = "time,source,level"
    private let file: LogFile
    private let scheduler: any Scheduler
    private let power: any PowerSource
    private var last: (source: String, level: Double)?
    private var lastRowAt: Date?
    private let rowInterval: TimeInterval
    private var task: ScheduledTask?
    private var timestamps = TimestampWriter()

    public init(url: URL, scheduler: any Scheduler, power: any PowerSource = MainsPower(), rowInterval: TimeInterval = 30, pollInterval: TimeInterval = 5,
                flushInterval: TimeInterval? = 2) {
        self.scheduler = scheduler
        self.power = power
        self.rowInterval = rowInterval
        file = LogFile(url: url, scheduler: scheduler, flushInterval: flushInterval)
        if file.wasEmpty { file.append(Self.header + "\n") }
        sample()
        task = scheduler.scheduleRepeating(every: pollInterval) { [weak self] in self?.sample() }
    }

    private func sample() {
        let now = scheduler.now
        let reading = power.read()
        let changed = last.map { $0.source != reading.source || $0.level != reading.level } ?? true
        let due = lastRowAt.map { now.timeIntervalSince($0) >= rowInterval - 1e-9 } ?? true
        guard changed || due else { return }
        last = reading
        lastRowAt = now
        file.appendLine { out in
            timestamps.append(now, to: &out)
            Bytes.appendRaw(",\(reading.source),\(reading.level)", to: &out)
        }
    }

    public func flush() { file.flush() }
    /// The file's last write failure, if any.
    public var writeError: String? { file.writeError }
    public func close() {
        task?.cancel()
        file.close()
    }
}
