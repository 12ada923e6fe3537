import Foundation
import HeraldCore
import HeraldRadio

/// What the sensor believes a peer runs. `shared`: known only through a payload-sharing bundle
/// (no radio address, never shared again).
public enum PeerOS: String, Sendable {
    case unknown, android, ios, iosProbable, linux, notHerald, shared
}

/// One entry of the device database: a peer, followed across MAC changes by its pseudo address.
public final class BLEDevice {
    /// Stable identity for logs: the first MAC seen (or a generated UUID for devices known only
    /// through sharing). It does not change when the MAC rotates.
    public let identifier: TargetIdentifier
    /// The MAC to use on air now.
    public internal(set) var address: RadioAddress?
    public internal(set) var pseudoAddress: PseudoDeviceAddress?
    public internal(set) var os: PeerOS = .unknown
    public internal(set) var payload: PayloadData?
    public internal(set) var payloadReadAt: Date?
    public internal(set) var rssi: Int?
    public internal(set) var txPower: Int?
    public internal(set) var createdAt: Date
    /// Last advert or interaction.
    public internal(set) var lastUpdatedAt: Date
    /// Ignored (not a Herald device) until then.
    public internal(set) var ignoreUntil: Date?
    var ignoreCount = 0
    public internal(set) var hasHeraldService = false
    public internal(set) var hasAppleData = false
    /// The peer serves the Android-style (write) or iOS-style signal characteristic.
    public internal(set) var signalCharacteristic: BluetoothUUID?
    var lastPayloadSharingAt: Date?
    var lastPayloadWriteAt: Date?
    var lastRSSIWriteAt: Date?
    var payloadWritten = false
    var sharedPayloads = Set<PayloadData>()
    var failedConnections = 0
    /// A central that wrote its payload or RSSI to this node: it cannot be read itself (it does
    /// not advertise), so the sensor never connects to it, and its payload is shared with iOS peers.
    public internal(set) var receiveOnly = false
    /// The content of its last advert and what it showed (`AdvertFilter.signs`): a device
    /// repeats its advert, and equal content (the same storage, most often) is not parsed again.
    var lastAdvert: (manufacturerData: [UInt16: Data], serviceUUIDs: [BluetoothUUID], signs: AdvertFilter.Signs)?

    /// What its adverts say makes it worth a connection: the Herald service, Apple data (an
    /// iPhone in background) or a pseudo device address.
    var mayBeHerald: Bool { hasHeraldService || hasAppleData || pseudoAddress != nil }

    init(identifier: TargetIdentifier, address: RadioAddress?, now: Date) {
        self.identifier = identifier
        self.address = address
        self.createdAt = now
        self.lastUpdatedAt = now
    }
}
