// LocalDongles: the Bluetooth controllers of this host, from every source that knows something
// of them: sysfs (bus, USB vendor/product/serial/port, driver, firmware where published), the
// kernel's device list (address, up), bluetoothd (address, Powered) and HCI Read Local Version
// (manufacturer, HCI/LMP version and subversion; needs CAP_NET_RAW). A source that is missing
// (no bluetoothd, no Bluetooth in the kernel, no privilege) leaves its fields empty and says why.
import DBus
import Foundation

/// An adapter as bluetoothd lists it.
public struct BlueZAdapter: Sendable, Equatable, Codable {
    /// hciN (the last element of its object path).
    public var name: String
    public var path: String
    public var address: String?
    public var powered: Bool
    public var alias: String?
}

public enum BlueZAdapters {
    /// bluetoothd's adapters (GetManagedObjects on a connection of its own), by name.
    public static func list(busAddress: String? = nil) async -> Result<[BlueZAdapter], BlueZVersionError> {
        do {
            let bus = try await DBusConnection.connect(address: busAddress)
            defer { Task { await bus.close() } }
            let reply = try await bus.call(destination: BlueZ.service, path: "/", interface: DBusStandardInterface.objectManager,
                                           member: "GetManagedObjects", timeout: .seconds(5))
            guard let tree = reply.first else { return .failure(BlueZVersionError("GetManagedObjects returned nothing")) }
            var objects = BlueZObjects()
            objects.load(tree)
            let adapters = objects.paths(with: BlueZ.adapter).compactMap { path -> BlueZAdapter? in
                guard let p = objects[path, BlueZ.adapter] else { return nil }
                let name = String(path.split(separator: "/").last ?? "")
                guard SysfsBluetooth.hciIndex(name) != nil else { return nil }
                let alias = p["Alias"]?.stringValue.map { String($0.prefix(248)) }
                return BlueZAdapter(name: name, path: path, address: p["Address"]?.stringValue.flatMap(SysfsBluetooth.address),
                                    powered: p["Powered"]?.boolValue ?? false, alias: alias)
            }
            return .success(adapters.sorted { (SysfsBluetooth.hciIndex($0.name) ?? 0) < (SysfsBluetooth.hciIndex($1.name) ?? 0) })
        } catch {
            return .failure(BlueZVersionError("bluetoothd cannot be asked (\(BlueZError.transportError(error, operation: "GetManagedObjects")))"))
        }
    }
}

extension BlueZAdapters {
    /// Sets an adapter's Powered through bluetoothd on a connection of its own (Adapter1.Powered;
    /// bluetoothd answers once the controller did).
    public static func setPowered(_ path: String, _ on: Bool, busAddress: String? = nil, timeout: TimeInterval = 20) async -> Result<Void, BlueZVersionError> {
        do {
            let bus = try await DBusConnection.connect(address: busAddress)
            defer { Task { await bus.close() } }
            _ = try await bus.call(destination: BlueZ.service, path: path, interface: DBusStandardInterface.properties, member: "Set",
                                   arguments: [.string(BlueZ.adapter), .string("Powered"), .variant(.bool(on))], timeout: BlueZ.callTimeout(timeout))
            return .success(())
        } catch {
            return .failure(BlueZVersionError("cannot power \(path) \(on ? "on" : "off") (\(BlueZError.transportError(error, operation: "Powered")))"))
        }
    }
}

/// One controller of this host, as far as it is known.
public struct LocalDongle: Sendable, Equatable, Codable {
    public var adapter: String
    public var address: String?
    /// bluetoothd's Powered, else the kernel's up flag.
    public var powered: Bool?
    public var inBlueZ: Bool
    public var identity: ControllerIdentity?
    public var sysfs: SysfsBluetooth.Adapter?
}

public enum LocalDongles {
    public struct Survey: Sendable {
        public var dongles: [LocalDongle]
        /// Sources that could not be read, and why.
        public var problems: [String]
    }

    /// Every controller of this host. `identities`: read each one's HCI version (a blocking
    /// HCI request per adapter, at most 1 s each).
    public static func survey(sysfsRoot: String = "/sys", busAddress: String? = nil, identities: Bool = true) async -> Survey {
        var problems = [String]()
        let sysfs = SysfsBluetooth(root: sysfsRoot).adapters()
        var kernel = [ControllerIdentity.Device]()
        switch ControllerIdentity.devices() {
        case .success(let d): kernel = d
        case .failure(let e): problems.append("the kernel's controller list: \(e)")
        }
        var bluez = [BlueZAdapter]()
        switch await BlueZAdapters.list(busAddress: busAddress) {
        case .success(let a): bluez = a
        case .failure(let e): problems.append("\(e)")
        }
        var names = [String]()
        for n in sysfs.map(\.name) + kernel.map(\.name) + bluez.map(\.name) where !names.contains(n) { names.append(n) }
        names.sort { (SysfsBluetooth.hciIndex($0) ?? 0) < (SysfsBluetooth.hciIndex($1) ?? 0) }
        var out = [LocalDongle]()
        for name in names {
            let s = sysfs.first { $0.name == name }
            let k = kernel.first { $0.name == name }
            let b = bluez.first { $0.name == name }
            var d = LocalDongle(adapter: name, address: b?.address ?? k?.address ?? s?.address, powered: b?.powered ?? k?.up, inBlueZ: b != nil, sysfs: s)
            if d.address == "00:00:00:00:00:00" { d.address = nil }
            if identities {
                let id = ControllerIdentity.read(adapter: name)
                d.identity = id
                if d.address == nil, let a = id.controller?.address { d.address = a }
            }
            out.append(d)
        }
        return Survey(dongles: out, problems: problems + sharedAddresses(out))
    }

    /// Controllers of this host that report one address: clone dongles, which nothing that goes
    /// by address (plans, manifests, the coordinator's records) can tell apart.
    public static func sharedAddresses(_ dongles: [LocalDongle]) -> [String] {
        let byAddress = Dictionary(grouping: dongles.filter { $0.address != nil }, by: { $0.address ?? "" })
        return byAddress.sorted { $0.key < $1.key }.filter { $0.value.count > 1 }.map { address, group in
            "\(group.map(\.adapter).joined(separator: " and ")) report one address, \(address): clone dongles, which the lab cannot tell apart "
                + "(select them here by hciN; the coordinator marks the address bad)"
        }
    }

    /// The controller `selector` names: hciN, or an address (any case) that one controller has.
    public static func find(_ selector: String, in dongles: [LocalDongle]) -> LocalDongle? {
        if let address = SysfsBluetooth.address(selector) {
            let matching = dongles.filter { $0.address == address }
            return matching.count == 1 ? matching[0] : nil
        }
        return dongles.first { $0.adapter == selector }
    }
}
