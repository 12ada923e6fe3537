// BlueZObjects: the client-side mirror of bluetoothd's object tree (ObjectManager), kept current
// from GetManagedObjects, InterfacesAdded, InterfacesRemoved and PropertiesChanged.
import DBus
import Foundation
import HeraldCore
import HeraldRadio

/// D-Bus names of the BlueZ API the transport uses.
public enum BlueZ {
    public static let service = "org.bluez"
    public static let adapter = "org.bluez.Adapter1"
    public static let device = "org.bluez.Device1"
    public static let gattManager = "org.bluez.GattManager1"
    public static let gattService = "org.bluez.GattService1"
    public static let gattCharacteristic = "org.bluez.GattCharacteristic1"
    public static let advertisingManager = "org.bluez.LEAdvertisingManager1"
    public static let advertisement = "org.bluez.LEAdvertisement1"

    /// A timeout in seconds as a D-Bus call's: whole milliseconds, saturated (NaN and negative
    /// values come to DBusConnection's least, 1 ms; 1e300 to its most, a year), never a trap: a
    /// timeout is configuration or a measured latency, and either can say anything (issue 36).
    static func callTimeout(_ seconds: TimeInterval) -> Duration { .milliseconds(Saturating.int64(seconds * 1000)) }

    /// An advertising interval in seconds as BlueZ's Min/MaxInterval: milliseconds, rounded, held
    /// to UInt32 (NaN 0).
    static func intervalMilliseconds(_ seconds: TimeInterval) -> UInt32 { UInt32(clamping: Saturating.int64((seconds * 1000).rounded())) }

    /// `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF` for an address on an adapter.
    public static func devicePath(adapter: String, address: RadioAddress) -> String {
        adapter + "/dev_" + address.value.replacingOccurrences(of: ":", with: "_")
    }

    /// The address in a device object path (or any path below it), nil if there is none.
    public static func address(inPath path: String) -> RadioAddress? {
        guard let range = path.range(of: "/dev_") else { return nil }
        let hex = path[range.upperBound...].prefix(17)
        guard hex.count == 17 else { return nil }
        return RadioAddress(hex.replacingOccurrences(of: "_", with: ":"))
    }
}

/// Object path -> interface -> property -> value (variants unwrapped).
struct BlueZObjects {
    private(set) var objects: [String: [String: [String: DBusValue]]] = [:]

    mutating func clear() { objects.removeAll() }

    /// Replaces everything with a GetManagedObjects reply (`a{oa{sa{sv}}}`).
    mutating func load(_ tree: DBusValue) {
        objects.removeAll()
        for entry in tree.dictionaryEntries ?? [] {
            guard let path = entry.key.stringValue else { continue }
            add(path: path, interfaces: entry.value)
        }
    }

    /// InterfacesAdded: `a{sa{sv}}` for one path.
    mutating func add(path: String, interfaces: DBusValue) {
        var current = objects[path] ?? [:]
        for i in interfaces.dictionaryEntries ?? [] {
            guard let name = i.key.stringValue else { continue }
            current[name] = Self.properties(i.value)
        }
        objects[path] = current
    }

    /// InterfacesRemoved. Returns the interfaces that were removed.
    @discardableResult
    mutating func remove(path: String, interfaces names: [String]) -> [String] {
        guard var current = objects[path] else { return [] }
        let removed = names.filter { current[$0] != nil }
        for n in removed { current.removeValue(forKey: n) }
        objects[path] = current.isEmpty ? nil : current
        return removed
    }

    /// PropertiesChanged. Returns the names of the changed properties (invalidated ones included).
    mutating func update(path: String, interface: String, changed: DBusValue, invalidated: [String]) -> Set<String> {
        guard objects[path]?[interface] != nil else { return [] }
        var names = Set<String>()
        for (k, v) in Self.properties(changed) { objects[path]![interface]![k] = v; names.insert(k) }
        for k in invalidated { objects[path]![interface]!.removeValue(forKey: k); names.insert(k) }
        return names
    }

    static func properties(_ dict: DBusValue) -> [String: DBusValue] {
        var out: [String: DBusValue] = [:]
        for (k, v) in dict.stringKeyedDictionary ?? [:] { out[k] = v.unwrapped }
        return out
    }

    subscript(path: String, interface: String) -> [String: DBusValue]? { objects[path]?[interface] }

    /// Paths having `interface`, sorted.
    func paths(with interface: String, under prefix: String? = nil) -> [String] {
        objects.keys.filter { path in
            objects[path]?[interface] != nil && (prefix.map { path.hasPrefix($0 + "/") } ?? true)
        }.sorted()
    }

    /// The adapter named `selector`: `hci0`, a full path, or an address; empty picks the first.
    func adapter(matching selector: String) -> Result<String, TransportError> {
        let adapters = paths(with: BlueZ.adapter)
        let names = adapters.map { String($0.split(separator: "/").last ?? "") }
        let found = adapters.first { path in
            if selector.isEmpty { return true }
            if path == selector || path.hasSuffix("/" + selector) { return true }
            let address = self[path, BlueZ.adapter]?["Address"]?.stringValue ?? ""
            return address.uppercased() == selector.uppercased()
        }
        if let found { return .success(found) }
        if adapters.isEmpty {
            return .failure(.adapterUnavailable("bluetoothd has no adapter: is a controller plugged in and not blocked (rfkill list)?"))
        }
        return .failure(.adapterUnavailable("no adapter \(selector); bluetoothd has \(names.joined(separator: ", "))"))
    }

    /// A scan report from a device's current properties (nil without an RSSI: not heard lately).
    func report(device path: String) -> ScanReport? {
        guard let p = self[path, BlueZ.device], let address = p["Address"]?.stringValue, let rssi = p["RSSI"]?.intValue else {
            return nil
        }
        var manufacturer: [UInt16: Data] = [:]
        for e in p["ManufacturerData"]?.dictionaryEntries ?? [] {
            guard let id = e.key.intValue, let bytes = e.value.bytesValue else { continue }
            manufacturer[UInt16(truncatingIfNeeded: id)] = Data(bytes)
        }
        let uuids = (p["UUIDs"]?.stringArrayValue ?? []).compactMap(BluetoothUUID.init)
        return ScanReport(address: RadioAddress(address), rssi: rssi, txPower: p["TxPower"]?.intValue,
                          manufacturerData: manufacturer, serviceUUIDs: uuids)
    }

    /// The remote GATT database of a device, from its GattService1/GattCharacteristic1 objects.
    func services(device path: String) -> [GATTService] {
        paths(with: BlueZ.gattService, under: path).compactMap { servicePath in
            guard let uuid = self[servicePath, BlueZ.gattService]?["UUID"]?.stringValue.flatMap(BluetoothUUID.init) else { return nil }
            let characteristics = paths(with: BlueZ.gattCharacteristic, under: servicePath).compactMap { c -> GATTCharacteristic? in
                guard let props = self[c, BlueZ.gattCharacteristic],
                      let cu = props["UUID"]?.stringValue.flatMap(BluetoothUUID.init) else { return nil }
                return GATTCharacteristic(uuid: cu, properties: CharacteristicProperties(bluezFlags: props["Flags"]?.stringArrayValue ?? []))
            }
            return GATTService(uuid: uuid, characteristics: characteristics)
        }
    }

    /// The object path of a remote characteristic.
    func characteristicPath(device path: String, service: BluetoothUUID, characteristic: BluetoothUUID) -> Result<String, TransportError> {
        let servicePaths = paths(with: BlueZ.gattService, under: path).filter {
            self[$0, BlueZ.gattService]?["UUID"]?.stringValue.flatMap(BluetoothUUID.init) == service
        }
        guard !servicePaths.isEmpty else { return .failure(.serviceNotFound(service)) }
        for s in servicePaths {
            if let c = paths(with: BlueZ.gattCharacteristic, under: s).first(where: {
                self[$0, BlueZ.gattCharacteristic]?["UUID"]?.stringValue.flatMap(BluetoothUUID.init) == characteristic
            }) { return .success(c) }
        }
        return .failure(.characteristicNotFound(characteristic))
    }
}

extension CharacteristicProperties {
    init(bluezFlags: [String]) {
        self = []
        for f in bluezFlags {
            switch f {
            case "read", "encrypt-read", "encrypt-authenticated-read", "secure-read": insert(.read)
            case "write", "encrypt-write", "encrypt-authenticated-write", "secure-write", "reliable-write": insert(.write)
            case "write-without-response": insert(.writeWithoutResponse)
            case "notify", "indicate": insert(.notify)
            default: break
            }
        }
    }
}
