import Foundation

/// Six random bytes advertised as manufacturer data 0x05F1, so that a scanner can recognise a
/// device whose MAC rotates and merge the new MAC into the device it already knows.
public struct PseudoDeviceAddress: Hashable, Sendable, CustomStringConvertible {
    /// The six bytes, the first in the lowest byte (an integer: a scanner parses one per
    /// advert, compares and hashes it, and none of that allocates).
    private let packed: UInt64

    public var bytes: [UInt8] { (0..<6).map { UInt8(truncatingIfNeeded: packed >> UInt64(8 * $0)) } }

    /// Android takes a random Int64 and keeps its little-endian bytes 2..7.
    public init<G: RandomNumberGenerator>(using generator: inout G) {
        let value = Int64(bitPattern: generator.next())
        var data = Data()
        data.appendLittleEndian(value)
        self.init(bytes: Array(data[2..<8]))!
    }

    /// Exactly six bytes; nil otherwise.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 6 else { return nil }
        var v: UInt64 = 0
        for (k, b) in bytes.enumerated() { v |= UInt64(b) << UInt64(8 * k) }
        packed = v
    }

    /// Exactly six bytes; nil otherwise.
    public init?(data: Data) {
        guard data.count == 6 else { return nil }
        packed = data.withUnsafeBytes { raw in
            var v: UInt64 = 0
            for k in 0..<6 { v |= UInt64(raw[k]) << UInt64(8 * k) }
            return v
        }
    }

    public var data: Data { Data(bytes) }
    public var description: String { data.hexEncodedString }
}

/// What a scanner learns from one advert's manufacturer data.
public struct HeraldManufacturerData: Sendable, Equatable {
    public var pseudoDeviceAddress: PseudoDeviceAddress?
    public var hasAppleData: Bool

    public init(pseudoDeviceAddress: PseudoDeviceAddress? = nil, hasAppleData: Bool = false) {
        self.pseudoDeviceAddress = pseudoDeviceAddress
        self.hasAppleData = hasAppleData
    }

    /// Parses manufacturer data as BlueZ reports it (company id -> bytes after the id).
    /// 0x05F1 wins over legacy 0xFFFA. Android's rule applies: exactly 6 bytes after the id;
    /// anything else is not a pseudo address (never a crash).
    public static func parse(_ manufacturerData: [UInt16: Data]) -> HeraldManufacturerData {
        // One walk over the (one or two) entries instead of three hashed lookups.
        var herald: Data?, legacy: Data?, apple = false
        for (id, d) in manufacturerData {
            switch id {
            case ManufacturerID.herald: herald = d
            case ManufacturerID.heraldLegacy: legacy = d
            case ManufacturerID.apple: apple = true
            default: break
            }
        }
        var result = HeraldManufacturerData()
        result.pseudoDeviceAddress = herald.flatMap { PseudoDeviceAddress(data: $0) } ?? legacy.flatMap { PseudoDeviceAddress(data: $0) }
        result.hasAppleData = apple
        return result
    }

    /// Manufacturer data to advertise for a pseudo address: 0x05F1 -> 6 bytes.
    public static func advertised(_ address: PseudoDeviceAddress) -> [UInt16: Data] {
        [ManufacturerID.herald: address.data]
    }
}

/// Parses raw advertising data (length-type-value AD structures) into manufacturer data and
/// service UUIDs, for transports that see raw PDUs. Malformed structures are rejected with a reason.
public enum AdvertisingData {
    public struct Parsed: Sendable, Equatable {
        public var manufacturerData: [UInt16: Data] = [:]
        public var serviceUUIDs: [BluetoothUUID] = []
        public var txPower: Int?
    }

    public static func parse(_ raw: Data) -> Result<Parsed, CodecError> {
        var parsed = Parsed()
        var i = raw.startIndex
        while i < raw.endIndex {
            let length = Int(raw[i])
            if length == 0 { break }
            guard i + 1 + length <= raw.endIndex else {
                return .failure(.truncated("AD structure at \(i - raw.startIndex) claims \(length) bytes, \(raw.endIndex - i - 1) left"))
            }
            let type = raw[i + 1]
            let value = raw[(i + 2)..<(i + 1 + length)]
            switch type {
            case 0xFF:
                guard value.count >= 2 else { return .failure(.invalidLength("manufacturer data of \(value.count) bytes has no company id")) }
                let id = UInt16(value[value.startIndex]) | UInt16(value[value.startIndex + 1]) << 8
                parsed.manufacturerData[id] = Data(value.dropFirst(2))
            case 0x02, 0x03:
                guard value.count % 2 == 0 else { return .failure(.invalidLength("16-bit UUID list of \(value.count) bytes")) }
                var j = value.startIndex
                while j < value.endIndex {
                    parsed.serviceUUIDs.append(BluetoothUUID(UInt16(value[j]) | UInt16(value[j + 1]) << 8))
                    j += 2
                }
            case 0x06, 0x07:
                guard value.count % 16 == 0 else { return .failure(.invalidLength("128-bit UUID list of \(value.count) bytes")) }
                var j = value.startIndex
                while j < value.endIndex {
                    let b = Array(value[j..<(j + 16)].reversed())
                    let u = UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
                    parsed.serviceUUIDs.append(BluetoothUUID(u.uuidString)!)
                    j += 16
                }
            case 0x0A:
                guard value.count == 1 else { return .failure(.invalidLength("TX power level of \(value.count) bytes")) }
                parsed.txPower = Int(Int8(bitPattern: value[value.startIndex]))
            default:
                break
            }
            i += 1 + length
        }
        return .success(parsed)
    }
}
