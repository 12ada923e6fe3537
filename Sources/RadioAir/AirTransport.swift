import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet

/// The `BLETransport` of a node whose radio is the air: every call goes to `herald-lab air`
/// over TCP and every answer and event comes back onto this node's scheduler.
///
/// Not Sendable, like every transport under the `Scheduler` seam: it is used on its scheduler's
/// queue only. The socket's callbacks (on its event loop) and the reconnect (off the queue) hop
/// back onto the queue before they touch it.
public final class AirTransport: BLETransport {
    public weak var delegate: (any BLETransportDelegate)?
    public private(set) var state: RadioState = .poweredOff
    public var scheduler: any Scheduler { dispatch }
    private let dispatch: DispatchScheduler
    private var socket: LineSocket
    private var nextID = 0
    private var pending: [Int: (AirOutcome) -> Void] = [:]
    private weak var server: (any GATTServerDelegate)?
    private var readable: [BluetoothUUID] = []
    private var refresh: ScheduledTask?
    /// This node's MAC in the medium.
    public private(set) var address: RadioAddress?

    /// Where to reattach after the connection is lost.
    private let host: String
    private let port: UInt16
    private let tls: TLSContext?
    private let hello: AirRequest
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
        hello = AirRequest(id: 0, .hello(AirHello(node: node, x: x, y: y, parameters: parameters, token: token, ticket: ticket)))
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
        // The transport, held weakly, crosses to the socket's event loop in the seam's box and
        // is only looked at back on the queue.
        let me = UncheckedBox(Weak(self))
        let dispatch = self.dispatch
        s.startReading(AirAnswer.self, onMessage: { m in
            dispatch.execute { if let t = me.value.transport, t.socket === s { t.received(m) } }
        }, onClose: {
            dispatch.execute { if let t = me.value.transport, t.socket === s { t.lost("the air closed the connection") } }
        })
        s.send(hello)
    }

    private final class Weak {
        weak var transport: AirTransport?
        init(_ transport: AirTransport) { self.transport = transport }
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
        let failure = AirOutcome.failed(.adapterUnavailable("lost the air: \(reason)"))
        for (_, c) in waiting.sorted(by: { $0.key < $1.key }) { c(failure) }
        log?("radio lost: \(reason); reattaching every 2 s")
        delegate?.transport(didUpdateState: .unavailable)
        scheduleReattach()
    }

    private func scheduleReattach() {
        dispatch.schedule(after: 2) { [weak self] in
            guard let self, !self.closed, !self.attached else { return }
            let host = self.host, port = self.port, tls = self.tls
            let dispatch = self.dispatch
            // Carried off the queue and back (only used on the queue).
            let me = UncheckedBox(self)
            // Connecting blocks (name lookup, handshake): off the node's queue.
            DispatchQueue.global().async {
                let result = Result { try LineSocket.connect(host: host, port: port, tls: tls) }
                dispatch.execute {
                    let t = me.value
                    guard !t.closed, !t.attached else { if case .success(let s) = result { s.close() }; return }
                    switch result {
                    case .failure: t.scheduleReattach()
                    case .success(let s):
                        t.bestDelta = nil
                        t.lastHeard = t.now
                        t.attach(s)
                        t.simple(.powerOn, whileDetached: true) { [weak t] r in
                            guard let t, !t.closed else { return }
                            guard case .success = r else { t.scheduleReattach(); return }
                            t.attached = true
                            t.state = .poweredOn
                            let to = t.now
                            if let from = t.lostAt { t.onGap?(from, to, "radio lost: the connection to the air was down") }
                            t.lostAt = nil
                            t.log?("radio back: reattached to the air at \(host):\(port)")
                            t.delegate?.transport(didUpdateState: .poweredOn)
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

    private func received(_ m: AirAnswer) {
        lastHeard = now
        let fresh = isFresh(m.at)
        switch m.news {
        case .tick, .noticeTaken, .noticeRefused: break
        case .refused(let why):
            log?("radio: the air refused this node: \(why)")
            address = nil
        case .attached(let a): address = a
        case .reply(let outcome):
            if let id = m.id, let c = pending.removeValue(forKey: id) { c(outcome) }
        case .report(let report):
            guard fresh else {
                staleDropped += 1
                if staleDropped == 1 || staleDropped.isMultiple(of: 100) {
                    log?("radio: dropped \(staleDropped) report(s) that reached this node more than \(staleLimit) s late (paused process or link); they are not logged")
                }
                return
            }
            delegate?.transport(didReceive: report)
        case .state(let s):
            state = s
            delegate?.transport(didUpdateState: s)
        case .disconnected(let a): delegate?.transport(didDisconnect: a)
        case .gattRead(let c, let offset, let central): _ = server?.gattRead(characteristic: c, offset: offset, central: central)
        case .gattWrite(let c, let v, let offset, let central): _ = server?.gattWrite(characteristic: c, value: v, offset: offset, central: central)
        case .centralDisconnected(let c): server?.gattCentralDisconnected(c)
        }
    }

    /// Sends a request; while the link is down it fails at once, except for the reattaching
    /// handshake itself (`whileDetached`).
    private func call(_ c: AirCall, whileDetached: Bool = false, _ done: @escaping (AirOutcome) -> Void) {
        guard attached || whileDetached else {
            dispatch.execute { done(.failed(.adapterUnavailable("the link to the air is down"))) }
            return
        }
        nextID += 1
        pending[nextID] = done
        socket.send(AirRequest(id: nextID, c))
    }

    private func simple(_ c: AirCall, whileDetached: Bool = false, _ completion: @escaping (Result<Void, TransportError>) -> Void) {
        call(c, whileDetached: whileDetached) { completion($0.voidResult) }
    }

    /// The current full value of each readable characteristic, from this node's GATT server.
    private func currentValues() -> [BluetoothUUID: Data] {
        var out = [BluetoothUUID: Data]()
        for c in readable {
            if case .success(let d)? = server?.gattRead(characteristic: c, offset: 0, central: RadioAddress("00:00:00:00:00:00")) { out[c] = d }
        }
        return out
    }

    public func powerOn(completion: @escaping (Result<Void, TransportError>) -> Void) {
        simple(.powerOn) { [weak self] r in
            if case .success = r { self?.state = .poweredOn }
            completion(r)
        }
    }

    public func register(service: GATTService, server: any GATTServerDelegate, completion: @escaping (Result<Void, TransportError>) -> Void) {
        self.server = server
        readable = service.characteristics.filter { $0.properties.contains(.read) }.map(\.uuid)
        simple(.register(service, values: currentValues()), completion)
        refresh?.cancel()
        refresh = dispatch.scheduleRepeating(every: 10) { [weak self] in
            guard let self else { return }
            self.socket.send(AirRequest(.values(self.currentValues())))
        }
    }

    public func startAdvertising(_ advertisement: Advertisement, completion: @escaping (Result<Void, TransportError>) -> Void) {
        simple(.startAdvertising(advertisement), completion)
    }

    public func stopAdvertising(completion: @escaping (Result<Void, TransportError>) -> Void) { simple(.stopAdvertising, completion) }
    public func startScanning(filter: ScanFilter, completion: @escaping (Result<Void, TransportError>) -> Void) { simple(.startScanning, completion) }
    public func stopScanning(completion: @escaping (Result<Void, TransportError>) -> Void) { simple(.stopScanning, completion) }

    public func connect(_ address: RadioAddress, timeout: TimeInterval, completion: @escaping (Result<Void, TransportError>) -> Void) {
        // The air bounds the attempt by `timeout`; this bounds it again should the air fall silent.
        var done = false
        let guardTask = dispatch.schedule(after: timeout + 2) {
            guard !done else { return }
            done = true
            completion(.failure(.timeout("connect to \(address) (no answer from the air)")))
        }
        simple(.connect(address, timeout: timeout)) { r in
            guard !done else { return }
            done = true
            guardTask.cancel()
            completion(r)
        }
    }

    public func discoverServices(_ address: RadioAddress, completion: @escaping (Result<[GATTService], TransportError>) -> Void) {
        call(.discover(address)) { r in
            switch r {
            case .services(let s): completion(.success(s))
            case .done: completion(.success([]))
            case .value: completion(.failure(.failed("the air answered a discovery with a value")))
            case .failed(let e): completion(.failure(e))
            }
        }
    }

    public func read(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, completion: @escaping (Result<Data, TransportError>) -> Void) {
        call(.read(address, service: service, characteristic: characteristic)) { r in
            switch r {
            case .value(let v): completion(.success(v))
            case .done, .services: completion(.failure(.failed("the air answered a read without a value")))
            case .failed(let e): completion(.failure(e))
            }
        }
    }

    public func write(_ address: RadioAddress, service: BluetoothUUID, characteristic: BluetoothUUID, value: Data, withResponse: Bool, completion: @escaping (Result<Void, TransportError>) -> Void) {
        simple(.write(address, service: service, characteristic: characteristic, value: value, withResponse: withResponse), completion)
    }

    public func disconnect(_ address: RadioAddress, completion: @escaping (Result<Void, TransportError>) -> Void) {
        simple(.disconnect(address), completion)
    }
}
