import Foundation
import HeraldCore
import HeraldRadio

/// A transport whose peers are scripted by the test: the test injects advertising reports and
/// defines what each address serves, and the transport answers operations after fixed latencies
/// on the virtual scheduler. Used to drive exact engine sequences; the simulated radio covers
/// the same engine end to end.
final class ScriptedTransport: BLETransport {
    struct Peer {
        var services: [GATTService]
        var payload: Data?
        var connectable = true
        var writes: [Data] = []
    }

    weak var delegate: (any BLETransportDelegate)?
    var state: RadioState = .poweredOff
    let scheduler: any Scheduler
    var peers: [RadioAddress: Peer] = [:]
    var advertisements: [Advertisement] = []
    var advertisingFails = false
    /// Advertising fails with a passing error this many times, then works.
    var advertisingFailuresLeft = 0
    var scanning = false
    var calls: [String] = []
    /// When each connect was called, in seconds since the scheduler's start.
    var connectTimes: [TimeInterval] = []
    private let started: Date
    weak var server: (any GATTServerDelegate)?
    var latency: TimeInterval = 0.05

    init(scheduler: any Scheduler) { self.scheduler = scheduler; started = scheduler.now }

    static func heraldPeer(payload: PayloadData) -> Peer {
        Peer(services: [GATTService(uuid: HeraldUUIDs.service, characteristics: [
            GATTCharacteristic(uuid: HeraldUUIDs.payloadCharacteristic, properties: [.read]),
            GATTCharacteristic(uuid: HeraldUUIDs.androidSignalCharacteristic, properties: [.write]),
        ])], payload: payload.data)
    }

    static func iosPeer(payload: PayloadData) -> Peer {
        Peer(services: [GATTService(uuid: HeraldUUIDs.service, characteristics: [
            GATTCharacteristic(uuid: HeraldUUIDs.payloadCharacteristic, properties: [.read]),
            GATTCharacteristic(uuid: HeraldUUIDs.iosSignalCharacteristic, properties: [.write, .notify]),
        ])], payload: payload.data)
    }

    private func later<T>(_ value: T, _ completion: @escaping (T) -> Void) {
        scheduler.schedule(after: latency) { completion(value) }
    }

    func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) {
        state = .poweredOn
        calls.append("powerOn")
        later(.success(()), completion)
    }
    func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void) {
        self.server = server
        calls.append("register")
        later(.success(()), completion)
    }
    func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) {
        calls.append("startAdvertising")
        if advertisingFails { later(.failure(.notSupported("advertising")), completion); return }
        if advertisingFailuresLeft > 0 {
            advertisingFailuresLeft -= 1
            later(.failure(.failed("RegisterAdvertisement: no such method (advertising manager not there yet)")), completion)
            return
        }
        advertisements.append(advertisement)
        later(.success(()), completion)
    }
    func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) {
        calls.append("stopAdvertising")
        later(.success(()), completion)
    }
    func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) {
        scanning = true
        later(.success(()), completion)
    }
    func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) {
        scanning = false
        later(.success(()), completion)
    }
    func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        calls.append("connect \(address)")
        connectTimes.append(scheduler.now.timeIntervalSince(started))
        guard let peer = peers[address] else { later(.failure(.deviceNotFound(address)), completion); return }
        guard peer.connectable else { scheduler.schedule(after: timeout) { completion(.failure(.timeout("connect"))) }; return }
        later(.success(()), completion)
    }
    func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        later(peers[address].map { .success($0.services) } ?? .failure(.notConnected), completion)
    }
    func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void) {
        calls.append("read \(address)")
        later(peers[address]?.payload.map { .success($0) } ?? .failure(.characteristicNotFound(characteristic)), completion)
    }
    func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        peers[address]?.writes.append(value)
        later(.success(()), completion)
    }
    func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) {
        later(.success(()), completion)
    }

    /// Delivers a report with exactly this manufacturer data and these services (only while scanning).
    func report(from address: RadioAddress, rssi: Int, manufacturer: [UInt16: Data] = [:], services: [BluetoothUUID] = []) {
        guard scanning else { return }
        delegate?.transport(didReceive: ScanReport(address: address, rssi: rssi, manufacturerData: manufacturer, serviceUUIDs: services))
    }

    /// The radio goes off or comes back, as BlueZ reports Adapter1.Powered.
    func power(_ on: Bool) {
        state = on ? .poweredOn : .poweredOff
        if !on { scanning = false }
        delegate?.transport(didUpdateState: state)
    }

    /// Delivers an advert from `address` now (only while scanning, as a radio would).
    func advert(from address: RadioAddress, rssi: Int, pseudo: PseudoDeviceAddress? = nil, herald: Bool = true, apple: Bool = false, txPower: Int? = nil) {
        guard scanning else { return }
        var m: [UInt16: Data] = [:]
        if let pseudo { m[ManufacturerID.herald] = pseudo.data }
        if apple { m[ManufacturerID.apple] = Data([0x10, 0x05]) }
        delegate?.transport(didReceive: ScanReport(address: address, rssi: rssi, txPower: txPower, manufacturerData: m, serviceUUIDs: herald ? [HeraldUUIDs.service] : []))
    }
}

/// Records every delegate event as a compact line, in order.
final class EventRecorder: SensorDelegate {
    var events: [String] = []
    func sensor(_ sensor: SensorType, didDetect: TargetIdentifier) { events.append("detect \(didDetect)") }
    func sensor(_ sensor: SensorType, didRead: PayloadData, fromTarget: TargetIdentifier) { events.append("read \(fromTarget) \(didRead.shortName)") }
    func sensor(_ sensor: SensorType, didReceive: Data, fromTarget: TargetIdentifier) { events.append("receive \(fromTarget) \(didReceive.count)") }
    func sensor(_ sensor: SensorType, didShare: [PayloadData], fromTarget: TargetIdentifier) { events.append("share \(fromTarget) \(didShare.map(\.shortName).joined(separator: "+"))") }
    func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier) { events.append("measure \(fromTarget) \(didMeasure)") }
    func sensor(_ sensor: SensorType, didMeasure: Proximity, fromTarget: TargetIdentifier, withPayload: PayloadData) { events.append("measure+ \(fromTarget) \(withPayload.shortName)") }
    func sensor(_ sensor: SensorType, didUpdateState: SensorState) { events.append("state \(sensor) \(didUpdateState)") }
    func sensor(_ sensor: SensorType, available: Bool, didDeleteOrDetect: TargetIdentifier) { events.append("\(available ? "confirm" : "delete") \(didDeleteOrDetect)") }
}
