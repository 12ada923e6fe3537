import Foundation
import HeraldCore
import HeraldRadio

/// One node's radio on a `SimMedium`: the `BLETransport` the sensor uses in simulations.
/// Operations answer after the medium's latencies; every waiting operation ends within its
/// timeout with a result or a typed error, as on BlueZ.
public final class SimTransport: BLETransport {
    public weak var delegate: (any BLETransportDelegate)?
    public private(set) var state: RadioState = .poweredOff
    public var scheduler: any Scheduler { medium.clock(of: index) }
    private let medium: SimMedium
    public let index: Int
    private var wantsPower = false
    /// false: the radio cannot advertise (a receive-only phone); startAdvertising answers
    /// notSupported, as a controller without LE advertising does.
    public var canAdvertise = true

    init(medium: SimMedium, index: Int) {
        self.medium = medium
        self.index = index
    }

    /// The node's current MAC.
    public var address: RadioAddress { medium.address(of: index) }

    private var gatt: TimeInterval { medium.parameters.gattLatency }

    private func answer<T>(after delay: TimeInterval, _ completion: @escaping (Result<T, TransportError>) -> Void, _ result: @escaping () -> Result<T, TransportError>) {
        scheduler.schedule(after: delay) { completion(result()) }
    }

    private func requirePower<T>(_ completion: @escaping (Result<T, TransportError>) -> Void) -> Bool {
        guard state == .poweredOn else {
            answer(after: 0, completion) { .failure(.adapterUnavailable("simulated node \(self.index) is powered off")) }
            return false
        }
        return true
    }

    // MARK: Medium callbacks

    func radioStateChanged(_ newState: RadioState) {
        if newState == .poweredOn && !wantsPower { return }
        state = newState
        delegate?.transport(didUpdateState: newState)
    }

    @inline(__always) func deliver(_ report: ScanReport) {
        delegate?.transport(didReceive: report)
    }

    func linkLost(_ address: RadioAddress) {
        delegate?.transport(didDisconnect: address)
    }

    // MARK: BLETransport

    public func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) {
        wantsPower = true
        answer(after: 0, completion) {
            guard self.medium.isPowered(self.index) else { return .failure(.adapterUnavailable("simulated node is powered off")) }
            self.state = .poweredOn
            return .success(())
        }
    }

    public func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard requirePower(completion) else { return }
        medium.register(index, service: service, server: server)
        answer(after: gatt, completion) { .success(()) }
    }

    public func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard requirePower(completion) else { return }
        guard canAdvertise else {
            answer(after: gatt, completion) { .failure(.notSupported("advertising (this simulated phone cannot advertise)")) }
            return
        }
        medium.startAdvertising(index, advertisement)
        answer(after: gatt, completion) { .success(()) }
    }

    public func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) {
        medium.stopAdvertising(index)
        answer(after: 0, completion) { .success(()) }
    }

    public func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard requirePower(completion) else { return }
        medium.setScanning(index, true)
        answer(after: 0, completion) { .success(()) }
    }

    public func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) {
        medium.setScanning(index, false)
        answer(after: 0, completion) { .success(()) }
    }

    public func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        guard requirePower(completion) else { return }
        guard let target = medium.target(address) else {
            answer(after: gatt, completion) { .failure(.deviceNotFound(address)) }
            return
        }
        if medium.isLinked(index, target) { answer(after: 0, completion) { .success(()) }; return }
        guard medium.isPowered(target), medium.inRange(target, index) else {
            answer(after: timeout, completion) { .failure(.timeout("connect to \(address)")) }
            return
        }
        let limited = medium.connectionLimit != nil
        if limited {
            // A controller at its limit refuses to initiate; a target at its limit stops being
            // connectable, so the attempt waits for its timeout.
            guard medium.takeSlot(index) else {
                medium.connectionsRefused += 1
                answer(after: gatt, completion) { .failure(.connectionFailed("connection-limit-exceeded")) }
                return
            }
            if !medium.hasFreeSlot(target) {
                medium.connectionsRefused += 1
                answer(after: timeout, completion) {
                    self.medium.releaseSlot(self.index)
                    return .failure(.timeout("connect to \(address)"))
                }
                return
            }
        }
        let (ok, latency) = medium.connectionAttempt(central: index, target: target)
        if latency > timeout {
            answer(after: timeout, completion) {
                if limited { self.medium.releaseSlot(self.index) }
                return .failure(.timeout("connect to \(address)"))
            }
            return
        }
        answer(after: latency, completion) {
            // The target may have gone (power, MAC rotation) meanwhile.
            guard self.state == .poweredOn, self.medium.target(address) == target, self.medium.isPowered(target) else {
                if limited { self.medium.releaseSlot(self.index) }
                return .failure(.connectionFailed("le-connection-abort-by-remote"))
            }
            guard ok else {
                if limited { self.medium.releaseSlot(self.index) }
                return .failure(.connectionFailed("le-connection-abort-by-local"))
            }
            if limited && !self.medium.hasFreeSlot(target) {
                self.medium.releaseSlot(self.index)
                self.medium.connectionsRefused += 1
                return .failure(.connectionFailed("le-connection-abort-by-remote"))
            }
            if !self.medium.link(self.index, target), limited { self.medium.releaseSlot(self.index) }
            return .success(())
        }
    }

    private func linked(_ address: RadioAddress) -> Int? {
        guard let target = medium.target(address), medium.isLinked(index, target) else { return nil }
        return target
    }

    public func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        answer(after: gatt + (medium.crowding?.discoveryTime ?? 0), completion) {
            guard let target = self.linked(address) else { return .failure(.notConnected) }
            return .success(self.medium.services(of: target))
        }
    }

    public func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void) {
        guard let target = linked(address) else { answer(after: gatt, completion) { .failure(.notConnected) }; return }
        guard let svc = medium.services(of: target).first(where: { $0.uuid == service }) else {
            answer(after: gatt, completion) { .failure(.serviceNotFound(service)) }; return
        }
        guard svc.characteristics.contains(where: { $0.uuid == characteristic && $0.properties.contains(.read) }) else {
            answer(after: gatt, completion) { .failure(.characteristicNotFound(characteristic)) }; return
        }
        // A long read: Read, then Read Blob at growing offsets while full chunks come back.
        let chunk = max(1, medium.parameters.mtu - 1)
        let central = medium.address(of: index)
        var value = Data()
        var roundTrips = 0
        var outcome: Result<Data, TransportError>?
        while outcome == nil {
            roundTrips += 1
            guard let server = medium.server(of: target) else { outcome = .failure(.failed("no GATT server")); break }
            switch server.gattRead(characteristic: characteristic, offset: value.count, central: central) {
            case .failure(let e): outcome = .failure(Self.map(e))
            case .success(let data):
                let part = data.prefix(chunk)
                value.append(part)
                if part.count < chunk || roundTrips > 64 { outcome = .success(value) }
            }
        }
        let result = outcome!
        answer(after: gatt * Double(roundTrips), completion) {
            guard self.linked(address) != nil else { return .failure(.notConnected) }
            return result
        }
    }

    public func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        answer(after: gatt, completion) {
            guard let target = self.linked(address) else { return .failure(.notConnected) }
            guard self.medium.services(of: target).contains(where: { $0.uuid == service && $0.characteristics.contains { $0.uuid == characteristic } }) else {
                return .failure(.characteristicNotFound(characteristic))
            }
            guard let server = self.medium.server(of: target) else { return .failure(.failed("no GATT server")) }
            switch server.gattWrite(characteristic: characteristic, value: value, offset: 0, central: self.medium.address(of: self.index)) {
            case .success: return .success(())
            case .failure(let e): return withResponse ? .failure(Self.map(e)) : .success(())
            }
        }
    }

    public func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) {
        if let target = medium.target(address) { medium.unlink(index, target, notifyCentral: false) }
        answer(after: 0, completion) { .success(()) }
    }

    static func map(_ e: ATTError) -> TransportError {
        switch e {
        case .invalidOffset: return .invalidOffset
        case .invalidValueLength: return .invalidValueLength
        case .notPermitted: return .notPermitted
        case .notSupported: return .notSupported("ATT request")
        case .failed(let why): return .failed(why)
        }
    }
}
