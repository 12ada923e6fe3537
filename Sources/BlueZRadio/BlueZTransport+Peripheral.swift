// The peripheral half of the BlueZ transport: the GATT application bluetoothd serves for us
// (GattManager1.RegisterApplication) and the advertisement it broadcasts
// (LEAdvertisingManager1.RegisterAdvertisement). bluetoothd calls back into the exported
// objects (GetManagedObjects, Properties.GetAll) before it replies to either registration,
// which the DBus module answers while the registration call is still pending.
import DBus
import Foundation
import HeraldCore
import HeraldRadio

extension BlueZTransport {
    var applicationPath: String { options.objectRoot + "/app" }

    public func register(service: GATTService, server delegate: any GATTServerDelegate,
                         completion: @escaping (Result<Void, TransportError>) -> Void) {
        server = delegate
        guard let adapter = adapterPath else {
            completion(.failure(.adapterUnavailable("no adapter"))); return
        }
        let root = applicationPath
        let objects = exportedGATTObjects(service)
        perform("RegisterApplication", adapterCall: .probe, { [weak self] (result: Result<Void, TransportError>) in
            if case .success = result { self?.applicationRegistered = true; self?.note("GATT application \(root) registered") }
            completion(result)
        }) { bus in
            // Exporting again (after bluetoothd restarted) replaces the same objects.
            try await bus.exportObjectManager(at: root)
            for (path, interfaces) in objects { try await bus.export(path: path, interfaces: interfaces) }
            do {
                _ = try await self.call(bus, adapter, BlueZ.gattManager, "RegisterApplication",
                                        [.objectPath(root), .variantDictionary([:])], timeout: max(self.options.callTimeout, 20))
            } catch where BlueZError.isNamed(error, "AlreadyExists") {
                // The same bluetoothd still serves it: an adapter power-cycled to recover it keeps
                // its registered applications (seen in the guest tier after a recovery).
            }
        }
    }

    /// The service and characteristic objects of the application, in export order.
    private func exportedGATTObjects(_ service: GATTService) -> [(String, [DBusInterface])] {
        let servicePath = applicationPath + "/service0"
        var out: [(String, [DBusInterface])] = [(servicePath, [DBusInterface(BlueZ.gattService, properties: [
            "UUID": DBusProperty(.string(service.uuid.lowercased)),
            "Primary": DBusProperty(.bool(true)),
        ])])]
        for (i, c) in service.characteristics.enumerated() {
            let path = servicePath + String(format: "/char%04x", i)
            let uuid = c.uuid
            let read = DBusMethod(in: "a{sv}", out: "ay", inNames: ["options"], outNames: ["value"]) { [weak self] call in
                guard let self else { throw DBusMethodError(BlueZError.prefix + "Failed", "gone") }
                let o = call.arguments.first
                let offset = o?["offset"]?.intValue ?? 0
                let central = Self.central(o)
                let result: Result<Data, ATTError> = await self.onScheduler {
                    guard let server = self.server else { return .failure(.failed("no server")) }
                    self.centrals.insert(central)
                    return server.gattRead(characteristic: uuid, offset: offset, central: central)
                }
                switch result {
                case .success(let data): return [.bytes([UInt8](data))]
                case .failure(let e): throw BlueZError.methodError(e)
                }
            }
            let write = DBusMethod(in: "aya{sv}", out: "", inNames: ["value", "options"]) { [weak self] call in
                guard let self else { throw DBusMethodError(BlueZError.prefix + "Failed", "gone") }
                let value = Data(call.arguments.first?.bytesValue ?? [])
                let o = call.arguments.count > 1 ? call.arguments[1] : nil
                let offset = o?["offset"]?.intValue ?? 0
                let central = Self.central(o)
                let result: Result<Void, ATTError> = await self.onScheduler {
                    guard let server = self.server else { return .failure(.failed("no server")) }
                    self.centrals.insert(central)
                    return server.gattWrite(characteristic: uuid, value: value, offset: offset, central: central)
                }
                if case .failure(let e) = result { throw BlueZError.methodError(e) }
                return []
            }
            out.append((path, [DBusInterface(BlueZ.gattCharacteristic, methods: ["ReadValue": read, "WriteValue": write], properties: [
                "UUID": DBusProperty(.string(uuid.lowercased)),
                "Service": DBusProperty(.objectPath(servicePath)),
                "Flags": DBusProperty(.stringArray(c.properties.bluezFlags)),
            ])]))
        }
        return out
    }

    /// The remote central of a server-side read or write, from bluetoothd's `device` option.
    private static func central(_ options: DBusValue?) -> RadioAddress {
        options?["device"]?.stringValue.flatMap(BlueZ.address(inPath:)) ?? RadioAddress("00:00:00:00:00:00")
    }

    public func startAdvertising(_ ad: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard let adapter = adapterPath else { completion(.failure(.adapterUnavailable("no adapter"))); return }
        warnAboutAdvertisingControl(ad)
        let previous = advertisementRegistered ? advertisementPath : nil
        advertisementCount += 1
        let path = advertisementPath
        let interface = advertisementInterface(ad)
        perform("RegisterAdvertisement", adapterCall: .probe, { [weak self] (result: Result<Void, TransportError>) in
            guard let self else { return }
            if case .success = result {
                self.advertisementRegistered = true
                self.note("advertising \(path)")
            } else {
                self.advertisementRegistered = false
            }
            completion(result)
        }) { bus in
            // New content (a renewed pseudo address) means unregistering and registering again.
            if let previous {
                do { _ = try await self.call(bus, adapter, BlueZ.advertisingManager, "UnregisterAdvertisement", [.objectPath(previous)]) } catch {
                    // The old one may go on being advertised beside the new one: log.txt says so.
                    await self.onScheduler { self.note("could not unregister advertisement \(previous) before its renewal: \(error)") }
                }
                await bus.unexport(path: previous)
            }
            try await bus.export(path: path, interfaces: [interface])
            do {
                _ = try await self.call(bus, adapter, BlueZ.advertisingManager, "RegisterAdvertisement",
                                        [.objectPath(path), .variantDictionary([:])])
            } catch {
                await bus.unexport(path: path)
                throw error
            }
        }
    }

    var advertisementPath: String { options.objectRoot + "/advertisement\(advertisementCount)" }

    private func advertisementInterface(_ ad: Advertisement) -> DBusInterface {
        var props: [String: DBusProperty] = [
            "Type": DBusProperty(.string("peripheral")),
            "ServiceUUIDs": DBusProperty(.stringArray(ad.serviceUUIDs.map { u in
                u.shortValue.map { String(format: "%04x", $0) } ?? u.lowercased
            })),
            "ManufacturerData": DBusProperty(.manufacturerData(ad.manufacturerData.mapValues { [UInt8]($0) })),
            "Includes": DBusProperty(.stringArray(ad.includeTxPower ? ["tx-power"] : [])),
        ]
        if let tx = ad.txPower { props["TxPower"] = DBusProperty(.int16(Int16(clamping: tx))) }
        if let interval = ad.interval {
            let ms = BlueZ.intervalMilliseconds(interval)
            props["MinInterval"] = DBusProperty(.uint32(ms))
            props["MaxInterval"] = DBusProperty(.uint32(ms))
        }
        let release = DBusMethod { [weak self] _ in
            await self?.onScheduler {
                self?.advertisementRegistered = false
                self?.note("bluetoothd released the advertisement")
            }
            return []
        }
        return DBusInterface(BlueZ.advertisement, methods: ["Release": release], properties: props)
    }

    /// Says once where the plan's advertising interval or TX power may not reach the controller.
    private func warnAboutAdvertisingControl(_ ad: Advertisement) {
        guard !warnedAdvertisingControl, ad.interval != nil || ad.txPower != nil, let adapter = adapterPath else { return }
        warnedAdvertisingControl = true
        let manager = objects[adapter, BlueZ.advertisingManager] ?? [:]
        let features = manager["SupportedFeatures"]?.stringArrayValue ?? []
        let caps = manager["SupportedCapabilities"].flatMap { BlueZObjects.properties($0) } ?? [:]
        var lines: [String] = []
        if ad.interval != nil, caps.isEmpty {
            lines.append("advertising interval \(ad.interval!) s requested, but bluetoothd does not expose advertising control (BlueZ before 5.77 needs `bluetoothd -E`); the controller's default interval applies")
        }
        if let tx = ad.txPower {
            if !features.contains("CanSetTxPower") {
                lines.append("TX power \(tx) dBm requested, but the adapter cannot set it (SupportedFeatures lacks CanSetTxPower; BlueZ before 5.77 needs `bluetoothd -E`); the controller's default applies")
            } else if let lo = caps["MinTxPower"]?.intValue, let hi = caps["MaxTxPower"]?.intValue, !(lo...hi).contains(tx) {
                lines.append("TX power \(tx) dBm is outside the adapter's range \(lo)...\(hi) dBm; the controller clamps it")
            }
        }
        for l in lines { note(l) }
    }

    public func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard advertisementRegistered, let adapter = adapterPath else { completion(.success(())); return }
        advertisementRegistered = false
        let path = advertisementPath
        perform("UnregisterAdvertisement", adapterCall: .teardown, completion) { bus in
            defer { Task { await bus.unexport(path: path) } }
            do {
                _ = try await self.call(bus, adapter, BlueZ.advertisingManager, "UnregisterAdvertisement", [.objectPath(path)])
            } catch where BlueZError.isNamed(error, "DoesNotExist") {
                // Already gone (released by bluetoothd): nothing to stop.
            }
        }
    }
}
