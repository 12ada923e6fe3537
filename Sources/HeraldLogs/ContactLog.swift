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
    /// RSSI text by whole dBm (-256 ..< 256), with the proximity it was made from, so measures
    /// do not format doubles again and again (other values are formatted each time).
    private var proximityText = [(Proximity, [UInt8])?](repeating: nil, count: 512)
    /// `,` then the event digit in its column of the seven event columns, then `,`s: per event.
    private static let eventColumns: [[UInt8]] = (0...7).map { event in
        var out: [UInt8] = [44]
        for column in 1...7 {
            if column == event { out.append(UInt8(48 + event)) }
            out.append(44)
        }
        return out
    }

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
    @inline(__always) private func row(_ sensor: SensorType, _ id: String, event: Int, data: (inout ByteBuffer) -> Void) {
        let now = scheduler.now
        file.appendLine { out in
            timestamps.append(now, to: &out)
            out.append(44)
            if sensor == .BLE { out.append(66); out.append(76); out.append(69) } else { Bytes.appendRaw(sensor.rawValue, to: &out) }
            out.append(44)
            Bytes.appendCSV(id, to: &out)
            Self.eventColumns[event].withUnsafeBufferPointer { out.append($0) }
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
        let v = didMeasure.value
        guard v >= -256, v < 256, v == v.rounded(.down) else {
            let text = didMeasure.description
            row(sensor, fromTarget.value, event: 3) { Bytes.appendRaw(text, to: &$0) }
            return
        }
        let k = Int(v) + 256
        if !Self.same(proximityText[k]?.0, didMeasure) { proximityText[k] = (didMeasure, Array(didMeasure.description.utf8)) }
        row(sensor, fromTarget.value, event: 3) { out in proximityText[k]!.1.withUnsafeBufferPointer { out.append($0) } }
    }

    /// Whether two proximities print the same (bit for bit: -0.0 is not 0.0 here).
    @inline(__always) private static func same(_ a: Proximity?, _ b: Proximity) -> Bool {
        guard let a, a.unit == b.unit, a.value.bitPattern == b.value.bitPattern else { return false }
        switch (a.calibration, b.calibration) {
        case (nil, nil): return true
        case let (x?, y?): return x.unit == y.unit && x.value.bitPattern == y.value.bitPattern
        default: return false
        }
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
