// The central half of the BlueZ transport: discovery, connections and GATT client calls on
// remote devices' objects (`/org/bluez/hciN/dev_.../serviceXXXX/charYYYY`).
import DBus
import Foundation
import HeraldCore
import HeraldRadio

extension BlueZTransport {
    public func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard adapterPath != nil else { completion(.failure(.adapterUnavailable("no adapter"))); return }
        if connectionAttempts > 0 {
            // Starting discovery makes the kernel abort an LE connection attempt in progress
            // (and bluetoothd 5.66 then removes the temporary device under its own feet):
            // discovery starts once the attempt has ended.
            deferredScan = filter
            completion(.success(()))
            return
        }
        // A start still being retried is superseded: it ends as failed, this one goes on.
        endDiscoveryAttempts(discoveryLastError ?? .failed("StartDiscovery: superseded by a new start"))
        discoveryToken &+= 1
        scanning = true
        startDiscovery(filter, token: discoveryToken, completion)
    }

    /// One attempt to start discovery. A start that times out or fails (bluetoothd busy or slow,
    /// the kernel's scan not yet stopped) is tried again after a backoff (1, 2, 4, ... 16 s) for
    /// as long as the sensor wants to scan; each retry is in log.txt and the node's status, and
    /// the sensor hears of it only once: success when discovery runs, or the last failure when
    /// it stops scanning before discovery ever ran.
    private func startDiscovery(_ filter: ScanFilter, token: Int, _ completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard let adapter = adapterPath else { completion(.failure(.adapterUnavailable("no adapter"))); return }
        var f: [String: DBusValue] = ["DuplicateData": .bool(filter.duplicateData)]
        if filter.lowEnergyOnly { f["Transport"] = .string("le") }
        if let rssi = filter.rssiThreshold { f["RSSI"] = .int16(Int16(clamping: rssi)) }
        let discoveryFilter = DBusValue.variantDictionary(f)
        perform("StartDiscovery", adapterCall: .probe, { [weak self] (result: Result<Void, TransportError>) in
            guard let self else { return }
            guard self.discoveryToken == token, self.scanning else {
                // Stopped (or started anew) while this attempt was under way.
                completion(result)
                return
            }
            switch result {
            case .success:
                if self.discoveryFailures > 0 {
                    self.note("discovery started after \(self.discoveryFailures) failed attempt(s)")
                }
                self.discoveryFailures = 0
                self.discoveryLastError = nil
                completion(result)
            case .failure(let error):
                self.discoveryFailures += 1
                self.discoveryLastError = error
                switch error {
                case .timeout, .failed:
                    let wait = CallLatency.discoveryBackoff(afterFailures: self.discoveryFailures)
                    let slow = self.latency(of: "StartDiscovery").summary(of: "StartDiscovery").map { "; \($0)" } ?? ""
                    self.note(String(format: "discovery did not start (%@)%@; trying again in %.0f s (attempt %d)",
                                     "\(error)", slow, wait, self.discoveryFailures + 1))
                    self.discoveryPending = completion
                    self.discoveryRetry = self.dispatch.schedule(after: wait) { [weak self] in
                        guard let self, self.discoveryToken == token, self.scanning, self.state == .poweredOn else { return }
                        self.discoveryRetry = nil
                        let pending = self.discoveryPending ?? completion
                        self.discoveryPending = nil
                        self.startDiscovery(filter, token: token, pending)
                    }
                default:
                    // The adapter is gone or refuses: not something waiting cures.
                    self.scanning = false
                    completion(result)
                }
            }
        }) { bus in
            _ = try await self.call(bus, adapter, BlueZ.adapter, "SetDiscoveryFilter", [discoveryFilter])
            do {
                _ = try await self.call(bus, adapter, BlueZ.adapter, "StartDiscovery")
            } catch where BlueZError.isNamed(error, "InProgress") {
                // This client's discovery is already running.
            }
        }
    }

    /// Ends a start that is waiting to be retried, with `error` (the sensor stopped scanning, a
    /// new start superseded it, or the radio was lost).
    func endDiscoveryAttempts(_ error: TransportError) {
        discoveryRetry?.cancel()
        discoveryRetry = nil
        guard let pending = discoveryPending else { return }
        discoveryPending = nil
        pending(.failure(error))
    }

    public func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard let adapter = adapterPath else { completion(.success(())); return }
        if deferredScan != nil, !scanning {
            deferredScan = nil
            completion(.success(()))
            return
        }
        discoveryToken &+= 1
        if discoveryRetry != nil {
            // Discovery never started in this scan window: nothing to stop.
            scanning = false
            endDiscoveryAttempts(discoveryLastError ?? .failed("StartDiscovery: not started"))
            completion(.success(()))
            return
        }
        scanning = false
        perform("StopDiscovery", adapterCall: .teardown, completion) { bus in
            for attempt in 1...5 {
                do {
                    _ = try await self.call(bus, adapter, BlueZ.adapter, "StopDiscovery")
                    return
                } catch where BlueZError.isNamed(error, "InProgress") && attempt < 5 {
                    // The kernel is between scan phases: ask again shortly.
                    try await Task.sleep(for: .milliseconds(200))
                } catch where BlueZError.isNamed(error, "Failed", "NotReady") {
                    return  // "No discovery started": nothing to stop.
                }
            }
        }
    }

    private func devicePath(_ address: RadioAddress) -> Result<String, TransportError> {
        guard let adapter = adapterPath else { return .failure(.adapterUnavailable("no adapter")) }
        let path = BlueZ.devicePath(adapter: adapter, address: address)
        return objects[path, BlueZ.device] == nil ? .failure(.deviceNotFound(address)) : .success(path)
    }

    public func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        connect(address, timeout: timeout, borrowing: true, completion: completion)
    }

    /// `borrowing`: a link that is up with its services resolved (the peer's, perhaps) is used as
    /// it is. Without it Device1.Connect is always called: after bluetoothd has answered "Not
    /// connected", the objects may still say Connected until its PropertiesChanged is handled.
    private func connect(_ address: RadioAddress, timeout: TimeInterval, borrowing: Bool,
                         completion: @escaping (Result<Void, TransportError>) -> Void) {
        let path: String
        switch devicePath(address) {
        case .success(let p): path = p
        case .failure(let e): completion(.failure(e)); return
        }
        let props = objects[path, BlueZ.device] ?? [:]
        if borrowing, props["Connected"]?.boolValue == true, props["ServicesResolved"]?.boolValue == true {
            if !outgoing.contains(address) { borrowedLinks[address] = timeout }
            outgoing.insert(address)
            completion(.success(())); return
        }
        borrowedLinks.removeValue(forKey: address)
        let started = dispatch.now
        var finished = false
        connectionAttempts += 1
        let epoch = connectEpoch
        let finish: (Result<Void, TransportError>) -> Void = { [weak self] result in
            guard !finished else { return }
            finished = true
            if case .success = result { self?.outgoing.insert(address) }
            if case .failure(let error) = result, case .timeout = error { self?.abandon(path) }
            self?.connectionAttemptEnded()
            if let self, self.connectEpoch == epoch { self.outgoingConnectEnded(address, result) }
            completion(result)
        }
        // One deadline for Connect and service resolution together.
        let deadline = dispatch.schedule(after: timeout) { finish(.failure(.timeout("connect to \(address) within \(timeout) s"))) }
        perform("Connect \(address)", connecting: true, { [weak self] (result: Result<Void, TransportError>) in
            guard let self, !finished else { return }
            if case .failure(let e) = result { deadline.cancel(); finish(.failure(e)); return }
            if self.objects[path, BlueZ.device]?["ServicesResolved"]?.boolValue == true {
                deadline.cancel(); finish(.success(())); return
            }
            self.resolveWaiters[path, default: []].append { resolved in
                deadline.cancel()
                finish(resolved ? .success(()) : .failure(.connectionFailed("\(address) disconnected before its services resolved")))
            }
        }) { bus in
            do {
                _ = try await self.call(bus, path, BlueZ.device, "Connect", timeout: max(1, timeout - Date().timeIntervalSince(started)))
            } catch where BlueZError.isNamed(error, "AlreadyConnected") {
            }
        }
    }

    private func connectionAttemptEnded() {
        connectionAttempts = max(0, connectionAttempts - 1)
        guard connectionAttempts == 0, let filter = deferredScan else { return }
        deferredScan = nil
        startScanning(filter: filter) { [weak self] result in
            if case .failure(let error) = result { self?.note("deferred discovery failed to start: \(error)") }
        }
    }

    /// Gives up a connection attempt that timed out, so the controller is free for the next one.
    private func abandon(_ path: String) {
        resolveWaiters.removeValue(forKey: path)
        guard let bus, state == .poweredOn else { return }
        Task {
            do { _ = try await self.call(bus, path, BlueZ.device, "Disconnect", timeout: 5) } catch {
                await self.onScheduler { self.note("Disconnect of \(path) after a timed-out attempt failed: \(error)") }
            }
        }
    }

    public func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        switch devicePath(address) {
        case .success(let path):
            guard objects[path, BlueZ.device]?["ServicesResolved"]?.boolValue == true else {
                completion(.failure(.notConnected)); return
            }
            completion(.success(objects.services(device: path)))
        case .failure(let e):
            completion(.failure(e))
        }
    }

    private func characteristic(_ address: RadioAddress, _ service: BluetoothUUID, _ characteristic: BluetoothUUID) -> Result<String, TransportError> {
        devicePath(address).flatMap { objects.characteristicPath(device: $0, service: service, characteristic: characteristic) }
    }

    /// A read on a link the peer opened (both nodes reading each other at once: guest run
    /// bluez-trixie-010041, where alpha's reads of beta failed three times in a run because beta
    /// closed the link it had opened, after its own read) is tried once more on a connection of
    /// our own when the peer closed it under the read.
    public func read(_ address: RadioAddress, service: BluetoothUUID, characteristic uuid: BluetoothUUID,
                     completion: @escaping (Result<Data, TransportError>) -> Void) {
        readOnce(address, service: service, characteristic: uuid) { [weak self] result in
            guard let self, case .failure(let error) = result, let timeout = self.borrowedLinks.removeValue(forKey: address),
                  Self.saysNotConnected(error) || self.linkIsDown(address) else { completion(result); return }
            self.note("read from \(address) failed (\(error)) as the peer closed the link it had opened; connecting on our own and reading again")
            self.outgoing.remove(address)
            self.connect(address, timeout: timeout, borrowing: false) { connected in
                switch connected {
                case .success: self.readOnce(address, service: service, characteristic: uuid, completion)
                case .failure(let e): completion(.failure(e))
                }
            }
        }
    }

    /// bluetoothd's answer to a GATT call on a link that has gone: NotConnected, or (5.82's
    /// ReadValue) Failed "Not connected". Its PropertiesChanged may be handled after the answer.
    static func saysNotConnected(_ error: TransportError) -> Bool {
        if case .notConnected = error { return true }
        return "\(error)".hasSuffix(": Not connected")
    }

    private func linkIsDown(_ address: RadioAddress) -> Bool {
        guard case .success(let device) = devicePath(address) else { return true }
        return objects[device, BlueZ.device]?["Connected"]?.boolValue != true
    }

    private func readOnce(_ address: RadioAddress, service: BluetoothUUID, characteristic uuid: BluetoothUUID,
                          _ completion: @escaping (Result<Data, TransportError>) -> Void) {
        let path: String
        switch characteristic(address, service, uuid) {
        case .success(let p): path = p
        case .failure(let e): completion(.failure(e)); return
        }
        perform("ReadValue \(address)", completion) { bus in
            for attempt in 1...3 {
                do {
                    let reply = try await self.call(bus, path, BlueZ.gattCharacteristic, "ReadValue", [.variantDictionary([:])])
                    guard let bytes = reply.first?.bytesValue else { throw TransportError.failed("ReadValue returned no bytes") }
                    return Data(bytes)
                } catch where BlueZError.isNamed(error, "InProgress") && attempt < 3 {
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            throw TransportError.inProgress
        }
    }

    public func write(_ address: RadioAddress, service: BluetoothUUID, characteristic uuid: BluetoothUUID, value: Data,
                      withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        let path: String
        switch characteristic(address, service, uuid) {
        case .success(let p): path = p
        case .failure(let e): completion(.failure(e)); return
        }
        let options = DBusValue.variantDictionary(["type": .string(withResponse ? "request" : "command")])
        perform("WriteValue \(address)", completion) { bus in
            _ = try await self.call(bus, path, BlueZ.gattCharacteristic, "WriteValue", [.bytes([UInt8](value)), options])
        }
    }

    public func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) {
        outgoing.remove(address)
        borrowedLinks.removeValue(forKey: address)
        guard case .success(let path) = devicePath(address) else { completion(.success(())); return }
        perform("Disconnect \(address)", completion) { bus in
            do {
                _ = try await self.call(bus, path, BlueZ.device, "Disconnect")
            } catch where BlueZError.isNamed(error, "NotConnected") {
            }
        }
    }
}
