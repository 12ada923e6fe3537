import Foundation
import HeraldCore
import HeraldRadio

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
                scheduler: any Scheduler, logLevel: SensorLogger.Level = .info, power: any PowerSource = MainsPower()) {
        self.directory = directory
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        contacts = ContactLog(url: directory.appendingPathComponent("contacts.csv"), scheduler: scheduler)
        detection = DetectionLog(url: directory.appendingPathComponent("detection.csv"), deviceName: deviceName, os: os, osVersion: osVersion, ownShortName: ownShortName)
        statistics = StatisticsLog(url: directory.appendingPathComponent("statistics.csv"), scheduler: scheduler, ownShortName: ownShortName)
        battery = BatteryLog(url: directory.appendingPathComponent("battery.csv"), scheduler: scheduler, power: power)
        logger = SensorLogger(url: directory.appendingPathComponent("log.txt"), scheduler: scheduler, minimumLevel: logLevel)
    }

    /// The loggers that listen to sensor events.
    public var delegates: [any SensorDelegate] { [contacts, detection, statistics] }

    public func flush() {
        contacts.flush()
        battery.flush()
        logger.flush()
        statistics.write()
    }

    /// The first file that could not be written, and why (disk full, ...), or nil.
    public var writeError: String? {
        contacts.writeError ?? logger.writeError ?? battery.writeError ?? statistics.writeError ?? detection.writeError
    }

    public func close() {
        contacts.close()
        statistics.close()
        battery.close()
        logger.close()
    }
}
