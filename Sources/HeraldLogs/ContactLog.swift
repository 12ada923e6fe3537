import Foundation
import HeraldCore
import HeraldRadio

/// contacts.csv: one row per sensor event, in the current 11-column format (LOGS.md):
/// `time,sensor,id,detect,read,measure,share,visit,detectHerald,delete,data`.
/// didMeasure(withPayload) is not a row of its own (as in the reference apps).
public final class ContactLog: SensorDelegate {
    public static let header = "time,sensor,id,detect,read,measure,share,visit,detectHerald,delete,data"
    private let file: LogFile
    private let scheduler: any Scheduler
    private var timestamps = TimestampWriter()
    /// Last RSSI text per value, so measures do not format doubles again and again.
    private var proximityText: [Proximity: [UInt8]] = [:]

    public init(url: URL, scheduler: any Scheduler, flushInterval: TimeInterval? = 2) {
        self.scheduler = scheduler
        file = LogFile(url: url, scheduler: scheduler, flushInterval: flushInterval)
        if file.wasEmpty { file.append(Self.header + "\n") }
    }

    public func flush() { file.flush() }
    /// The file's last write failure, if any.
    public var writeError: String? { file.writeError }
    public func close() { file.close() }

    /// Writes `time,sensor,id,` then the event number in column `event` (1...7) and `data`.
    @inline(__always) private func row(_ sensor: SensorType, _ id: String, event: Int, data: (inout [UInt8]) -> Void) {
        let now = scheduler.now
        file.appendLine { out in
            timestamps.append(now, to: &out)
            out.append(44)
            Bytes.appendRaw(sensor.rawValue, to: &out)
            out.append(44)
            Bytes.appendCSV(id, to: &out)
            out.append(44)
            for column in 1...7 {
                if column == event { out.append(UInt8(48 + event)) }
                out.append(44)
            }
            data(&out)
        }
    }

    public func sensor(_ sensor: SensorType, didDetect: TargetIdentifier) {
        row(sensor, didDetect.value, event: 1) { _ in }
    }

    public func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) {
        let name = didRead.shortName
        row(sensor, fromTarget.value, event: 2) { Bytes.appendCSV(name, to: &$0) }
    }

    public func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier) {
        let text: [UInt8]
        if let cached = proximityText[didMeasure] { text = cached } else {
            text = Array(didMeasure.description.utf8)
            if proximityText.count < 4096 { proximityText[didMeasure] = text }
        }
        row(sensor, fromTarget.value, event: 3) { $0.append(contentsOf: text) }
    }

    public func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) {
        for p in didShare {
            let name = p.shortName
            row(sensor, fromTarget.value, event: 4) { Bytes.appendCSV(name, to: &$0) }
        }
    }

    public func sensor(_ sensor: SensorType, didVisit: Location?) {
        let text = didVisit?.description ?? ""
        row(sensor, "", event: 5) { Bytes.appendCSV(text, to: &$0) }
    }

    public func sensor(_ sensor: SensorType, available: Bool, didDeleteOrDetect: TargetIdentifier) {
        row(sensor, didDeleteOrDetect.value, event: available ? 6 : 7) { _ in }
    }
}
