import Foundation

/// A Bluetooth UUID held in its canonical 128-bit, upper-case text form. 16-bit UUIDs are
/// expanded with the Bluetooth base UUID so that `0xFCF6` and its long form compare equal.
public struct BluetoothUUID: Hashable, Sendable, Codable, CustomStringConvertible {
    public let uuidString: String

    public init(_ short: UInt16) {
        uuidString = String(format: "0000%04X-0000-1000-8000-00805F9B34FB", short)
    }

    private init(canonical: String) { uuidString = canonical }

    /// Accepts 4-hex-digit, 8-hex-digit and full 36-character forms, any case.
    public init?(_ text: String) {
        let t = text.uppercased()
        if t.count == 4, let v = UInt16(t, radix: 16) { self.init(v); return }
        if t.count == 8, UInt32(t, radix: 16) != nil { self.init(canonical: t + "-0000-1000-8000-00805F9B34FB"); return }
        guard let uuid = UUID(uuidString: t) else { return nil }
        self.init(canonical: uuid.uuidString)
    }

    /// The 16-bit form, when this is a Bluetooth base UUID.
    public var shortValue: UInt16? {
        guard uuidString.hasPrefix("0000"), uuidString.hasSuffix("-0000-1000-8000-00805F9B34FB") else { return nil }
        return UInt16(uuidString.dropFirst(4).prefix(4), radix: 16)
    }

    /// Lower-case text, as BlueZ writes UUIDs.
    public var lowercased: String { uuidString.lowercased() }
    public var description: String { uuidString }

    public init(from decoder: Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let uuid = BluetoothUUID(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a UUID: \(text)"))
        }
        self = uuid
    }
    public func encode(to encoder: Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(uuidString)
    }
}

/// Herald's identifiers on air (PROTOCOL.md).
public enum HeraldUUIDs {
    /// Herald service, advertised and served.
    public static let service = BluetoothUUID(0xFCF6)
    /// Legacy Herald service: detected, never advertised.
    public static let legacyService = BluetoothUUID("428132af-4746-42d3-801e-4572d65bfd9b")!
    /// Payload characteristic (read).
    public static let payloadCharacteristic = BluetoothUUID("3e98c0f8-8f05-4829-a121-43e38f8933e7")!
    /// Android-style signal characteristic (write with response): what a Linux node serves.
    public static let androidSignalCharacteristic = BluetoothUUID("f617b813-092e-437a-8324-e09a80821a11")!
    /// iOS-style signal characteristic (write + notify).
    public static let iosSignalCharacteristic = BluetoothUUID("0eb0d5f2-eae4-4a9a-8af3-a4adb02d4363")!
}

/// Bluetooth SIG company identifiers Herald uses in manufacturer data.
public enum ManufacturerID {
    /// Herald pseudo device address.
    public static let herald: UInt16 = 0x05F1
    /// Legacy pseudo device address id, still parsed.
    public static let heraldLegacy: UInt16 = 0xFFFA
    /// Apple.
    public static let apple: UInt16 = 0x004C
}
