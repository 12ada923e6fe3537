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

/// Reads /sys/class/power_supply: the system's battery (`type` Battery, not `scope` Device: a
/// mouse's or headset's battery is not the node's) gives `battery,<capacity>`, or `external` while
/// mains or USB power is online or the battery charges, is full or is held (`Not charging`);
/// without a system battery, `external,100.0`. Capacity is `capacity`, else `energy_now` /
/// `energy_full` or `charge_now` / `charge_full`.
public final class SysfsPowerSupply: PowerSource {
    public let root: URL
    public init(root: URL = URL(fileURLWithPath: "/sys/class/power_supply")) { self.root = root }

    public func read() -> (source: String, level: Double) {
        let fm = FileManager.default
        guard let entries = try? fm.contentsOfDirectory(atPath: root.path) else { return ("external", 100) }
        var battery: (status: String, level: Double)?
        var mainsOnline = false
        for e in entries.sorted() {
            let dir = root.appendingPathComponent(e)
            func value(_ name: String) -> String? {
                (try? String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            func ratio(_ now: String, _ full: String) -> Double? {
                guard let n = value(now).flatMap(Double.init), let f = value(full).flatMap(Double.init), f > 0 else { return nil }
                return n / f * 100
            }
            switch value("type") {
            case "Battery":
                guard battery == nil, value("scope") != "Device",
                      let level = value("capacity").flatMap(Double.init) ?? ratio("energy_now", "energy_full") ?? ratio("charge_now", "charge_full"),
                      level.isFinite else { continue }
                battery = (value("status") ?? "", min(100, max(0, level)))
            case "Mains", "USB", "USB_C", "USB_PD":
                if value("online") == "1", value("scope") != "Device" { mainsOnline = true }
            default: continue
            }
        }
        guard let battery else { return ("external", 100) }
        let external = mainsOnline || ["Charging", "Full", "Not charging"].contains(battery.status)
        return (external ? "external" : "battery", battery.level)
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
