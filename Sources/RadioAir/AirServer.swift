import Foundation
import HeraldCore
import HeraldRadio
import RadioSim
import LabNet
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// Why a new connection was closed at once.
enum AirRefused: Error { case full }

/// `herald-lab air`: the simulated medium as a service on loopback, for many processes in real
/// time. It runs the same `SimMedium` and propagation model as the virtual-time simulator, on a
/// `DispatchScheduler`. Each node's process attaches with an `AirTransport` over TCP
/// (newline-delimited JSON); the air holds one `SimTransport` per attached node and relays.
///
/// Concurrency: the medium and the connections are the scheduler queue's (`q`, checked there);
/// the admission counts, the limits and the listeners are in a `Mutex`.
public final class AirServer: Sendable {
    public let scheduler: DispatchScheduler
    private let seed: UInt64
    private let defaultParameters: RadioParameters

    /// What only the scheduler's queue touches (the `Scheduler` seam: code driven by a
    /// `DispatchScheduler` runs on its queue).
    private final class OnQueue {
        var medium: SimMedium?
        /// By connection id.
        var nodes: [Int: AttachedNode] = [:]
        var nextConnection = 0
        /// Which tickets attach, given the coordinator's notices (run ended, agent revoked).
        var gate: NodeTicket.Gate?
        /// Connections that have not attached (no admitted hello yet).
        var unattached: [Int: Unattached] = [:]
        var ticks: ScheduledTask?
        init(gate: NodeTicket.Gate?) { self.gate = gate }
    }
    /// Invariant: only used on `scheduler.queue`; `q` checks that (dispatchPrecondition) on
    /// every access, so this box (HeraldRadio's carrier for the seam) is never read elsewhere.
    private let confined: UncheckedBox<OnQueue>
    private var q: OnQueue {
        dispatchPrecondition(condition: .onQueue(scheduler.queue))
        return confined.value
    }
    /// The air's log (label herald-lab.air): one line per event, node (and run and agent from
    /// its ticket) as metadata; its handler escapes outside text (LabLogHandler).
    public let logger: Logger

    /// Required in every node's hello when set (or a ticket, with `ticketKey`).
    private let token: String?
    /// Checks nodes' tickets (`NodeTicket`): a node with a valid ticket for its name attaches
    /// without the token, and only under that name.
    private let ticketKey: Data?

    public init(parameters: RadioParameters = RadioParameters(), seed: UInt64 = 1, token: String? = nil, ticketKey: Data? = nil,
                logger: Logger = Logger(label: "herald-lab.air")) {
        self.defaultParameters = parameters
        self.seed = seed
        self.token = token
        self.ticketKey = ticketKey
        let onQueue = OnQueue(gate: ticketKey.map { NodeTicket.Gate(key: $0) })
        confined = UncheckedBox(onQueue)
        self.logger = logger
        scheduler = DispatchScheduler(label: "heraldlab.air")
        // A tick a second to every node: lets a node tell a silent air from a dead link.
        // (Set here, before the air is shared: the first tick runs a second later, on the queue.)
        onQueue.ticks = scheduler.scheduleRepeating(every: 1) { [weak self] in
            guard let self else { return }
            for n in self.q.nodes.values { n.send(AirAnswer(.tick)) }
            self.dropLapsed()
        }
    }

    /// A connection must attach (its TLS handshake done and its hello admitted) within this many
    /// seconds of its accept, or it is closed: a stranger that connects and says nothing, or
    /// never finishes its handshake, holds nothing for long.
    public var helloTimeout: TimeInterval {
        get { admission.withLock { $0.helloTimeout } }
        set { admission.withLock { $0.helloTimeout = newValue } }
    }
    /// At most this many connections at once that have not attached yet (their TLS handshake
    /// or their hello still to come); beyond, a new one is closed at once. Attached nodes do
    /// not count.
    public var maxPending: Int {
        get { admission.withLock { $0.maxPending } }
        set { admission.withLock { $0.maxPending = newValue } }
    }
    /// At most this many of them from one peer address, so that one host cannot take every
    /// place (attached nodes do not count: one host may run many agents).
    public var maxPendingPerPeer: Int {
        get { admission.withLock { $0.maxPendingPerPeer } }
        set { admission.withLock { $0.maxPendingPerPeer = newValue } }
    }
    /// The longest line a connection may send before it has attached (a hello or a notice is a
    /// few hundred bytes): junk costs at most this much buffer per pending connection.
    public static let maxHelloLine = 64 << 10
    /// The connections not attached yet (in all and by peer), the limits above, and the
    /// listening channels (one per bound address), under one lock.
    private struct Admission {
        var pending = 0
        var pendingByPeer: [String: Int] = [:]
        var listeners: [Channel] = []
        var helloTimeout: TimeInterval = 10
        var maxPending = 256
        var maxPendingPerPeer = 64
    }
    private let admission = Mutex(Admission())

    /// Takes a place among the pending connections for `peer`, if there is one.
    private func takePending(_ peer: String) -> Bool {
        admission.withLock { a in
            guard a.pending < a.maxPending, a.pendingByPeer[peer, default: 0] < a.maxPendingPerPeer else { return false }
            a.pending += 1
            a.pendingByPeer[peer, default: 0] += 1
            return true
        }
    }

    private func releasePending(_ peer: String) {
        admission.withLock { a in
            a.pending -= 1
            let left = a.pendingByPeer[peer, default: 1] - 1
            a.pendingByPeer[peer] = left > 0 ? left : nil
        }
    }

    /// Connections not attached yet (tests).
    var pendingCount: Int { admission.withLock { $0.pending } }

    /// Listens on `host:port` (a name, IPv4 or IPv6 literal, or a wildcard; port 0: any free port)
    /// and returns the bound port.
    /// With `tls`, nodes must speak TLS (the air's certificate, checked against the lab CA).
    /// Connections run on NIO's shared event loops (`AirLoops`): none holds a thread.
    public func start(host: String = "127.0.0.1", port: UInt16, tls: TLSContext? = nil) throws -> UInt16 {
        let ssl = tls?.nio
        let bootstrap = ServerBootstrap(group: AirLoops.group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.writeBufferWaterMark, value: LineSocket.waterMark)
            .childChannelInitializer { [weak self] channel in
                guard let self else { return channel.eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel) }
                return self.accepted(channel, tls: ssl)
            }
        let name = HostPort(host: host, port: port)
        var last = "no address"
        let addresses: [NetAddress]
        do { addresses = try Listener.addresses(host: host, port: port) } catch let e as NetError { throw AirError.socket(e.message) }
        for address in addresses {
            let target: SocketAddress
            if let v4 = address.ipv4 { target = SocketAddress(v4, host: address.host) } else if let v6 = address.ipv6 { target = SocketAddress(v6, host: address.host) } else { continue }
            do {
                let channel = try bootstrap.bind(to: target).wait()
                admission.withLock { $0.listeners.append(channel) }
                return UInt16(channel.localAddress?.port ?? Int(port))
            } catch {
                last = AirError.phrase(error)
            }
        }
        throw AirError.socket("cannot listen on \(name): \(last)")
    }

    public func stop() {
        let open = admission.withLock { a in defer { a.listeners = [] }; return a.listeners }
        for l in open { l.close(promise: nil) }
        scheduler.sync {
            for n in q.nodes.values { n.socket.close() }
            for p in q.unattached.values { p.socket.close() }
        }
    }

    /// How many nodes are attached now.
    public var attachedCount: Int { scheduler.sync { q.nodes.count } }

    /// A new connection, on its event loop: closed at once when there is no place for it among
    /// the pending ones (a failed initializer closes the channel); else its pipeline is made.
    private func accepted(_ channel: Channel, tls: NIOSSLContext?) -> EventLoopFuture<Void> {
        let peer = channel.remoteAddress?.ipAddress ?? "?"
        guard takePending(peer) else { return channel.eventLoop.makeFailedFuture(AirRefused.full) }
        let socket = LineSocket(channel: channel, lineLimit: Self.maxHelloLine)
        do {
            let handler = tls.map { NIOSSLServerHandler(context: $0) }
            let watch = handler.map { _ in
                // A handshake that fails is said once, as before NIO.
                HandshakeWatch(tls: true, ready: {}, failed: { [weak self] error in
                    if let e = error as? ChannelError, e == .ioOnClosedChannel { return }
                    self?.logger.notice("refused a connection from \(peer): \(AirError.phrase(error))", metadata: ["peer": .string(peer)])
                })
            }
            try socket.install(on: channel, tls: handler, watch: watch)
        } catch {
            releasePending(peer)
            return channel.eventLoop.makeFailedFuture(error)
        }
        adopt(socket, peer: peer)
        return channel.eventLoop.makeSucceededVoidFuture()
    }

    /// A connection not attached yet: its peer's address and its socket.
    private struct Unattached { let peer: String; let socket: LineSocket }

    private func adopt(_ socket: LineSocket, peer: String) {
        scheduler.execute { [self] in
            q.nextConnection += 1
            let id = q.nextConnection
            q.unattached[id] = Unattached(peer: peer, socket: socket)
            socket.startReading(AirRequest.self, onMessage: { [weak self] m in
                self?.scheduler.execute { self?.received(m, connection: id, socket: socket) }
            }, onJunk: { [weak self] in
                // A line that is not a message of the contract, before attaching: a stranger's
                // junk, closed at once (an attached node's is dropped and the node stays).
                self?.scheduler.execute { if self?.q.unattached[id] != nil { socket.close() } }
            }, onClose: { [weak self] in
                // The peer ended (or the connection closed): what was read before is handled
                // (and answered) first, then the socket is closed, attached or not.
                self?.scheduler.execute {
                    socket.close()
                    self?.closed(id)
                }
            })
            // Not attached in time (handshake and hello): closed (`closed` frees its place).
            _ = scheduler.schedule(after: self.helloTimeout) { [weak self] in
                if self?.q.unattached[id] != nil { socket.close() }
            }
        }
    }

    /// Whether a hello is admitted: a valid ticket for the node's name (its claims), or the
    /// token (no claims); else why not.
    private func admit(_ m: AirHello) -> Result<NodeTicket.Claims?, NodeTicket.Refusal> {
        if token == nil && ticketKey == nil { return .success(nil) }
        if let gate = q.gate, let ticket = m.ticket {
            return gate.admit(ticket, node: m.node ?? "", now: Date().timeIntervalSince1970).map { $0 }
        }
        if let token {
            let given = Array((m.token ?? "").utf8), want = Array(token.utf8)
            var diff = UInt8(given.count == want.count ? 0 : 1)
            for (a, b) in zip(given, want) { diff |= a ^ b }
            return diff == 0 ? .success(nil) : .failure(NodeTicket.Refusal(reason: "\(m.token == nil ? "a" : "a valid") token or ticket is required"))
        }
        return .failure(NodeTicket.Refusal(reason: "a ticket is required"))
    }

    /// Drops every attached node whose ticket no longer holds (expired, run ended, agent revoked).
    private func dropLapsed() {
        guard let gate = q.gate else { return }
        let t = Date().timeIntervalSince1970
        for (id, n) in q.nodes {
            guard let c = n.claims, let why = gate.refusal(c, now: t) else { continue }
            logger.notice("\(Self.escaped(n.name)) dropped: \(why)", metadata: Self.metadata(n.name, c))
            q.nodes[id] = nil
            n.detach()
            n.socket.close()
        }
        if q.nodes.isEmpty { q.medium = nil }
    }

    /// A notice from the coordinator (signed with the air key): a run ended or an agent was
    /// revoked. Answered, then the connection is closed.
    private func notice(_ text: String, id: Int?, socket: LineSocket) {
        let r: AirNews
        if var g = q.gate, let n = g.take(text) {
            q.gate = g
            r = .noticeTaken
            switch n {
            case .ended(let run, _): logger.notice("run \(Self.escaped(run)) ended: its tickets attach nothing more", metadata: ["run": .string(String(run.prefix(200)))])
            case .revoked(let agent, _): logger.notice("agent \(Self.escaped(agent)) revoked: its tickets attach nothing more", metadata: ["agent": .string(String(agent.prefix(200)))])
            }
            dropLapsed()
        } else {
            let why = q.gate == nil ? "this air checks no tickets" : "notice not signed by this lab's air key"
            r = .noticeRefused(why)
            logger.warning("refused a notice: \(why)")
        }
        socket.send(AirAnswer(id: id, r))
        socket.close()
    }

    /// A node's name as it may go into a log line: control characters escaped (no forged
    /// lines), at most 200 characters (`OutsideText`).
    static func escaped(_ text: String) -> String { OutsideText.escaped(text, limit: 200) }

    /// A node's ids as log metadata: its name (at most 200 characters, like `escaped`; the log's
    /// handler escapes it), and the run and agent its ticket names.
    static func metadata(_ name: String, _ claims: NodeTicket.Claims?) -> Logger.Metadata {
        var m: Logger.Metadata = ["node": .string(String(name.prefix(200)))]
        if let claims { m["run"] = .string(String(claims.run.prefix(200))); m["agent"] = .string(String(claims.agent.prefix(200))) }
        return m
    }

    private func closed(_ id: Int) {
        if let p = q.unattached.removeValue(forKey: id) { releasePending(p.peer) }
        guard let node = q.nodes.removeValue(forKey: id) else { return }
        logger.info("\(Self.escaped(node.name)) left", metadata: Self.metadata(node.name, node.claims))
        node.detach()
        if q.nodes.isEmpty { q.medium = nil }
    }

    private func received(_ request: AirRequest, connection id: Int, socket: LineSocket) {
        if case .notice(let text) = request.call, q.nodes[id] == nil { return notice(text, id: request.id, socket: socket) }
        if case .hello(let m) = request.call {
            let name = m.node ?? "node\(id)"
            func refuse(_ refusal: String) {
                logger.warning("refused a hello from connection \(id) as \(Self.escaped(m.node ?? "?")): \(refusal)", metadata: ["connection": .stringConvertible(id)])
                socket.send(AirAnswer(id: request.id, .refused(refusal)))
                socket.close()
            }
            let claims: NodeTicket.Claims?
            switch admit(m) {
            case .failure(let r): return refuse(r.reason)
            case .success(let c): claims = c
            }
            // Another run's or another agent's ticket never drops a node attached under this name.
            let t = Date().timeIntervalSince1970
            if let gate = q.gate, let held = q.nodes.first(where: { $0.key != id && $0.value.name == name })?.value,
               !gate.mayReplace(old: held.claims, new: claims, now: t) {
                return refuse("node \(name) is attached for run \(held.claims?.run ?? "?") by agent \(held.claims?.agent ?? "?"); this ticket may not replace it")
            }
            if q.medium == nil { q.medium = SimMedium(scheduler: scheduler, parameters: m.parameters ?? defaultParameters, seed: seed) }
            // A node that reattaches (its link was down) replaces its old attachment.
            for (other, n) in q.nodes where n.name == name && other != id {
                logger.notice("\(Self.escaped(name)) reattached; dropping its previous connection", metadata: Self.metadata(name, claims))
                q.nodes[other] = nil
                n.detach()
                n.socket.close()
            }
            if let p = q.unattached.removeValue(forKey: id) { releasePending(p.peer) }
            socket.lineLimit = LineSocket.maxLine
            // The device is the agent that attached it (its character, with radio.devices, follows
            // the agent from run to run); an attachment without a ticket is known by its node name.
            let transport = q.medium!.addNode(name: "\(name)#\(id)", x: m.x ?? 0, y: m.y ?? 0, identity: claims?.agent ?? name)
            let node = AttachedNode(name: name, transport: transport, socket: socket)
            node.claims = claims
            q.nodes[id] = node
            logger.info("\(Self.escaped(name)) attached at (\(m.x ?? 0), \(m.y ?? 0)) as \(transport.address)", metadata: Self.metadata(name, claims))
            node.send(AirAnswer(id: request.id, .attached(transport.address)))
            return
        }
        q.nodes[id]?.handle(request)
    }
}

/// One attached node: its SimTransport in the medium, and the socket to its process.
final class AttachedNode: BLETransportDelegate, GATTServerDelegate {
    let name: String
    let transport: SimTransport
    let socket: LineSocket
    /// Last full value of each readable characteristic, refreshed by the node.
    var values: [BluetoothUUID: Data] = [:]
    /// What its ticket said (nil: attached with the lab token, or on an open air).
    var claims: NodeTicket.Claims?

    init(name: String, transport: SimTransport, socket: LineSocket) {
        self.name = name
        self.transport = transport
        self.socket = socket
        transport.delegate = self
    }

    /// Every message carries the air's clock, so the node can drop what reaches it late.
    func send(_ message: AirAnswer) {
        var m = message
        m.at = Date().timeIntervalSince1970
        socket.send(m)
    }

    private func send(_ news: AirNews) { send(AirAnswer(news)) }

    func detach() {
        transport.delegate = nil
        transport.stopAdvertising { _ in }
        transport.stopScanning { _ in }
    }

    private func reply(_ id: Int?, _ outcome: AirOutcome) { send(AirAnswer(id: id, .reply(outcome))) }

    private func reply(_ id: Int?, _ result: Result<Void, TransportError>) {
        switch result {
        case .success: reply(id, .done)
        case .failure(let e): reply(id, .failed(e))
        }
    }

    func handle(_ request: AirRequest) {
        let id = request.id
        switch request.call {
        case .hello, .notice: break // handled by the server before a node is attached
        case .malformed(_, let problem): reply(id, .failed(.failed(problem)))
        case .powerOn: transport.powerOn { self.reply(id, $0) }
        case .register(let s, let v):
            values.merge(v) { $1 }
            transport.register(service: s, server: self) { self.reply(id, $0) }
        case .values(let v): values.merge(v) { $1 }
        case .startAdvertising(let ad): transport.startAdvertising(ad) { self.reply(id, $0) }
        case .stopAdvertising: transport.stopAdvertising { self.reply(id, $0) }
        case .startScanning: transport.startScanning(filter: ScanFilter()) { self.reply(id, $0) }
        case .stopScanning: transport.stopScanning { self.reply(id, $0) }
        case .connect(let a, let timeout): transport.connect(a, timeout: timeout) { self.reply(id, $0) }
        case .disconnect(let a): transport.disconnect(a) { self.reply(id, $0) }
        case .discover(let a):
            transport.discoverServices(a) { result in
                switch result {
                case .success(let s): self.reply(id, .services(s))
                case .failure(let e): self.reply(id, .failed(e))
                }
            }
        case .read(let a, let s, let c):
            transport.read(a, service: s, characteristic: c) { result in
                switch result {
                case .success(let d): self.reply(id, .value(d))
                case .failure(let e): self.reply(id, .failed(e))
                }
            }
        case .write(let a, let s, let c, let v, let withResponse):
            transport.write(a, service: s, characteristic: c, value: v, withResponse: withResponse) { self.reply(id, $0) }
        }
    }

    // BLETransportDelegate: relay the medium's events to the node's process.
    func transport(didUpdateState state: RadioState) { send(.state(state)) }
    func transport(didReceive report: ScanReport) { send(.report(report)) }
    func transport(didDisconnect address: RadioAddress) { send(.disconnected(address)) }

    // GATTServerDelegate: reads come from the node's last value (the medium needs them at once);
    // every read and write is also relayed so the node's own GATT server sees it.
    func gattRead(characteristic: BluetoothUUID, offset: Int, central: RadioAddress) -> Result<Data, ATTError> {
        send(.gattRead(characteristic: characteristic, offset: offset, central: central))
        guard let v = values[characteristic] else { return .failure(.notSupported) }
        guard offset <= v.count else { return .failure(.invalidOffset) }
        return .success(Data(v.dropFirst(offset)))
    }
    func gattWrite(characteristic: BluetoothUUID, value: Data, offset: Int, central: RadioAddress) -> Result<Void, ATTError> {
        send(.gattWrite(characteristic: characteristic, value: value, offset: offset, central: central))
        return .success(())
    }
    func gattCentralDisconnected(_ central: RadioAddress) { send(.centralDisconnected(central)) }
}
