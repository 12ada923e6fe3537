import Foundation
import HeraldCore

/// A device address as seen on air: `AA:BB:CC:DD:EE:FF` (BlueZ's Device1.Address).
public struct RadioAddress: Hashable, Sendable, Codable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let value: String
    public init(_ value: String) { self.value = value.uppercased() }
    public init(stringLiteral value: String) { self.init(value) }
    /// A random static address from six generator bytes (top two bits set, as BLE requires).
    public init<G: RandomNumberGenerator>(randomUsing g: inout G) {
        var bytes = (0..<6).map { _ in UInt8.random(in: .min ... .max, using: &g) }
        bytes[0] |= 0xC0
        value = bytes.map { String(format: "%02X", $0) }.joined(separator: ":")
    }
    public var description: String { value }
}

/// The power state of the local radio (BlueZ Adapter1.Powered, or the adapter's absence).
public enum RadioState: String, Sendable {
    case poweredOn, poweredOff, unavailable
}

/// An advertisement to broadcast (BlueZ LEAdvertisement1).
public struct Advertisement: Equatable, Sendable {
    /// Service UUIDs in the primary PDU (`ServiceUUIDs`).
    public var serviceUUIDs: [BluetoothUUID]
    /// Company id -> bytes after the id (`ManufacturerData` a{qv}).
    public var manufacturerData: [UInt16: Data]
    /// Advertised TX power in dBm (`TxPower`, `Includes` tx-power when `includeTxPower`).
    public var txPower: Int?
    public var includeTxPower: Bool
    /// Advertising interval, seconds (`MinInterval`/`MaxInterval`).
    public var interval: TimeInterval?

    public init(serviceUUIDs: [BluetoothUUID], manufacturerData: [UInt16: Data] = [:], txPower: Int? = nil, includeTxPower: Bool = false, interval: TimeInterval? = nil) {
        self.serviceUUIDs = serviceUUIDs
        self.manufacturerData = manufacturerData
        self.txPower = txPower
        self.includeTxPower = includeTxPower
        self.interval = interval
    }
}

/// A discovery filter (BlueZ Adapter1.SetDiscoveryFilter).
public struct ScanFilter: Equatable, Sendable {
    /// Only LE (`Transport` "le").
    public var lowEnergyOnly: Bool = true
    /// Report every advert, not only changes (`DuplicateData` true): each report is a measurement.
    public var duplicateData: Bool = true
    /// Weakest RSSI to report (`RSSI`), nil for all.
    public var rssiThreshold: Int?
    public init(lowEnergyOnly: Bool = true, duplicateData: Bool = true, rssiThreshold: Int? = nil) {
        self.lowEnergyOnly = lowEnergyOnly
        self.duplicateData = duplicateData
        self.rssiThreshold = rssiThreshold
    }
}

/// One advertising report (BlueZ Device1 RSSI/TxPower/ManufacturerData/UUIDs updates).
public struct ScanReport: Equatable, Sendable {
    public var address: RadioAddress
    public var rssi: Int
    public var txPower: Int?
    public var manufacturerData: [UInt16: Data]
    public var serviceUUIDs: [BluetoothUUID]
    public init(address: RadioAddress, rssi: Int, txPower: Int? = nil, manufacturerData: [UInt16: Data] = [:], serviceUUIDs: [BluetoothUUID] = []) {
        self.address = address
        self.rssi = rssi
        self.txPower = txPower
        self.manufacturerData = manufacturerData
        self.serviceUUIDs = serviceUUIDs
    }
}

/// GATT characteristic properties (BlueZ GattCharacteristic1.Flags).
public struct CharacteristicProperties: OptionSet, Hashable, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let read = CharacteristicProperties(rawValue: 1 << 0)
    public static let write = CharacteristicProperties(rawValue: 1 << 1)
    public static let writeWithoutResponse = CharacteristicProperties(rawValue: 1 << 2)
    public static let notify = CharacteristicProperties(rawValue: 1 << 3)

    /// BlueZ flag strings.
    public var bluezFlags: [String] {
        var f = [String]()
        if contains(.read) { f.append("read") }
        if contains(.write) { f.append("write") }
        if contains(.writeWithoutResponse) { f.append("write-without-response") }
        if contains(.notify) { f.append("notify") }
        return f
    }
}

public struct GATTCharacteristic: Equatable, Sendable {
    public var uuid: BluetoothUUID
    public var properties: CharacteristicProperties
    public init(uuid: BluetoothUUID, properties: CharacteristicProperties) { self.uuid = uuid; self.properties = properties }
}

/// A primary service: served locally (GattManager1.RegisterApplication) or found on a peer.
public struct GATTService: Equatable, Sendable {
    public var uuid: BluetoothUUID
    public var characteristics: [GATTCharacteristic]
    public init(uuid: BluetoothUUID, characteristics: [GATTCharacteristic]) { self.uuid = uuid; self.characteristics = characteristics }
}

/// ATT errors a local GATT server answers with (org.bluez.Error.* from an exported characteristic).
public enum ATTError: Error, Equatable, Sendable {
    case invalidOffset, invalidValueLength, notPermitted, notSupported, failed(String)
}

/// Typed errors of transport operations; the BlueZ transport maps org.bluez.Error.* onto these.
public enum TransportError: Error, Equatable, Sendable, CustomStringConvertible {
    case adapterUnavailable(String)
    case timeout(String)
    case notConnected
    case connectionFailed(String)
    case inProgress
    case notPermitted
    case notSupported(String)
    case invalidOffset
    case invalidValueLength
    case deviceNotFound(RadioAddress)
    case serviceNotFound(BluetoothUUID)
    case characteristicNotFound(BluetoothUUID)
    case failed(String)

    public var description: String {
        switch self {
        case .adapterUnavailable(let why): return "adapter unavailable: \(why)"
        case .timeout(let what): return "timed out: \(what)"
        case .notConnected: return "not connected"
        case .connectionFailed(let why): return "connection failed: \(why)"
        case .inProgress: return "operation in progress"
        case .notPermitted: return "not permitted"
        case .notSupported(let what): return "not supported: \(what)"
        case .invalidOffset: return "invalid offset"
        case .invalidValueLength: return "invalid value length"
        case .deviceNotFound(let a): return "device \(a) not found"
        case .serviceNotFound(let u): return "service \(u) not found"
        case .characteristicNotFound(let u): return "characteristic \(u) not found"
        case .failed(let why): return "failed: \(why)"
        }
    }
}

/// Answers remote reads and writes of the services a node serves. Called on the scheduler's executor.
public protocol GATTServerDelegate: AnyObject {
    /// A remote central reads `characteristic` from `offset` (long reads send growing offsets).
    func gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress) -> Result<Data, ATTError>
    /// A remote central writes `value` at `offset`.
    func gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress) -> Result<Void, ATTError>
    /// A remote central's link went down: drop any per-central state (e.g. signal fragments).
    func gattCentralDisconnected(_ central: RadioAddress)
}

/// Events from the radio, delivered on the scheduler's executor.
public protocol BLETransportDelegate: AnyObject {
    func transport(didUpdateState state: RadioState)
    func transport(didReceive report: ScanReport)
    /// An outgoing connection to `address` was lost or closed by the peer.
    func transport(didDisconnect address: RadioAddress)
}

/// The radio as the Herald sensor sees it: the only way the sensor reaches Bluetooth.
///
/// Each call maps one to one onto BlueZ's D-Bus API, so that the BlueZ transport and the
/// simulated transports implement the same contract:
///
/// | call | BlueZ |
/// |---|---|
/// | `powerOn` | Adapter1.Powered = true |
/// | `register(service:server:)` | GattManager1.RegisterApplication (exported GattService1/GattCharacteristic1) |
/// | `startAdvertising` / `stopAdvertising` | LEAdvertisingManager1.Register/UnregisterAdvertisement |
/// | `startScanning` / `stopScanning` | Adapter1.SetDiscoveryFilter + StartDiscovery / StopDiscovery |
/// | reports | Device1 InterfacesAdded / PropertiesChanged (RSSI, TxPower, ManufacturerData, UUIDs) |
/// | `connect` | Device1.Connect, then wait for ServicesResolved |
/// | `discoverServices` | the GattService1/GattCharacteristic1 objects under the device |
/// | `read` / `write` | GattCharacteristic1.ReadValue / WriteValue (type request or command) |
/// | `disconnect` | Device1.Disconnect |
///
/// Every completion and delegate call runs on the transport's scheduler, and every operation
/// that waits for the radio ends, with a result or a typed error, within its timeout.
public protocol BLETransport: AnyObject {
    var delegate: (any BLETransportDelegate)? { get set }
    var state: RadioState { get }
    /// The scheduler whose executor runs every completion and delegate call.
    var scheduler: any Scheduler { get }

    func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void)
    func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void)
    func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void)
    func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void)
    func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void)
    func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void)
    func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void)
    func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void)
    func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void)
    func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void)
    func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void)
    /// Time to allow beyond the sensor's own deadlines because the radio has been answering
    /// slowly (bluetoothd on a busy host); 0 for a radio that answers on time.
    var callAllowance: TimeInterval { get }
    /// What the radio is coping with (slow answers, retried discovery, an outage), for the
    /// node's status; nil when all is well.
    var condition: String? { get }
}

extension BLETransport {
    public var callAllowance: TimeInterval { 0 }
    public var condition: String? { nil }
}
