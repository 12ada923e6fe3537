import Foundation

/// The sensor that produced an event, as logged in the `sensor` column of contacts.csv.
public enum SensorType: String, Sendable, CaseIterable {
    case BLE, AWARE, BEACON, GPS, ACCELEROMETER, ARRAY, OTHER
}

/// Sensor and sensor-array state, reported through didUpdateState.
public enum SensorState: String, Sendable {
    case on, off, unavailable
}

/// Who a detection is about: a MAC on Android and Linux, a peripheral UUID on iOS, a generated
/// UUID for devices known only through payload sharing.
public struct TargetIdentifier: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let value: String
    public init(_ value: String) { self.value = value }
    public init(stringLiteral value: String) { self.value = value }
    /// A fresh random identifier for a device known only through sharing.
    public init<G: RandomNumberGenerator>(randomUsing generator: inout G) {
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<16 { bytes[i] = UInt8.random(in: .min ... .max, using: &generator) }
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                               bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
        self.value = uuid.uuidString
    }
    public var description: String { value }
}

/// A measurement of proximity: RSSI in dBm, with the advertised TX power as calibration when known.
public struct Proximity: Hashable, Sendable, CustomStringConvertible {
    public enum Unit: String, Sendable { case RSSI }
    public enum CalibrationUnit: String, Sendable { case BLETransmitPower }
    public struct Calibration: Hashable, Sendable {
        public let unit: CalibrationUnit
        public let value: Double
        public init(unit: CalibrationUnit, value: Double) { self.unit = unit; self.value = value }
    }

    public let unit: Unit
    public let value: Double
    public let calibration: Calibration?

    public init(unit: Unit = .RSSI, value: Double, calibration: Calibration? = nil) {
        self.unit = unit
        self.value = value
        self.calibration = calibration
    }

    public static func rssi(_ rssi: Int, txPower: Int? = nil) -> Proximity {
        Proximity(value: Double(rssi), calibration: txPower.map { Calibration(unit: .BLETransmitPower, value: Double($0)) })
    }

    /// `RSSI:-47.0` or `RSSI:-42.0[BLETransmitPower:12.0]`, exactly as the reference apps log it.
    public var description: String {
        var text = "\(unit.rawValue):\(value)"
        if let c = calibration { text += "[\(c.unit.rawValue):\(c.value)]" }
        return text
    }
}

/// A visited location (didVisit); HeraldLab nodes do not produce these but the logger records them.
public struct Location: Hashable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
