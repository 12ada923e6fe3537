import Foundation
import HeraldCore
import HeraldRadio

/// How a node's files reach the disk. The bytes at close are the same either way.
public enum LogWriting: Sendable, Equatable {
    /// A live node (agents, `herald-lab node`): appended files are flushed every 2 s of the
    /// scheduler's clock, detection.csv is rewritten on each change and statistics.csv every
    /// 30 s, synced to disk, so that the folder is seconds behind the sensor.
    case live
    /// A simulation in virtual time, whose files nobody reads before the run ends: appended
    /// files are written in 64 KiB blocks only, detection.csv and statistics.csv when opened
    /// and at close, none of them synced (a 100-node hour would otherwise flush the disk
    /// 12,000 times for statistics alone).
    case batch
}

/// The five Herald files of one node, in one folder: contacts.csv, detection.csv,
/// statistics.csv, battery.csv and log.txt. Add `delegates` to a sensor; `close()` flushes all.
public final class NodeLogs {
    public static let fileNames = ["contacts.csv", "detection.csv", "statistics.csv", "battery.csv", "log.txt"]

    public let directory: URL
    public let contacts: ContactLog
    public let detection: DetectionLog
    public let statistics: StatisticsLog
    public let battery: BatteryLog
    public let logger: SensorLogger

    public init(directory: URL, deviceName: String, os: String = "Linux", osVersion: String, ownShortName: String,
                scheduler: any Scheduler, logLevel: SensorLogger.Level = .info, power: any PowerSource = MainsPower(),
                writing: LogWriting = .live) {
        self.directory = directory
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let flushInterval: TimeInterval? = writing == .live ? 2 : nil
        contacts = ContactLog(url: directory.appendingPathComponent("contacts.csv"), scheduler: scheduler, flushInterval: flushInterval)
        detection = DetectionLog(url: directory.appendingPathComponent("detection.csv"), deviceName: deviceName, os: os, osVersion: osVersion,
                                 ownShortName: ownShortName, writing: writing)
        statistics = StatisticsLog(url: directory.appendingPathComponent("statistics.csv"), scheduler: scheduler, ownShortName: ownShortName, writing: writing)
        battery = BatteryLog(url: directory.appendingPathComponent("battery.csv"), scheduler: scheduler, power: power, flushInterval: flushInterval)
        logger = SensorLogger(url: directory.appendingPathComponent("log.txt"), scheduler: scheduler, minimumLevel: logLevel, flushInterval: flushInterval)
    }

    /// The loggers that listen to sensor events.
    public var delegates: [any SensorDelegate] { [contacts, detection, statistics] }

    public func flush() {
        contacts.flush()
        battery.flush()
        logger.flush()
        statistics.write()
        detection.flush()
    }

    /// The first file that could not be written, and why (disk full, ...), or nil.
    public var writeError: String? {
        contacts.writeError ?? logger.writeError ?? battery.writeError ?? statistics.writeError ?? detection.writeError
    }

    public func close() {
        contacts.close()
        detection.close()
        statistics.close()
        battery.close()
        logger.close()
    }
}
