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
/// coordinator says they were gathered.
///
/// The agent composes services that each own their state (issue 39 item 3): the runs
/// (`RunLifecycle`, with RunLifecycle+Persistence), the dongle and its pre-flight check
/// (`DongleService`), the coordinator link's heartbeats (`CoordinatorHeartbeats`) and the stall
/// watchdog (`StallWatchdog`); its HTTP API (AgentRoutes) and `LocalAgentLink`
/// call the API methods of Agent+API, which forward to them. Time is `config.clock`.
///
/// Concurrency: runs and the dongle check are the node's executor's (`scheduler`); what `start`
/// sets and the dongle as last looked at are in `Mutex`es; the long-lived work (`services`:
/// heartbeats, the dongle's refreshes) runs in the process's ServiceGroup (`herald-lab agent`),
/// or as child tasks of one task the agent owns from `start` to `stop`.
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
    /// The executor of the node, its radio and the runs (a dispatch queue of its own unless
    /// `config.scheduler` gives one).
    let scheduler: any SerialScheduler
    let http: HTTPService
    /// GET /metrics (Agent+Metrics).
    let metrics = LabMetrics(service: "agent")
    /// How this agent reaches its coordinator (nil: it has none).
    let coordinatorLink: (any CoordinatorLink)?
    /// The services it composes.
    let lifecycle: RunLifecycle
    let dongle: DongleService
    /// What `start` sets up: the URL announced, the port bound, the background work (heartbeats,
    /// dongle refreshes: child tasks of one task) and the stall watchdog.
    struct Started {
        var url = ""
        var boundPort: UInt16 = 0
        var background: Task<Void, Never>?
        var watchdog: StallWatchdog?
    }
    let started = Mutex(Started())
    /// Opened once the agent has started (`startWork`): the heartbeats wait for it.
    let ready = Latch()
    public var url: String { started.withLock { $0.url } }
    var boundPort: UInt16 { started.withLock { $0.boundPort } }
    /// This process's boot id, in every registration and heartbeat (freshness).
    let boot = UUID().uuidString.lowercased()
    /// The agent's log (label herald-lab.agent): one line per event, with metadata agent (and
    /// dongle, radio bluez) on every line, run and node where a line is about a run; its handler
    /// escapes outside text (LabLogHandler).
    public let logger: Logger
    /// The host's kernel release.
    let kernel = HostSystem.kernelRelease()

    /// `httpLogger` is its HTTP service's (nil: label herald-lab.http at `logger`'s level); both
    /// get metadata agent. `coordinatorLink`: how it reaches its coordinator (nil: over HTTP at
    /// `config.coordinator`, with its credential, if there is one).
    public init(config: Config, logger: Logger = Logger(label: "herald-lab.agent"), httpLogger: Logger? = nil, coordinatorLink: (any CoordinatorLink)? = nil) {
        self.config = config
        let scheduler = config.scheduler ?? DispatchScheduler(label: "heraldlab.agent.node")
        self.scheduler = scheduler
        self.coordinatorLink = coordinatorLink ?? config.coordinator.map { HTTPCoordinatorLink(base: $0, token: config.credential?.token ?? config.token, timeout: 5) }
        var logger = logger
        logger[metadataKey: "agent"] = .string(config.name)
        if config.radio == .bluez { logger[metadataKey: "dongle"] = .string(config.dongleName ?? config.name) }
        self.logger = logger
        var httpLogger = httpLogger ?? HTTPService.defaultLogger(level: logger.logLevel)
        httpLogger[metadataKey: "agent"] = .string(config.name)
        http = HTTPService(name: "agent \(config.name)", authenticate: config.insecure ? nil : HTTPService.withScraper(config.scrapeToken, Self.authenticator(config)), logger: httpLogger)
        let identity = config.radio == .bluez ? ControllerIdentity.read(adapter: config.adapter ?? "hci0") : nil
        controller = identity.map(Self.describe)
        dongle = DongleService(config: config, scheduler: scheduler, logger: logger, controllerIdentity: identity)
        lifecycle = RunLifecycle(config: config, scheduler: scheduler, logger: logger, dongle: dongle)
        http.serve { routes in
            AgentRoutes.register(on: self, routes)
            AgentRoutes.registerMetrics(on: self, routes)
        }
    }

    /// Starts serving; recovers runs left on disk; starts heartbeats. Returns the bound port.
    public func start() async throws -> UInt16 {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        let port = try await http.start(host: config.host, port: config.port, tls: config.tls)
        await listening(on: port)
        return port
    }

    /// The agent's HTTP server, for the process's ServiceGroup (which runs `services` beside it):
    /// once it listens the agent starts as `start` does (runs recovered), then `onStarted` gets
    /// the bound port.
    public func server(onStarted: @escaping @Sendable (UInt16) async -> Void) throws -> HTTPService.Server {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        return try http.server(host: config.host, port: config.port, tls: config.tls) { [weak self] port in
            await self?.listening(on: port, background: false)
            await onStarted(port)
        }
    }

    /// What starting does once the server listens on `port`.
    private func listening(on port: UInt16, background: Bool = true) async {
        let url = config.advertiseURL?.absoluteString ?? "\(config.tls == nil ? "http" : "https")://\(HostPort.urlHost(config.host)):\(port)"
        started.withLock { s in
            s.boundPort = port
            s.url = url
        }
        await startWork(background: background)
        logger.notice("listening on \(config.host):\(port), announced as \(url) (data \(config.dataDirectory.path))")
    }

    /// Starts the agent without serving HTTP, for callers in this process (`LocalAgentLink`):
    /// it recovers runs left on disk and heartbeats to its coordinator link, announced as `url`.
    public func startUnserved(url: String) async throws {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        started.withLock { $0.url = url }
        await startWork(background: true)
        logger.notice("started without serving, announced as \(url) (data \(config.dataDirectory.path))")
    }

    /// What `start` does besides serving: runs recovered, the dongle read, the stall watchdog,
    /// the keep-alive stamps; then the heartbeats may begin (`services`), which run in one task
    /// of the agent's own with `background` (`start`, `startUnserved`), or in the process's
    /// ServiceGroup (`herald-lab agent`).
    private func startWork(background runBackground: Bool = true) async {
        let lifecycle = self.lifecycle
        scheduler.sync { lifecycle.recover() }
        if config.radio == .bluez {
            if let kernel, let problem = HostSystem.bluetoothProblem(kernelRelease: kernel) { logger.warning("\(problem)") }
            await dongle.refreshDongle()
        }
        let scheduler = self.scheduler
        let watchdog = StallWatchdog(threshold: config.stallThreshold, clock: config.clock) { [weak lifecycle] from, to in
            guard let lifecycle else { return }
            scheduler.execute { lifecycle.stalled(from: from, to: to) }
        }
        // Every 5 s for the agent's life (it holds the lifecycle; the task ends once both are gone).
        scheduler.scheduleRepeating(every: 5) { [weak lifecycle] in lifecycle?.keepAlive() }
        started.withLock { s in s.watchdog = watchdog }
        ready.open()
        guard runBackground else { return }
        let services = self.services
        // The one task that holds the background services (a task group): `stop` cancels it and
        // waits for them (each ends on cancellation).
        let background = Task {
            await withDiscardingTaskGroup { group in
                for service in services { group.addTask { await service.run() } }
            }
        }
        started.withLock { s in s.background = background }
    }

    /// The agent's long-lived work besides answering HTTP, each running until cancelled: the
    /// heartbeats to its coordinator (from the moment the agent has started: its URL known, its
    /// runs recovered) and the dongle's refreshes after a check.
    public var services: [AgentService] {
        let config = self.config, logger = self.logger, boot = self.boot, dongle = self.dongle, ready = self.ready
        var out = [AgentService]()
        // An agent dropped without `stop` ends its heartbeats (they hold it weakly).
        if let link = coordinatorLink {
            let heartbeats = CoordinatorHeartbeats(link: link, agent: config.name, boot: boot, clock: config.clock, interval: config.heartbeatInterval,
                                                   maxBackoff: config.maxBackoff, logger: logger, info: { [weak self] in self?.info },
                                                   status: { [weak self] in self?.status }, url: { [weak self] in self?.url ?? "" })
            out.append(AgentService(name: "heartbeats") {
                // Cancelled before the agent started: the wait ends without a beat.
                guard await ready.wait() else { return }
                await heartbeats.run()
            })
        }
        out.append(AgentService(name: "dongle refreshes") {
            await withTaskCancellationHandler { await dongle.refreshes() } onCancel: { dongle.finish() }
        })
        return out
    }

    public func stop() async {
        let (background, watchdog) = started.withLock { ($0.background, $0.watchdog) }
        background?.cancel()
        watchdog?.stop()
        let lifecycle = self.lifecycle
        scheduler.sync { lifecycle.interrupt() }
        await background?.value
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

    var runsDirectory: URL { lifecycle.runsDirectory }
    var now: Double { config.clock.now() }

    public var info: LabWire.AgentInfo {
        var i = LabWire.AgentInfo(name: config.name, url: url, tags: config.tags, radio: config.radio, adapter: config.adapter, controller: controller, port: boundPort)
        i.dongle = dongle.stack.withLock { $0.dongleInfo }
        return i
    }

    /// The Bluetooth controller's identity (BlueZ radio), read once at start: what lets results be
    /// grouped by dongle and firmware. Simulated radios have none.
    public let controller: [String: String]?

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

    public var status: LabWire.AgentStatus {
        var base = LabWire.AgentStatus(name: config.name, state: .idle)
        base.kernel = kernel
        (base.bluez, base.dongle) = dongle.stack.withLock { ($0.bluezVersion, $0.dongleInfo) }
        let lifecycle = self.lifecycle
        return scheduler.sync { lifecycle.status(over: base) }
    }

    /// A dongle as the lab describes it, from what this host knows of it (DongleService).
    public static func dongleInfo(_ local: LocalDongle?, selector: String, name: String, host: String?, agent: String?, tags: [String],
                                  identity: ControllerIdentity?) -> LabWire.DongleInfo {
        DongleService.dongleInfo(local, selector: selector, name: name, host: host, agent: agent, tags: tags, identity: identity)
    }
}

/// A node's radio as `Agent.Config.makeRadio` makes it: the transport the node runs on, and what
/// closes it at the run's end.
public struct NodeRadio {
    public var transport: any BLETransport
    public var close: () -> Void
    public init(transport: any BLETransport, close: @escaping () -> Void) { self.transport = transport; self.close = close }
}

/// The agent's background work (`Agent.services`).
public typealias AgentService = BackgroundWork
