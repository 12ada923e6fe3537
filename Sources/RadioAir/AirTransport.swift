import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet

/// The `BLETransport` of a node whose radio is the air: every call goes to `herald-lab air`
/// over TCP and every answer and event comes back onto this node's scheduler.
public final class AirTransport: BLETransport, @unchecked Sendable {
    public weak var delegate: (any BLETransportDelegate)?
    public private(set) var state: RadioState = .poweredOff
    public var scheduler: any Scheduler { dispatch }
    private let dispatch: DispatchScheduler
    private var socket: LineSocket
    private var nextID = 0
    private var pending: [Int: (AirMessage) -> Void] = [:]
    private weak var server: (any GATTServerDelegate)?
    private var readable: [BluetoothUUID] = []
    private var refresh: ScheduledTask?
    /// This node's MAC in the medium.
    public private(set) var address: RadioAddress?

    /// Where to reattach after the connection is lost.
    private let host: String
    private let port: UInt16
    private let tls: TLSContext?
    private let hello: AirMessage
    /// Whether the link to the air is up (hello answered); false while reconnecting.
    private var attached = true
    private var closed = false
    /// Local time of the last message from the air, and when the link was declared lost.
    private var lastHeard: Double
    private var lostAt: Double?
    private var watchdog: ScheduledTask?
    /// Smallest (local receive time − air send time) seen on this connection: the clock offset
    /// plus the one-way delay at its best. A message that arrives much later than that waited in
    /// a buffer and its report did not happen now.
    private var bestDelta: Double?
    private var staleSince: Double?
    public private(set) var staleDropped = 0
    /// The link to the air is declared lost after this long without a word (the air ticks every second).
    public var silenceLimit: Double = 5
    /// A report older than this (beyond the best delay seen) is dropped, not logged with a wrong time.
    public var staleLimit: Double = 1.5
    /// Diagnostics (radio lost, reattached, stale reports dropped) for the node's log.txt.
    public var log: ((String) -> Void)?
    /// Called on the scheduler when the node could not have logged from `from` to `to` (seconds since 1970).
    public var onGap: ((_ from: Double, _ to: Double, _ reason: String) -> Void)?

    /// Connects to the air and attaches a node at (x, y) metres. If the connection is lost later
    /// (the air stops, the link goes down), the transport reports the radio unavailable, reattaches
    /// every 2 s, and reports it powered on again once the air answers.
    public init(host: String, port: UInt16, node: String, x: Double, y: Double, parameters: RadioParameters, token: String? = nil, ticket: String? = nil, tls: TLSContext? = nil, scheduler: DispatchScheduler) throws {
        dispatch = scheduler
        self.host = host
        self.port = port
        self.tls = tls
        var hello = AirMessage("hello", id: 0)
        hello.node = node
        hello.x = x
        hello.y = y
        hello.parameters = parameters
        hello.token = token
        hello.ticket = ticket
        self.hello = hello
        socket = try LineSocket.connect(host: host, port: port, tls: tls)
        lastHeard = Date().timeIntervalSince1970
        attach(socket)
        watchdog = dispatch.scheduleRepeating(every: 1) { [weak self] in self?.checkSilence() }
    }

    /// Checks that the air at `host:port` accepts a connection (a pre-flight before arming).
    public static func probe(host: String, port: UInt16, tls: TLSContext? = nil, timeout: TimeInterval = 3) throws {
        let s = try LineSocket.connect(host: host, port: port, tls: tls, timeout: timeout)
        s.close()
    }

    deinit { socket.close() }

    public func close() {
        closed = true
        refresh?.cancel()
        watchdog?.cancel()
        socket.close()
    }

    private var now: Double { Date().timeIntervalSince1970 }

    private func attach(_ s: LineSocket) {
        socket = s
        s.startReading(onMessage: { [weak self] m in
            guard let self else { return }
            self.dispatch.execute { if self.socket === s { self.received(m) } }
        }, onClose: { [weak self] in
            guard let self else { return }
            self.dispatch.execute { if self.socket === s { self.lost("the air closed the connection") } }
        })
        s.send(hello)
    }

    private func checkSilence() {
        guard attached, !closed, now - lastHeard > silenceLimit else { return }
        lost(String(format: "no word from the air at %@:%d for %.0f s", host, Int(port), now - lastHeard))
    }

    /// The link is gone: fail what is pending, report the radio unavailable, reattach later.
    private func lost(_ reason: String) {
        guard attached, !closed else { return }
        attached = false
        lostAt = lastHeard
        socket.close()
        state = .unavailable
        let waiting = pending
        pending.removeAll()
        var failure = AirMessage("reply")
        failure.ok = false
        failure.errorKind = "adapterUnavailable"
        failure.error = "lost the air: \(reason)"
        for (_, c) in waiting.sorted(by: { $0.key < $1.key }) { c(failure) }
        log?("radio lost: \(reason); reattaching every 2 s")
        delegate?.transport(didUpdateState: .unavailable)
        scheduleReattach()
    }

    private func scheduleReattach() {
        dispatch.schedule(after: 2) { [weak self] in
            guard let self, !self.closed, !self.attached else { return }
            let host = self.host, port = self.port, tls = self.tls
            // Connecting blocks (name lookup, handshake): off the node's queue.
            DispatchQueue.global().async {
                let result = Result { try LineSocket.connect(host: host, port: port, tls: tls) }
                self.dispatch.execute {
                    guard !self.closed, !self.attached else { if case .success(let s) = result { s.close() }; return }
                    switch result {
                    case .failure: self.scheduleReattach()
                    case .success(let s):
                        self.bestDelta = nil
                        self.lastHeard = self.now
                        self.attach(s)
                        self.simple(AirMessage("powerOn"), whileDetached: true) { [weak self] r in
                            guard let self, !self.closed else { return }
                            guard case .success = r else { self.scheduleReattach(); return }
                            self.attached = true
                            self.state = .poweredOn
                            let to = self.now
                            if let from = self.lostAt { self.onGap?(from, to, "radio lost: the connection to the air was down") }
                            self.lostAt = nil
                            self.log?("radio back: reattached to the air at \(host):\(port)")
                            self.delegate?.transport(didUpdateState: .poweredOn)
                        }
                    }
                }
            }
        }
    }

    /// Whether a message sent by the air at `at` arrives fresh. Keeps the best delta seen; if every
    /// message has looked stale for 30 s the clocks must have stepped, and the estimate restarts.
    private func isFresh(_ at: Double?) -> Bool {
        guard let at, at.isFinite else { return true }
        let delta = now - at
        guard let best = bestDelta else { bestDelta = delta; return true }
        if delta < best { bestDelta = delta; staleSince = nil; return true }
        if delta - best <= staleLimit { staleSince = nil; return true }
        if let since = staleSince, now - since > 30 {
            bestDelta = delta
            staleSince = nil
            log?("radio: the air's clock moved against ours; delay estimate restarted")
            return true
        }
        if staleSince == nil { staleSince = now }
        return false
    }

    private func received(_ m: AirMessage) {
        lastHeard = now
        let fresh = isFresh(m.at)
        switch m.t {
        case "tick": break
        case "hello":
            if m.ok == false { log?("radio: the air refused this node: \(m.error ?? "no reason given")") }
            address = m.address.map { RadioAddress($0) }
        case "reply":
            if let id = m.id, let c = pending.removeValue(forKey: id) { c(m) }
        case "report":
            guard let a = m.address, let rssi = m.rssi else { return }
            guard fresh else {
                staleDropped += 1
                if staleDropped == 1 || staleDropped.isMultiple(of: 100) {
                    log?("radio: dropped \(staleDropped) report(s) that reached this node more than \(staleLimit) s late (paused process or link); they are not logged")
                }
                return
            }
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

    /// Sends a request; while the link is down it fails at once, except for the reattaching
    /// handshake itself (`whileDetached`).
    private func call(_ m: AirMessage, whileDetached: Bool = false, _ done: @escaping (AirMessage) -> Void) {
        guard attached || whileDetached else {
            var failure = AirMessage("reply")
            failure.ok = false
            failure.errorKind = "adapterUnavailable"
            failure.error = "the link to the air is down"
            dispatch.execute { done(failure) }
            return
        }
        nextID += 1
        var msg = m
        msg.id = nextID
        pending[nextID] = done
        socket.send(msg)
    }

    private func simple(_ m: AirMessage, whileDetached: Bool = false, _ completion: @escaping (Result<Void, TransportError>) -> Void) {
        call(m, whileDetached: whileDetached) { r in completion(r.ok == true ? .success(()) : .failure(AirMessage.transportError(kind: r.errorKind, r.error))) }
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
