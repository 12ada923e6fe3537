import Foundation
import HeraldCore
import HeraldRadio
import LabHTTP
import LabLink
import LabMetrics
import LabNet
import LabNode
import LabPlan
import BlueZRadio
import Logging
import Synchronization

/// `herald-lab agent`: runs nodes of plans on this machine. It registers with a coordinator and
/// heartbeats, accepts an assignment, starts at the instant it is given (in its own clock), runs
/// to the end on its own even if the coordinator goes away, keeps assignments and logs on disk
/// (resuming after a restart), and serves the files with SHA-256 and byte ranges until the
/// coordinator says they were gathered. Routes are in Agent+Routes, the run's life in
/// Agent+Lifecycle, what is kept on disk in Agent+Persistence, the coordinator link in
/// Agent+Coordinator.
///
/// Concurrency: the runs and the dongle check are the scheduler queue's (`runs`, `check`:
/// checked there); what `start` sets, and the dongle as last looked at, are in `Mutex`es.
public final class Agent: Sendable {
    public struct Config: Sendable {
        public var name: String
        public var host = "127.0.0.1"
        public var port: UInt16 = 0
        public var dataDirectory: URL
        public var coordinator: URL?
        /// The lab's shared token (a lab without enrolment): the coordinator calls with it, and
        /// the agent calls the coordinator with it.
        public var token: String?
        /// This agent's enrolment: it calls the coordinator with `credential.token` and accepts
        /// only `credential.coordinatorToken` (and the shared token, if any) from callers.
        public var credential: AgentCredential?
        /// Serve TLS with this (cert.pem and key.pem from the credentials folder).
        public var tls: TLSContext?
        /// No authentication at all (loopback only; the command checks).
        public var insecure = false
        /// The scrape credential: GET /metrics and nothing else.
        public var scrapeToken: String?
        public var tags: [String] = []
        public var radio: RadioKind = .sim
        public var adapter: String?
        /// The dongle's label (radio bluez); nil: the agent's name.
        public var dongleName: String?
        /// The host name the dongle is reported on; nil: this machine's.
        public var hostName: String?
        /// Where sysfs is (the dongle's USB identity and USB resets); tests give a fake tree.
        public var sysfsRoot = "/sys"
        /// Whether a dongle that stops answering may be reset at USB level (sysfs `authorized`).
        public var usbReset = true
        /// The air to attach to when an assignment names none.
        public var air: LabWire.AirAddress?
        /// The URL the coordinator should call this agent at (behind NAT, or to pick one of
        /// several addresses). Without it, an agent bound to a wildcard address is recorded at
        /// the address its registration came from.
        public var advertiseURL: URL?
        public var heartbeatInterval: TimeInterval = 1
        /// The longest wait between attempts to reach an unreachable coordinator.
        public var maxBackoff: TimeInterval = 30
        /// A pause of the whole process longer than this (SIGSTOP, a frozen VM) is a gap.
        public var stallThreshold: TimeInterval = 3
        /// The agent's time (issue 39 item 5): start instants, heartbeats, abort and clock stamps
        /// are read and waited for in it. A process runs on the wall clock; an in-memory lab on
        /// a virtual one that its driver advances.
        public var clock: any LabClock = WallClock()
        /// The executor the node, its radio and the agent's runs are on; nil: a dispatch queue of
        /// its own. An in-memory lab gives every agent one virtual-time executor.
        public var scheduler: (any SerialScheduler)?
        /// Makes the node's radio when the agent is given a maker (an in-memory lab's simulated
        /// medium, on `scheduler`); nil: the radio `radio` names (BlueZ, or the assignment's air).
        public var makeRadio: (@Sendable (NodeAssignment) throws -> NodeRadio)?
        public init(name: String, dataDirectory: URL) { self.name = name; self.dataDirectory = dataDirectory }
    }

    public let config: Config
    let scheduler: any SerialScheduler
    let http: HTTPService
    /// GET /metrics (Agent+Metrics).
    let metrics = LabMetrics(service: "agent")
    /// How this agent reaches its coordinator (nil: it has none).
    let coordinatorLink: (any CoordinatorLink)?
    /// What `start` sets up: the URL announced, the port bound, the heartbeats' task and the
    /// stall watchdog.
    struct Started {
        var url = ""
        var boundPort: UInt16 = 0
        var heartbeat: Task<Void, Never>?
        var watchdog: StallWatchdog?
    }
    let started = Mutex(Started())
    public var url: String { started.withLock { $0.url } }
    var boundPort: UInt16 { started.withLock { $0.boundPort } }
    /// This process's boot id, in every registration and heartbeat (freshness).
    let boot = UUID().uuidString.lowercased()

    /// What only the scheduler's queue touches (the `Scheduler` seam: the node, its radio and
    /// its loggers run there too).
    final class OnQueue {
        var runs: [String: ActiveRun] = [:]
        var check: DongleCheckSession?
    }
    /// Invariant: only used on the scheduler's executor; `onQueue` checks that (`assertOnExecutor`)
    /// on every access, so this box (HeraldRadio's carrier for the seam) is never read elsewhere.
    private let confined = UncheckedBox(OnQueue())
    private var onQueue: OnQueue {
        scheduler.assertOnExecutor()
        return confined.value
    }
    // Runs, confined to the scheduler's queue: at most one armed or running (`active`), any
    // number finished and waiting to be gathered.
    var runs: [String: ActiveRun] {
        get { onQueue.runs }
        set { onQueue.runs = newValue }
    }
    var active: ActiveRun? { runs.values.first { $0.state == .armed || $0.state == .running } }
    /// The agent's log (label herald-lab.agent): one line per event, with metadata agent (and
    /// dongle, radio bluez) on every line, run and node where a line is about a run; its handler
    /// escapes outside text (LabLogHandler).
    public let logger: Logger
    /// The host's kernel release, and the bluetoothd version read at the last arming (radio bluez).
    let kernel = HostSystem.kernelRelease()
    /// And the dongle as last looked at (radio bluez).
    struct Stack {
        var bluezVersion: String?
        var dongleInfo: LabWire.DongleInfo?
    }
    let stack = Mutex(Stack())
    /// A pre-flight check of the dongle, on the scheduler's queue (Agent+Dongle).
    var check: DongleCheckSession? {
        get { onQueue.check }
        set { onQueue.check = newValue }
    }

    final class ActiveRun {
        let assignment: NodeAssignment
        let directory: URL
        var air: LabWire.AirAddress?
        var state: LabWire.AgentState = .armed
        var startAt: Double?
        var startedAt: Double?
        var resumed = false
        var aborted = false
        var gaps: [LabWire.Gap] = []
        /// Last time the agent was known to be alive during the run (persisted every few seconds).
        var aliveAt: Double?
        var runner: NodeRunner?
        /// Closes the run's radio (the air connection or the BlueZ client).
        var closeRadio: (() -> Void)?
        var tasks: [ScheduledTask] = []
        var files: [LabWire.FileInfo] = []
        var message: String?
        var writeError: String?
        var lastStatus: NodeStatus?
        /// The BlueZ radio of the running node, and what it did to recover its dongle.
        var bluez: BlueZTransport?
        var recoveries: [LabWire.Recovery] = []
        init(assignment: NodeAssignment, directory: URL) { self.assignment = assignment; self.directory = directory }
        var id: String { assignment.runId }
        var nodeDirectory: URL { directory.appendingPathComponent("node") }
        var endsAt: Double? { startAt.map { $0 + assignment.duration } }
        var lateBy: Double? { guard let s = startAt, let a = startedAt, !resumed else { return nil }; return a - s }
    }

    /// `httpLogger` is its HTTP service's (nil: label herald-lab.http at `logger`'s level); both
    /// get metadata agent. `coordinatorLink`: how it reaches its coordinator (nil: over HTTP at
    /// `config.coordinator`, with its credential, if there is one).
    public init(config: Config, logger: Logger = Logger(label: "herald-lab.agent"), httpLogger: Logger? = nil, coordinatorLink: (any CoordinatorLink)? = nil) {
        self.config = config
        scheduler = config.scheduler ?? DispatchScheduler(label: "heraldlab.agent.node")
        self.coordinatorLink = coordinatorLink ?? config.coordinator.map { HTTPCoordinatorLink(base: $0, token: config.credential?.token ?? config.token, timeout: 5) }
        var logger = logger
        logger[metadataKey: "agent"] = .string(config.name)
        if config.radio == .bluez { logger[metadataKey: "dongle"] = .string(config.dongleName ?? config.name) }
        self.logger = logger
        var httpLogger = httpLogger ?? HTTPService.defaultLogger(level: logger.logLevel)
        httpLogger[metadataKey: "agent"] = .string(config.name)
        http = HTTPService(name: "agent \(config.name)", authenticate: config.insecure ? nil : HTTPService.withScraper(config.scrapeToken, Self.authenticator(config)), logger: httpLogger)
        controllerIdentity = config.radio == .bluez ? ControllerIdentity.read(adapter: config.adapter ?? "hci0") : nil
        controller = controllerIdentity.map(Self.describe)
        routes()
        metricsRoute()
    }

    /// Starts serving; recovers runs left on disk; starts heartbeats. Returns the bound port.
    public func start() async throws -> UInt16 {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        let port = try await http.start(host: config.host, port: config.port, tls: config.tls)
        let url = config.advertiseURL?.absoluteString ?? "\(config.tls == nil ? "http" : "https")://\(HostPort.urlHost(config.host)):\(port)"
        started.withLock { s in
            s.boundPort = port
            s.url = url
        }
        await startWork()
        logger.notice("listening on \(config.host):\(port), announced as \(url) (data \(config.dataDirectory.path))")
        return port
    }

    /// Starts the agent without serving HTTP, for callers in this process (`LocalAgentLink`):
    /// it recovers runs left on disk and heartbeats to its coordinator link, announced as `url`.
    public func startUnserved(url: String) async throws {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        started.withLock { $0.url = url }
        await startWork()
        logger.notice("started without serving, announced as \(url) (data \(config.dataDirectory.path))")
    }

    /// What `start` does besides serving: runs recovered, the dongle read, the stall watchdog, heartbeats.
    private func startWork() async {
        scheduler.sync { recover() }
        if config.radio == .bluez {
            if let kernel, let problem = HostSystem.bluetoothProblem(kernelRelease: kernel) { logger.warning("\(problem)") }
            await refreshDongle()
        }
        let watchdog = StallWatchdog(threshold: config.stallThreshold, clock: config.clock) { [weak self] from, to in
            guard let self else { return }
            self.scheduler.execute { self.stalled(from: from, to: to) }
        }
        started.withLock { $0.watchdog = watchdog }
        scheduler.scheduleRepeating(every: 5) { [weak self] in self?.keepAlive() }
        if coordinatorLink != nil {
            let heartbeat: Task<Void, Never> = Task { [weak self] in await self?.heartbeatLoop() }
            started.withLock { $0.heartbeat = heartbeat }
        }
    }

    /// A run's ids as log metadata.
    func metadata(_ r: ActiveRun) -> Logger.Metadata {
        ["run": .string(r.id), "node": .string(r.assignment.node.name)]
    }

    public func stop() async {
        let (heartbeat, watchdog) = started.withLock { ($0.heartbeat, $0.watchdog) }
        heartbeat?.cancel()
        watchdog?.stop()
        scheduler.sync {
            for r in runs.values {
                for t in r.tasks { t.cancel() }
                if r.state == .running { finish(r, interrupted: true) }
            }
        }
        await http.stop()
    }

    /// Who may call the agent: the coordinator, with the credential it calls this agent alone
    /// with; the holder of the lab's shared token, in a lab without enrolment.
    static func authenticator(_ config: Config) -> HTTPService.Authenticate {
        let coordinator = config.credential?.coordinatorToken, shared = config.token
        return { given in
            if let coordinator, HTTPService.constantTimeEqual(given, coordinator) { return HTTPService.Principal(role: .coordinator, name: "coordinator") }
            if let shared, HTTPService.constantTimeEqual(given, shared) { return HTTPService.Principal(role: .operator, name: "token") }
            return nil
        }
    }

    /// The node's scheduler as the BlueZ and air radios and the dongle check take it: a dispatch queue.
    func dispatchScheduler() throws -> DispatchScheduler {
        guard let d = scheduler as? DispatchScheduler else {
            throw LabRefusal(.unprocessable, "agent \(config.name): radio \(config.radio.rawValue) runs on a dispatch queue, not on the scheduler the agent was given")
        }
        return d
    }

    var runsDirectory: URL { config.dataDirectory.appendingPathComponent("runs") }
    var now: Double { config.clock.now() }

    public var info: LabWire.AgentInfo {
        var i = LabWire.AgentInfo(name: config.name, url: url, tags: config.tags, radio: config.radio, adapter: config.adapter, controller: controller, port: boundPort)
        i.dongle = stack.withLock { $0.dongleInfo }
        return i
    }

    /// The Bluetooth controller's identity (BlueZ radio), read once at start: what lets results be
    /// grouped by dongle and firmware. Simulated radios have none.
    public let controller: [String: String]?
    let controllerIdentity: ControllerIdentity?

    static func describe(_ identity: ControllerIdentity) -> [String: String] {
        switch identity {
        case .unavailable(let reason): return ["unavailable": reason]
        case .controller(let c):
            var d = ["address": c.address, "hciVersion": String(c.hciVersion), "lmpVersion": String(c.lmpVersion),
                     "lmpSubversion": String(c.lmpSubversion), "manufacturer": String(c.manufacturer)]
            if let name = c.manufacturerName { d["manufacturerName"] = name }
            return d
        }
    }

    public var status: LabWire.AgentStatus { scheduler.sync { statusOnQueue() } }

    /// The active run if there is one, else the newest run held on disk.
    private func statusOnQueue() -> LabWire.AgentStatus {
        let current = active ?? runs.values.max { ($0.startAt ?? 0, $0.id) < ($1.startAt ?? 0, $1.id) }
        var s = LabWire.AgentStatus(name: config.name, state: current?.state ?? .idle)
        s.held = runs.keys.sorted()
        s.kernel = kernel
        s.bluez = stack.withLock { $0.bluezVersion }
        s.dongle = stack.withLock { $0.dongleInfo }
        guard let r = current else { return s }
        s.recoveries = r.recoveries.isEmpty ? nil : r.recoveries
        s.runId = r.id
        s.node = r.assignment.node.name
        s.startAt = r.startAt
        s.startedAt = r.startedAt
        s.endsAt = r.endsAt
        s.resumed = r.resumed
        s.message = r.message
        s.gaps = r.gaps.isEmpty ? nil : r.gaps
        s.lateBy = r.lateBy
        s.writeError = r.runner?.writeError ?? r.writeError
        if let st = r.runner?.status ?? r.lastStatus {
            s.peersDetected = st.peersDetected
            s.payloadsRead = st.payloadsRead
            s.rssiLastMinute = st.rssiLastMinute
            s.rssiTotal = st.rssiTotal
            s.radio = st.radio
            // The peer lists feed the dashboard's matrix, drawn for runs of up to 64 nodes: a
            // crowd's heartbeats do not carry them.
            if st.peers.count <= 128 {
                s.peers = st.peers
                s.recentPeers = st.recentPeers
            }
        }
        return s
    }
}

/// A node's radio as `Agent.Config.makeRadio` makes it: the transport the node runs on, and what
/// closes it at the run's end.
public struct NodeRadio {
    public var transport: any BLETransport
    public var close: () -> Void
    public init(transport: any BLETransport, close: @escaping () -> Void) { self.transport = transport; self.close = close }
}
