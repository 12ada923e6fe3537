import Foundation
import HeraldCore
import HeraldRadio
import RadioSim

/// The `BLETransport` of a node whose radio is the air: every call goes to `herald-lab air`
/// over TCP and every answer and event comes back onto this node's scheduler.
public final class AirTransport: BLETransport, @unchecked Sendable {
    public weak var delegate: (any BLETransportDelegate)?
    public private(set) var state: RadioState = .poweredOff
    public var scheduler: any Scheduler { dispatch }
    private let dispatch: DispatchScheduler
    private let socket: LineSocket
    private var nextID = 0
    private var pending: [Int: (AirMessage) -> Void] = [:]
    private weak var server: (any GATTServerDelegate)?
    private var readable: [BluetoothUUID] = []
    private var refresh: ScheduledTask?
    /// This node's MAC in the medium.
    public private(set) var address: RadioAddress?

    /// Connects to the air and attaches a node at (x, y) metres.
    public init(host: String, port: UInt16, node: String, x: Double, y: Double, parameters: RadioParameters, scheduler: DispatchScheduler) throws {
        dispatch = scheduler
        socket = try LineSocket.connect(host: host, port: port)
        socket.startReading(onMessage: { [weak self] m in
            guard let self else { return }
            self.dispatch.execute { self.received(m) }
        }, onClose: { [weak self] in
            guard let self else { return }
            self.dispatch.execute {
                self.state = .unavailable
                let waiting = self.pending
                self.pending.removeAll()
                var failure = AirMessage("reply")
                failure.ok = false
                failure.errorKind = "adapterUnavailable"
                failure.error = "the air closed the connection"
                for (_, c) in waiting.sorted(by: { $0.key < $1.key }) { c(failure) }
                self.delegate?.transport(didUpdateState: .unavailable)
            }
        })
        var hello = AirMessage("hello", id: 0)
        hello.node = node
        hello.x = x
        hello.y = y
        hello.parameters = parameters
        socket.send(hello)
    }

    deinit { socket.close() }

    public func close() {
        refresh?.cancel()
        socket.close()
    }

    private func received(_ m: AirMessage) {
        switch m.t {
        case "hello": address = m.address.map { RadioAddress($0) }
        case "reply":
            if let id = m.id, let c = pending.removeValue(forKey: id) { c(m) }
        case "report":
            guard let a = m.address, let rssi = m.rssi else { return }
            delegate?.transport(didReceive: ScanReport(address: RadioAddress(a), rssi: rssi, txPower: m.txPower,
                                                      manufacturerData: AirMessage.mfr(m.mfr), serviceUUIDs: (m.uuids ?? []).compactMap(BluetoothUUID.init)))
        case "state":
            if let s = m.state.flatMap(RadioState.init) { state = s; delegate?.transport(didUpdateState: s) }
        case "disconnected":
            if let a = m.address { delegate?.transport(didDisconnect: RadioAddress(a)) }
        case "gattRead":
            if let c = m.characteristic.flatMap(BluetoothUUID.init) { _ = server?.gattRead(characteristic: c, offset: m.offset ?? 0, central: RadioAddress(m.central ?? "")) }
        case "gattWrite":
            if let c = m.characteristic.flatMap(BluetoothUUID.init), let v = m.value.flatMap({ Data(base64Encoded: $0) }) {
                _ = server?.gattWrite(characteristic: c, value: v, offset: m.offset ?? 0, central: RadioAddress(m.central ?? ""))
            }
        case "centralDisconnected":
            if let c = m.central { server?.gattCentralDisconnected(RadioAddress(c)) }
        default: break
        }
    }

    private func call(_ m: AirMessage, _ done: @escaping (AirMessage) -> Void) {
        nextID += 1
        var msg = m
        msg.id = nextID
        pending[nextID] = done
        socket.send(msg)
    }

    private func simple(_ m: AirMessage, _ completion: @escaping (Result<Void, TransportError>) -> Void) {
        call(m) { r in completion(r.ok == true ? .success(()) : .failure(AirMessage.transportError(kind: r.errorKind, r.error))) }
    }

    /// The current full value of each readable characteristic, from this node's GATT server.
    private func currentValues() -> [String: String] {
        var out = [String: String]()
        for c in readable {
            if case .success(let d)? = server?.gattRead(characteristic: c, offset: 0, central: RadioAddress("00:00:00:00:00:00")) { out[c.uuidString] = d.base64EncodedString() }
        }
        return out
    }

    public func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) {
        simple(AirMessage("powerOn")) { [weak self] r in
            if case .success = r { self?.state = .poweredOn }
            completion(r)
        }
    }

    public func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void) {
        self.server = server
        readable = service.characteristics.filter { $0.properties.contains(.read) }.map(\.uuid)
        var m = AirMessage("register")
        m.services = [AirMessage.wire(service)]
        m.values = currentValues()
        simple(m, completion)
        refresh?.cancel()
        refresh = dispatch.scheduleRepeating(every: 10) { [weak self] in
            guard let self else { return }
            var v = AirMessage("values")
            v.values = self.currentValues()
            self.socket.send(v)
        }
    }

    public func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) {
        var m = AirMessage("startAdvertising")
        m.uuids = advertisement.serviceUUIDs.map(\.uuidString)
        m.mfr = AirMessage.mfrWire(advertisement.manufacturerData)
        m.txPower = advertisement.txPower
        m.includeTxPower = advertisement.includeTxPower
        m.interval = advertisement.interval
        simple(m, completion)
    }

    public func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) { simple(AirMessage("stopAdvertising"), completion) }
    public func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) { simple(AirMessage("startScanning"), completion) }
    public func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) { simple(AirMessage("stopScanning"), completion) }

    public func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        var m = AirMessage("connect")
        m.address = address.value
        m.timeout = timeout
        // The air bounds the attempt by `timeout`; this bounds it again should the air fall silent.
        var done = false
        let guardTask = dispatch.schedule(after: timeout + 2) {
            guard !done else { return }
            done = true
            completion(.failure(.timeout("connect to \(address) (no answer from the air)")))
        }
        simple(m) { r in
            guard !done else { return }
            done = true
            guardTask.cancel()
            completion(r)
        }
    }

    public func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        var m = AirMessage("discover")
        m.address = address.value
        call(m) { r in
            completion(r.ok == true ? .success((r.services ?? []).compactMap(AirMessage.service)) : .failure(AirMessage.transportError(kind: r.errorKind, r.error)))
        }
    }

    public func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void) {
        var m = AirMessage("read")
        m.address = address.value
        m.service = service.uuidString
        m.characteristic = characteristic.uuidString
        call(m) { r in
            if r.ok == true, let v = r.value.flatMap({ Data(base64Encoded: $0) }) { completion(.success(v)) } else {
                completion(.failure(AirMessage.transportError(kind: r.errorKind, r.error)))
            }
        }
    }

    public func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        var m = AirMessage("write")
        m.address = address.value
        m.service = service.uuidString
        m.characteristic = characteristic.uuidString
        m.value = value.base64EncodedString()
        m.withResponse = withResponse
        simple(m, completion)
    }

    public func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) {
        var m = AirMessage("disconnect")
        m.address = address.value
        simple(m, completion)
    }
}
