import Foundation
import HeraldCore
import HeraldRadio

/// Which advertising reports the sensor processes at all, as Herald's Android receiver filters
/// its scan: only adverts with the Herald service (or the legacy one), Apple manufacturer data
/// (0x004C: iPhones in background carry the service only in Apple's overflow area), or a Herald
/// pseudo device address (0x05F1, exactly six bytes: only Herald devices advertise it). A legacy
/// 0xFFFA pseudo address is not enough on its own (the id was never registered); it only lets a
/// device already known by that address be followed. Everything else (headsets, beacons,
/// watches) never enters the device database, so it leaves no row in contacts.csv.
///
/// Apple data alone is not enough either: Apple devices advertise many kinds of messages, and
/// those that cannot come from an iPhone running Herald are refused, by the kind (first byte) and
/// leading bytes of each message in the Apple data, as Herald's Android device filter does
/// (its `deviceFilterFeaturePatterns`). A device already confirmed as iOS is never refused this way.
public struct AdvertFilter: Sendable, Equatable {
    /// Apple messages that mark a device that is not a Herald phone: hex digits matched from the
    /// start of a message (its type byte, length byte, data), `.` matching any digit.
    public var appleIgnorePatterns: [String]

    /// Herald's defaults: nearby-info messages with particular action codes, an overflow area
    /// with no service bit set, AirDrop, proximity pairing (AirPods), AirPlay, Handoff,
    /// tethering, Hey Siri, HomeKit, AirPrint, nearby action, magic switch and the like.
    public static let heraldAppleIgnorePatterns = [
        "10....04", "10....14", "0100000000000000000000000000000000",
        "05", "07", "09", "00", "1002", "06", "08", "03", "0C", "0D", "0F", "0E", "0B",
    ]

    public init(appleIgnorePatterns: [String] = AdvertFilter.heraldAppleIgnorePatterns) {
        self.appleIgnorePatterns = appleIgnorePatterns.map { $0.uppercased() }
    }

    /// What a report shows about Herald.
    public struct Signs: Equatable, Sendable {
        public var heraldService = false
        public var appleData = false
        /// A 0x05F1 pseudo address (six bytes).
        public var heraldPseudoAddress = false
        /// The pseudo address to follow (0x05F1, else legacy 0xFFFA), if any.
        public var pseudoAddress: PseudoDeviceAddress?
        /// Enough to process the report when the device is not known yet.
        public var admitsNewDevice: Bool { heraldService || appleData || heraldPseudoAddress }
        /// Apple data and nothing else that says Herald: the Apple messages decide.
        public var appleOnly: Bool { appleData && !heraldService && !heraldPseudoAddress }
    }

    public func signs(of report: ScanReport) -> Signs {
        var s = Signs()
        s.heraldService = report.serviceUUIDs.contains(HeraldUUIDs.service) || report.serviceUUIDs.contains(HeraldUUIDs.legacyService)
        if !report.manufacturerData.isEmpty {
            let m = HeraldManufacturerData.parse(report.manufacturerData)
            s.appleData = m.hasAppleData
            s.pseudoAddress = m.pseudoDeviceAddress
            s.heraldPseudoAddress = report.manufacturerData[ManufacturerID.herald].map { $0.count == 6 } ?? false
        }
        return s
    }

    /// The first ignore pattern that one of the messages in `appleData` (the bytes after the
    /// company id) matches, or nil.
    public func ignoredApplePattern(_ appleData: Data) -> String? {
        for message in Self.appleMessages(appleData) {
            let hex = message.hexEncodedString.uppercased()
            for pattern in appleIgnorePatterns where Self.matches(hex, pattern) { return pattern }
        }
        return nil
    }

    /// Splits Apple manufacturer data into messages: type, length, data; except type 0x01 (the
    /// overflow area of service UUIDs), which has no length and runs to the end. A length beyond
    /// the data is cut to what is there.
    public static func appleMessages(_ data: Data) -> [Data] {
        let bytes = [UInt8](data)
        var out = [Data]()
        var i = 0
        while i < bytes.count {
            if bytes[i] == 0x01 {
                out.append(Data(bytes[i...]))
                break
            }
            guard i + 1 < bytes.count else { out.append(Data([bytes[i]])); break }
            let length = min(Int(bytes[i + 1]), bytes.count - i - 2)
            out.append(Data(bytes[i..<(i + 2 + length)]))
            i += 2 + length
        }
        return out
    }

    static func matches(_ hex: String, _ pattern: String) -> Bool {
        guard hex.utf8.count >= pattern.utf8.count else { return false }
        for (h, p) in zip(hex.utf8, pattern.utf8) where p != UInt8(ascii: ".") && p != h { return false }
        return true
    }
}
