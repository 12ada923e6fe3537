import Foundation

/// Settings of the BLE sensor. Defaults follow Herald's Android sensor (PROTOCOL.md).
public struct BLESensorSettings: Sendable, Equatable {
    /// Scan cycle: scan, rest (process results), off.
    public var scanOn: TimeInterval = 4
    public var scanRest: TimeInterval = 1
    public var scanOff: TimeInterval = 2
    public var advertInterval: TimeInterval = 0.25
    public var txPower: Int = -4
    public var includeTxPower: Bool = false
    /// Advertise a 0x05F1 pseudo device address.
    public var pseudoAddress: Bool = true
    /// Connect + discover + read/write must finish within this.
    public var connectionTimeout: TimeInterval = 8
    /// Write payload-sharing bundles to iOS peers.
    public var payloadSharing: Bool = true
    /// Devices not updated for this long are purged.
    public var purgeAfter: TimeInterval = 15 * 60
    /// Non-Herald devices are ignored for `ignoreBase`, growing by `ignoreFactor` per repeat up to `ignoreMax`.
    public var ignoreBase: TimeInterval = 60
    public var ignoreFactor: Double = 1.2
    public var ignoreMax: TimeInterval = 180
    /// Minimum time between payload-sharing writes to one iOS peer.
    public var payloadSharingInterval: TimeInterval = 15
    /// Payloads seen this recently may be shared.
    public var payloadSharingWindow: TimeInterval = 5 * 60
    /// A node that cannot advertise writes its payload this often, and its RSSI at least this often.
    public var receiveOnlyPayloadInterval: TimeInterval = 5 * 60
    public var receiveOnlyRSSIInterval: TimeInterval = 15
    /// The pseudo address is renewed when nothing has connected for this long.
    public var pseudoAddressRenewal: TimeInterval = 20 * 60
    /// Signal writes are split into fragments of this size.
    public var writeFragmentSize: Int = 20
    /// Which advertising reports are processed at all (Herald's Android scan filter).
    public var advertFilter = AdvertFilter()
    /// Each connection of the processing window starts after a random delay below this (0: at
    /// once, as Herald does). Phones never run their scan cycles in step; lab nodes that the
    /// coordinator starts at one instant do, and a Linux host pauses its advertising while it
    /// initiates, so two nodes that pick each other in the same cycle each wait for an advert the
    /// other no longer sends, every cycle they pick each other again.
    public var connectionSpread: TimeInterval = 0
    /// The spread lab nodes on a real radio use (BlueZ): four of Herald's 500 ms advert
    /// intervals, within the 3 s between scans.
    public static let labConnectionSpread: TimeInterval = 2

    public init() {}
}

/// Levels of the sensor's own log (log.txt).
public enum SensorLogLevel: Int, Sendable, Comparable {
    case debug = 0, info = 1, fault = 2
    public static func < (a: SensorLogLevel, b: SensorLogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// Where the sensor writes its diagnostic log (log.txt through HeraldLogs' SensorLogger).
public protocol SensorLog: AnyObject {
    func log(_ level: SensorLogLevel, subsystem: String, category: String, _ message: String)
    /// Whether messages of `level` are written at all (skips building them).
    func isEnabled(_ level: SensorLogLevel) -> Bool
}
