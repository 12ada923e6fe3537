import Foundation
import Hummingbird
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabLink
import LabNet
import LabPlan
import Yams
import Logging
import Synchronization

/// `herald-lab coordinator`: hands each agent its slice of a plan, starts them together, watches
/// them and gathers their logs into one bundle. Agents and runs are kept in SQLite, so a
/// restarted coordinator goes on watching and gathering where it was.
///
/// It composes services that each own their state (a `Mutex`) and take the clock, store and
/// logger at `init`: `IdentityService`, `AgentRegistry`, `DongleService`, `RunController`, and
/// the read-models `CoordinatorMetrics` and `Dashboard`. Its HTTP edge is Coordinator+Routes and
/// Dashboard.swift, which call the one-line forwards below; its long-lived work is `services`
/// (the run driver among them, which always runs).
public final class Coordinator: Sendable {
    public struct Config: Sendable {
        public var host = "127.0.0.1"
        public var port: UInt16 = 0
        public var results: URL
        /// The operator's credential (and, for agents not enrolled, the lab's shared token).
        public var token: String?
        /// The scrape credential: GET /metrics and nothing else (scrape.token in the credentials folder).
        public var scrapeToken: String?
        /// The credentials folder: the lab CA and its key (enrolment), this host's certificate.
        public var credentials: CredentialsFolder?
        /// Serve TLS with this (the credentials folder's cert.pem and key.pem).
        public var tls: TLSContext?
        /// Signs the air tickets of armed nodes (air.key).
        public var airKey: Data?
        /// No authentication (loopback only; the command checks).
        public var insecure = false
        public var inventory: URL?
        /// The air agents with a simulated radio attach to.
        public var air: LabWire.AirAddress?
        /// The least time between the last agent armed and the common start; the margin grows
        /// with the time arming took and the round trips measured.
        public var startMargin: Double = 1.0
        /// The furthest ahead a run's common start may be put (its margin covers arming and the
        /// slowest link); a run whose clocks cannot be bounded within it fails at arming.
        public var maxStartMargin: Double = 120
        /// Wrong credentials slowed per address: bearer tokens and the dashboard's sign-in.
        public var authThrottle = AuthThrottle.Rules()
        /// An agent is missing after this long without a heartbeat, lost after `lostAfter`.
        public var missingAfter: Double = 5
        public var lostAfter: Double = 60
        /// How long gathering keeps retrying an agent.
        public var gatherPatience: Double = 60
        /// Bundles of ended runs older than this many days are deleted (nil: kept for ever).
        public var retainDays: Double?
        /// A dongle is quarantined after this many failed checks, or outlier runs, in a row.
        public var quarantineAfter = 2
        /// The pre-flight bound when a plan gives none (seconds; 0: no pre-flight check).
        public var preflightBound: Double = AgentSelection.defaultPreflight
        /// Health-check every free dongle this often (seconds; nil: only on demand).
        public var healthCheckEvery: Double?
        /// How the coordinator reaches an agent (default: over HTTP); tests call agents in memory.
        public var agentLinks: AgentLinkFactory = HTTPAgentLink.factory
        /// An agent's clock is taken from the samples its heartbeats of the last
        /// `heartbeatClockWindow` seconds carry when there are at least `heartbeatClockSamples`
        /// of them, they agree, and they pin the offset to within ± `heartbeatClockRoundTrip`/2
        /// (± 1 ms: half the start-skew target); otherwise it is probed (AgentRegistry+Clock).
        public var heartbeatClockWindow: Double = 30
        public var heartbeatClockSamples = 3
        public var heartbeatClockRoundTrip: Double = 0.002
        /// Also records each analysed run here, besides history.sqlite: the shared results
        /// store's durable outbox (--history postgres://…, issue 41). Called in the gather; it
        /// must only queue, never wait for a server.
        public var recordRun: (@Sendable (AnalysisResult, URL) throws -> Void)?
        /// The history the dashboard's Trends read: the shared results store when the coordinator
        /// was started with --history (issue 41), else nil (results/history.sqlite).
        public var historyReader: (any HistoryReading)?
        /// Also records each study whose every planned run has ended (its runs, the levels'
        /// comparison) in the shared results store's outbox; must only queue.
        public var recordStudy: (@Sendable (FinishedStudy) throws -> Void)?
        /// This lab's name (--lab), written in every bundle's manifest.json.
        public var lab: String?
        /// The time the coordinator's rules see and wait on (issue 39 item 5): the wall clock in
        /// a process, a virtual clock in an in-memory lab.
        public var clock: any LabClock = WallClock()
        public init(results: URL) { self.results = results }
    }

    public let config: Config
    let http: HTTPService
    let store: CoordinatorStore
    /// Enrolled agents and the rule refusing a revoked one (IdentityService); read by the authenticator.
    let identities: IdentityService
    /// The agents: registrations, heartbeats, their clocks (AgentRegistry).
    let registry: AgentRegistry
    /// The lab's dongles and their health (DongleService).
    let dongles: DongleService
    /// The runs' course, from submission to bundle (RunController).
    let runs: RunController
    /// The dashboard's pages and live views over the services (Dashboard+Model).
    let pages: Dashboard
    /// The run driver and (with `background`) the other services when this coordinator runs them
    /// itself (`start`, `startUnserved`): one task holding them in a task group, cancelled and
    /// awaited by `stop`.
    private let background = Mutex<Task<Void, Never>?>(nil)
    /// GET /metrics: a read-model over the services (CoordinatorMetrics.swift).
    let metrics: CoordinatorMetrics
    /// The dashboard's sessions and live strips (Dashboard*.swift).
    let dashboard: DashboardState
    /// The coordinator's log (label herald-lab.coordinator): one line per event, run, node,
    /// agent and dongle as metadata; its handler escapes outside text (LabLogHandler). A run's
    /// lines are also kept for its dashboard page (`RunLogTee`, `RunEvents`).
    public let logger: Logger
    private let announced = Mutex("")
    public var url: String { announced.withLock { $0 } }

    /// `httpLogger` is its HTTP service's (nil: label herald-lab.http at `logger`'s level).
    public init(config: Config, logger: Logger = Logger(label: "herald-lab.coordinator"), httpLogger: Logger? = nil) throws {
        self.config = config
        let dashboard = try DashboardState()
        self.dashboard = dashboard
        let log = Logger(label: logger.label) { [clock = config.clock] _ in RunLogTee(inner: logger, events: dashboard.events, clock: clock) }
        self.logger = log
        let store = try CoordinatorStore(url: config.results.appendingPathComponent("coordinator.sqlite"))
        self.store = store
        let identityStore = try config.credentials.map { try IdentityStore(url: $0.url.appendingPathComponent("agents.sqlite")) }
        let identities = try IdentityService(store: identityStore, operatorToken: config.token, credentials: config.credentials, tlsLab: config.tls != nil,
                                             clock: config.clock, logger: log)
        self.identities = identities
        http = HTTPService(name: "coordinator", authenticate: config.insecure ? nil : HTTPService.withScraper(config.scrapeToken, Self.authenticator(operatorToken: config.token, identities: identities)), logger: httpLogger ?? HTTPService.defaultLogger(level: logger.logLevel), throttle: config.authThrottle)
        let dongles = try DongleService(store: store, quarantineAfter: config.quarantineAfter, clock: config.clock, logger: log)
        self.dongles = dongles
        registry = try AgentRegistry(rules: AgentRegistry.Rules(missingAfter: config.missingAfter, lostAfter: config.lostAfter, tlsLab: config.tls != nil,
                                                                heartbeatClockWindow: config.heartbeatClockWindow, heartbeatClockSamples: config.heartbeatClockSamples,
                                                                heartbeatClockRoundTrip: config.heartbeatClockRoundTrip),
                                     store: store, identities: identities, inventory: try config.inventory.map(AgentRegistry.loadInventory) ?? [],
                                     clock: config.clock, logger: log, noteDongle: { dongles.note($0, agent: $1) })
        runs = try RunController(config: config, store: store, registry: registry, dongles: dongles, identities: identities, logger: log)
        pages = Dashboard(config: config, state: dashboard, runs: runs, registry: registry, logger: log)
        metrics = CoordinatorMetrics(runs: runs, registry: registry, dongles: dongles, results: config.results, clock: config.clock, logger: log)
        http.serve { routes in
            CoordinatorRoutes.register(on: self, routes)
            CoordinatorRoutes.registerMetrics(on: self, routes)
            DashboardRoutes(coordinator: self).register(routes)
        }
        runs.onEnded { [weak self] r in self?.recordStudyIfFinished(r) }
    }

    /// The coordinator's time: `Config.clock`'s.
    var now: Double { config.clock.now() }

    /// Serves HTTP, resumes unfinished runs and runs the run driver and (with `background`) the
    /// other `services` itself, in one task that `stop` cancels and awaits.
    public func start(background runBackground: Bool = true) async throws -> UInt16 {
        let port = try await http.start(host: config.host, port: config.port, tls: config.tls)
        listening(on: port, work: runBackground ? .all : .runs)
        return port
    }

    /// The coordinator's HTTP server, for the process's ServiceGroup (which runs `services`, the
    /// run driver among them, beside it): once it listens unfinished runs resume, then
    /// `onStarted` gets the bound port.
    public func server(onStarted: @escaping @Sendable (UInt16) async -> Void) throws -> HTTPService.Server {
        try http.server(host: config.host, port: config.port, tls: config.tls) { [weak self] port in
            self?.listening(on: port, work: .none)
            await onStarted(port)
        }
    }

    /// Which of `services` this coordinator runs itself: none (the process's ServiceGroup runs
    /// them all), the run driver alone, or all of them.
    private enum OwnWork { case none, runs, all }

    /// What starting does once the server listens on `port`.
    private func listening(on port: UInt16, work: OwnWork) {
        let url = "\(config.tls == nil ? "http" : "https")://\(HostPort.urlHost(config.host)):\(port)"
        announced.withLock { $0 = url }
        logger.notice("listening on \(config.host):\(port) (results \(config.results.path))")
        startWork(work)
    }

    /// Starts the coordinator without serving HTTP, for agents in this process (`LocalCoordinatorLink`,
    /// with `Config.agentLinks` reaching them): unfinished runs resume, the run driver runs, and
    /// (with `background`) the other background services.
    public func startUnserved(background runBackground: Bool = true) {
        logger.notice("started without serving (results \(config.results.path))")
        startWork(runBackground ? .all : .runs)
    }

    /// What `start` does besides serving.
    private func startWork(_ work: OwnWork) {
        // Pick up runs a previous coordinator left unfinished (queued until the driver takes them).
        runs.resumeUnfinished()
        let services: [CoordinatorService]
        switch work {
        case .none: return
        case .runs: services = [runDriver]
        case .all: services = self.services
        }
        // The one task that holds the run driver and the background services (a task group):
        // cancelled and awaited by `stop`.
        let task = Task {
            await withTaskGroup(of: Void.self) { group in
                for service in services { group.addTask { await service.run() } }
            }
        }
        background.withLock { $0 = task }
    }

    /// Each run's course and each notice to the air, as child tasks (`RunController.driveRuns`):
    /// the service that runs whenever the coordinator does, even without the background ones.
    var runDriver: CoordinatorService {
        CoordinatorService(name: "runs") { [runs] in await runs.driveRuns() }
    }

    /// The coordinator's long-lived work besides HTTP, each running until cancelled: the run
    /// driver (`runDriver`), heartbeat times to SQLite, the scheduled health checks
    /// (`healthCheckEvery`), the retention's housekeeping (`retainDays`).
    public var services: [CoordinatorService] {
        var out = [runDriver, SeenFlusher.service(registry, clock: config.clock)]
        if let every = config.healthCheckEvery {
            out.append(CoordinatorService(name: "health checks") { [weak self] in await self?.healthChecks(every: every) })
        }
        if config.retainDays != nil {
            out.append(CoordinatorService(name: "housekeeping") { [weak self] in await self?.housekeeping() })
        }
        return out
    }

    /// Health-checks every free dongle every `every` seconds until cancelled.
    func healthChecks(every: Double) async {
        while !Task.isCancelled {
            // Cancellation (stop) is the one way out: the loop's condition ends it.
            do { try await config.clock.sleep(for: every) } catch { return }
            do {
                let result = try await checkDongles(LabWire.CheckRequest(dongles: nil, bound: nil))
                logger.info("scheduled health check \(result.id): \(result.verdicts.filter(\.ok).count) of \(result.verdicts.count) dongles passed\(result.quarantined.isEmpty ? "" : "; quarantined: \(result.quarantined.joined(separator: ", "))")")
            } catch { logger.warning("scheduled health check skipped: \(error)") }
        }
    }

    /// Applies the retention now and every hour until cancelled.
    func housekeeping() async {
        while !Task.isCancelled {
            applyRetention()
            // Cancellation (stop) is the one way out.
            do { try await config.clock.sleep(for: 3600) } catch { return }
        }
    }

    /// Stops every run's work and waits for it, and for the background services this coordinator
    /// runs itself (the runs resume from their records at the next start); then closes HTTP.
    public func stop() async {
        runs.cancelAll()
        if let task = background.withLock({ $0 }) {
            task.cancel()
            await task.value
        }
        await http.stop()
        registry.flushSeen()
    }

    /// Runs `body` with the runs, under their lock (`RunController.withLock`; never across an await).
    func withLock<T>(_ body: (inout RunController.State) throws -> T) rethrows -> T { try runs.withLock(body) }

    public enum Liveness: String, Codable, Sendable { case alive, missing, lost, unknown }

    public struct AgentView: Codable, Sendable {
        public var info: LabWire.AgentInfo
        public var state: Liveness
        public var lastSeen: Double?
        public var status: LabWire.AgentStatus?
        public var inInventory: Bool
        /// The last thing that went wrong talking to this agent, and when.
        public var lastError: String?
        public var lastErrorAt: Double?
    }

    public var agentViews: [AgentView] { registry.views }

    /// Remembers what went wrong with an agent (`AgentRegistry.agentError`).
    func agentError(_ name: String, _ message: String) { registry.agentError(name, message) }

    /// An agent registers (POST /v1/agents/register; AgentRegistry).
    func register(_ given: LabWire.AgentInfo, principal: HTTPService.Principal?, peerHost: String?) throws {
        try registry.register(given, principal: principal, peerHost: peerHost)
    }

    /// An agent's heartbeat (POST /v1/agents/NAME/heartbeat; AgentRegistry), noted for the
    /// dashboard's live view.
    @discardableResult
    func heartbeat(_ name: String, _ given: LabWire.AgentStatus, principal: HTTPService.Principal?, received: Double? = nil) throws -> LabWire.ClockReply {
        try registry.heartbeat(name, given, principal: principal, received: received) { [pages] agent, status, t in pages.noteLive(agent, status, at: t) }
    }

    // MARK: The run controller's, for the routes and the dashboard

    /// Validates the plan, selects agents, records the run and starts it (`RunController.submit`).
    public func submit(planText: String, source: String) throws -> RunRecord { try runs.submit(planText: planText, source: source) }
    func run(_ id: String) -> RunRecord? { runs.run(id) }
    func save(_ r: RunRecord) throws { try runs.save(r) }
    func update(_ r: RunRecord) { runs.update(r) }
    func launch(_ id: String) { runs.launch(id) }
    func endBeforeStart(_ record: RunRecord, state: RunRecord.State, message: String) async -> RunRecord {
        await runs.endBeforeStart(record, state: state, message: message)
    }
    func checkDongles(_ request: LabWire.CheckRequest) async throws -> LabWire.CheckResult { try await runs.checkDongles(request) }
    func applyRetention() { runs.applyRetention() }
    static func stamp(_ t: Double) -> String { RunController.stamp(t) }

    /// Stops a run: one not yet started is cancelled; a running one stops its nodes and what
    /// exists is gathered (POST /v1/runs/:id/abort, the dashboard's abort button).
    func abort(_ id: String) async throws -> RunRecord {
        guard var r = run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
        switch r.state {
        case .arming where r.startAt == nil:
            runs.stopWork(id)
            return await endBeforeStart(r, state: .cancelled, message: "aborted before the start")
        case .arming, .running:
            r.abortRequested = true
            try save(r)
            logger.notice("run \(id): abort requested; nodes stop, what exists is gathered", metadata: ["run": .string(id)])
            return r
        default:
            throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): nothing to abort")
        }
    }

    /// Brings every metrics family up to date (`CoordinatorMetrics.collect`).
    func collectMetrics() { metrics.collect() }

    /// Where the dashboard shows a run (printed by `herald-lab run`).
    public static func dashboardPath(run id: String) -> String { "/runs/\(id)" }
}
