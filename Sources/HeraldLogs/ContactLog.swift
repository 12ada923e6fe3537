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
    @exclusivity(unchecked) private var timestamps = TimestampWriter()
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
        let v = didMeasure.value, c = didMeasure.calibration
        // Whole numbers (as every RSSI and TX power is) are written digit by digit, exactly as
        // `description` prints them (`RSSI:-47.0[BLETransmitPower:12.0]`); anything else by it.
        guard Self.isSmallWhole(v), c.map({ Self.isSmallWhole($0.value) }) ?? true else {
            let text = didMeasure.description
            row(sensor, fromTarget.value, event: 3) { Bytes.appendRaw(text, to: &$0) }
            return
        }
        row(sensor, fromTarget.value, event: 3) { out in
            Bytes.appendRaw(didMeasure.unit.rawValue, to: &out)
            out.append(58) // :
            Self.appendWhole(v, to: &out)
            if let c {
                out.append(91) // [
                Bytes.appendRaw(c.unit.rawValue, to: &out)
                out.append(58)
                Self.appendWhole(c.value, to: &out)
                out.append(93) // ]
            }
        }
    }

    /// A whole number under 10,000 in size, not -0.0: `description` prints it as digits and `.0`.
    @inline(__always) static func isSmallWhole(_ v: Double) -> Bool {
        v == v.rounded(.towardZero) && abs(v) < 10_000 && !(v == 0 && v.sign == .minus)
    }

    @inline(__always) static func appendWhole(_ v: Double, to out: inout ByteBuffer) {
        var n = Int(v)
        if n < 0 { out.append(45); n = -n }
        if n >= 1000 { out.append(UInt8(48 + n / 1000)) }
        if n >= 100 { out.append(UInt8(48 + n / 100 % 10)) }
        if n >= 10 { out.append(UInt8(48 + n / 10 % 10)) }
        out.append(UInt8(48 + n % 10))
        out.append(46) // .
        out.append(48) // 0
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
