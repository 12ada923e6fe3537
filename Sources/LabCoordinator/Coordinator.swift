import Foundation
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
/// restarted coordinator goes on watching and gathering where it was. Routes are in
/// Coordinator+Routes, a run's course in Coordinator+Run, gathering and the bundle in
/// Coordinator+Gather.
///
/// Concurrency: what the coordinator knows of agents, runs and dongles is one `State` in a
/// `Mutex` (`withLock`); submissions are serialised by a `Mutex` of their own.
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
        /// (± 1 ms: half the start-skew target); otherwise it is probed (Coordinator+Clock).
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

    /// What the coordinator knows of one agent.
    struct AgentRecord {
        var info: LabWire.AgentInfo
        var lastSeen: Double
        var persistedSeen: Double
        var status: LabWire.AgentStatus?
        var lastError: String?
        var lastErrorAt: Double?
        /// The coordinator's stamps of its last answer to this agent's heartbeats, waiting for the
        /// agent's own in its next heartbeat, and the clock samples so made (Coordinator+Clock).
        var clockPending: PendingClock?
        var clocks: [TimedClockSample] = []
    }

    public let config: Config
    let http: HTTPService
    let store: CoordinatorStore
    /// Enrolled agents (the credentials folder's agents.sqlite), when there is a folder.
    let identityStore: IdentityStore?
    /// What the coordinator knows, under one lock (`withLock`).
    struct State {
        var agents: [String: AgentRecord] = [:]
        var inventory: [LabWire.AgentInfo] = []
        var runs: [String: RunRecord] = [:]
        /// Dongles by key (Coordinator+Dongles), and the agents whose dongles are being checked.
        var dongles: [String: DongleRecord] = [:]
        var checking: Set<String> = []
        /// Each run's task (Coordinator+Run).
        var tasks: [String: Task<Void, Never>] = [:]
        /// Heartbeat times due for SQLite, written together by `flushSeen` (Coordinator+Routes).
        var pendingSeen: [String: Double] = [:]
        /// Each agent's boots and message counters (Coordinator+Agents): replays are refused.
        var freshness: [String: Freshness] = [:]
    }
    private let state: Mutex<State>
    /// Enrolled agents' credentials (Coordinator+Identity); read by the authenticator.
    let identities: IdentityTable
    /// The scheduled health checks and the retention's housekeeping, once started.
    private let background = Mutex<(healthChecks: Task<Void, Never>?, housekeeping: Task<Void, Never>?)>((nil, nil))
    /// Held from selecting a run's agents until the run is recorded: two submissions never
    /// both take one agent.
    private let submitting = Mutex(())
    let seenQueue = DispatchQueue(label: "heraldlab.coordinator.seen")
    /// GET /metrics (Coordinator+Metrics).
    let metrics = CoordinatorMetrics()
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
        self.logger = Logger(label: logger.label) { [clock = config.clock] _ in RunLogTee(inner: logger, events: dashboard.events, clock: clock) }
        let store = try CoordinatorStore(url: config.results.appendingPathComponent("coordinator.sqlite"))
        self.store = store
        identityStore = try config.credentials.map { try IdentityStore(url: $0.url.appendingPathComponent("agents.sqlite")) }
        let identities = IdentityTable(Identities(try identityStore?.credentials() ?? []))
        self.identities = identities
        http = HTTPService(name: "coordinator", authenticate: config.insecure ? nil : HTTPService.withScraper(config.scrapeToken, Self.authenticator(operatorToken: config.token, identities: identities)), logger: httpLogger ?? HTTPService.defaultLogger(level: logger.logLevel), throttle: config.authThrottle)
        var initial = State()
        for a in try store.agents() {
            initial.agents[a.info.name] = AgentRecord(info: a.info, lastSeen: a.lastSeen, persistedSeen: a.lastSeen, status: nil, lastError: a.lastError, lastErrorAt: a.lastErrorAt)
        }
        for r in try store.runs() { initial.runs[r.id] = r }
        for d in try store.dongles() { initial.dongles[d.id] = d }
        if let inv = config.inventory { initial.inventory = try Self.loadInventory(inv) }
        state = Mutex(initial)
        routes()
        metricsRoute()
        dashboardRoutes()
    }

    /// The coordinator's time: `Config.clock`'s.
    var now: Double { config.clock.now() }

    public func start() async throws -> UInt16 {
        let port = try await http.start(host: config.host, port: config.port, tls: config.tls)
        let url = "\(config.tls == nil ? "http" : "https")://\(HostPort.urlHost(config.host)):\(port)"
        announced.withLock { $0 = url }
        logger.notice("listening on \(config.host):\(port) (results \(config.results.path))")
        startWork()
        return port
    }

    /// Starts the coordinator without serving HTTP, for agents in this process (`LocalCoordinatorLink`,
    /// with `Config.agentLinks` reaching them): unfinished runs resume, checks and housekeeping start.
    public func startUnserved() {
        logger.notice("started without serving (results \(config.results.path))")
        startWork()
    }

    /// What `start` does besides serving.
    private func startWork() {
        // Pick up runs a previous coordinator left unfinished.
        let unfinished = withLock { s in s.runs.values.filter { !$0.state.isFinal } }
        for r in unfinished {
            logger.notice("resuming run \(r.id) (\(r.state.rawValue))", metadata: ["run": .string(r.id)])
            launch(r.id)
        }
        if let every = config.healthCheckEvery {
            let healthChecks = Task { [weak self] in
                while !Task.isCancelled {
                    // Cancellation (stop) is the one way out: the guard below ends the loop.
                    try? await self?.config.clock.sleep(for: every)
                    guard let self, !Task.isCancelled else { return }
                    do {
                        let result = try await self.checkDongles(LabWire.CheckRequest(dongles: nil, bound: nil))
                        self.logger.info("scheduled health check \(result.id): \(result.verdicts.filter(\.ok).count) of \(result.verdicts.count) dongles passed\(result.quarantined.isEmpty ? "" : "; quarantined: \(result.quarantined.joined(separator: ", "))")")
                    } catch { self.logger.warning("scheduled health check skipped: \(error)") }
                }
            }
            background.withLock { $0.healthChecks = healthChecks }
        }
        if config.retainDays != nil {
            let housekeeping = Task { [weak self] in
                while !Task.isCancelled {
                    self?.applyRetention()
                    // Cancellation (stop) is the one way out: the while ends the loop.
                    try? await self?.config.clock.sleep(for: 3600)
                }
            }
            background.withLock { $0.housekeeping = housekeeping }
        }
    }

    public func stop() async {
        withLock { s in for t in s.tasks.values { t.cancel() } }
        let (healthChecks, housekeeping) = background.withLock { $0 }
        housekeeping?.cancel()
        healthChecks?.cancel()
        await http.stop()
        seenQueue.sync { flushSeen() }
    }

    /// Runs `body` with the coordinator's state, under its lock (never across an await).
    func withLock<T>(_ body: (inout State) throws -> T) rethrows -> T { try state.withLock { s in try body(&s) } }

    // MARK: Inventory

    static func loadInventory(_ url: URL) throws -> [LabWire.AgentInfo] {
        let text = try String(contentsOf: url, encoding: .utf8)
        guard let root = try Yams.load(yaml: text) as? [String: Any], let list = root["agents"] as? [[String: Any]] else {
            throw LabRefusal(.invalid, "\(url.path): expected `agents:` with a list of {name, url, tags}")
        }
        return try list.enumerated().map { i, a in
            guard let name = a["name"] as? String, SafeName.isValid(name) else { throw LabRefusal(.invalid, "\(url.path): agents[\(i)].name missing or invalid") }
            let radioText = a["radio"] as? String ?? "sim"
            guard let radio = RadioKind(rawValue: radioText) else { throw LabRefusal(.invalid, "\(url.path): agents[\(i)].radio \"\(radioText)\": must be sim or bluez") }
            return LabWire.AgentInfo(name: name, url: a["url"] as? String ?? "", tags: a["tags"] as? [String] ?? [], radio: radio,
                                     adapter: a["adapter"] as? String, controller: nil, version: "")
        }
    }

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

    func liveness(_ lastSeen: Double) -> Liveness {
        let age = now - lastSeen
        return age < config.missingAfter ? .alive : (age < config.lostAfter ? .missing : .lost)
    }

    public var agentViews: [AgentView] {
        withLock { s in
            let inventoryNames = Set(s.inventory.map(\.name))
            var out = s.agents.values.sorted { $0.info.name < $1.info.name }.map { a in
                AgentView(info: a.info, state: liveness(a.lastSeen), lastSeen: a.lastSeen, status: a.status, inInventory: inventoryNames.contains(a.info.name),
                          lastError: a.lastError, lastErrorAt: a.lastErrorAt)
            }
            for i in s.inventory where s.agents[i.name] == nil { out.append(AgentView(info: i, state: .unknown, lastSeen: nil, status: nil, inInventory: true)) }
            return out
        }
    }

    /// Remembers what went wrong with an agent (shown by `herald-lab agents`, kept in SQLite).
    func agentError(_ name: String, _ message: String) {
        let t = now
        withLock { s in s.agents[name]?.lastError = message; s.agents[name]?.lastErrorAt = t }
        do { try store.saveError(name, message, at: t) } catch { logger.error("cannot save agent \(name)'s error: \(error)", metadata: ["agent": .string(name)]) }
    }

    // MARK: Registration

    /// Where to call an agent: the URL it announces, except that an agent bound to a wildcard
    /// address (0.0.0.0, ::) is called at the address its registration came from, on its port.
    static func reachableURL(_ info: LabWire.AgentInfo, peerHost: String?) throws -> String {
        guard let u = URLComponents(string: info.url), let scheme = u.scheme, scheme == "http" || scheme == "https", let host = u.host else {
            throw LabRefusal(.invalid, "agent \(info.name) announces \"\(info.url)\", which is not an http URL")
        }
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        guard HostPort.isWildcard(bare) else { return info.url }
        guard let peer = peerHost, let port = info.port ?? u.port.flatMap(UInt16.init(exactly:)) else {
            throw LabRefusal(.invalid, "agent \(info.name) announces \(info.url) (a wildcard address) and its own address is unknown: start it with --advertise-url")
        }
        let mapped = peer.hasPrefix("::ffff:") && peer.contains(".") ? String(peer.dropFirst(7)) : peer
        return "\(scheme)://\(HostPort.urlHost(mapped)):\(port)"
    }

    // MARK: Submitting

    /// Validates the plan, selects agents, records the run and starts it.
    public func submit(planText: String, source: String) throws -> RunRecord {
        let plan: Plan
        do { plan = try Plan.parse(yaml: planText, source: source) } catch {
            throw LabRefusal(.invalid, error.description)
        }
        let personas = plan.nodes.filter { $0.persona != nil }
        guard personas.isEmpty else {
            throw LabRefusal(.invalid, "\(personas.map { "\($0.name) (persona \($0.persona!.rawValue))" }.joined(separator: ", ")): personas are simulated phones; a lab runs Linux nodes only (herald-lab simulate runs them)")
        }
        return try submitting.withLock { _ in try submitSelected(plan, planText: planText) }
    }

    /// The rest of `submit`, while it holds `submitting`.
    private func submitSelected(_ plan: Plan, planText: String) throws -> RunRecord {
        let selection = try select(plan)
        let selected = selection.chosen
        var rng = SystemRandomNumberGenerator()
        let stamp = Self.stamp(now)
        // Run ids are names on every agent's disk: at most 64 characters.
        let id = "\(plan.name.prefix(40))-\(stamp)-\(String(format: "%04x", UInt16.random(in: 0...UInt16.max, using: &rng)))"
        let nodes = zip(plan.nodes, selected).map { spec, agent in
            RunRecord.Node(name: spec.name, agent: agent.name, agentURL: agent.url, state: .selected, files: [],
                           dongle: agent.dongle, dongleHealth: dongleRecord(of: agent)?.health ?? (agent.dongle == nil ? nil : .unknown))
        }
        var record = RunRecord(id: id, plan: plan.name, planText: planText, state: .arming, created: now, duration: plan.duration,
                               warmup: plan.warmup, air: config.air, nodes: nodes)
        if !selection.spares.isEmpty {
            record.spares = selection.spares.map { RunRecord.Spare(agent: $0.name, agentURL: $0.url, dongle: $0.dongle, dongleHealth: dongleRecord(of: $0)?.health) }
        }
        try save(record)
        logger.notice("run \(id) submitted: \(plan.nodes.count) nodes on agents \(selected.map { "\($0.name) (\($0.url))" }.joined(separator: ", "))\(selection.spares.isEmpty ? "" : "; spares \(selection.spares.map(\.name).joined(separator: ", "))")", metadata: ["run": .string(id)])
        launch(id)
        return record
    }

    static func stamp(_ t: Double) -> String {
        let s = HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: t))
        return s.replacingOccurrences(of: "-", with: "").replacingOccurrences(of: ":", with: "").replacingOccurrences(of: " ", with: "-")
    }

    /// The agents chosen for a plan's nodes, in node order, and the spares checked with them.
    struct Selection {
        var chosen: [LabWire.AgentInfo]
        var spares: [LabWire.AgentInfo] = []
    }

    /// Picks one alive agent per node: by the plan's names or dongle names, else by tags, radio
    /// and (radio bluez) the dongle's make and firmware, plus the spares asked for. Busy agents
    /// are skipped, and so is a second agent name at the URL of one already chosen: one agent
    /// slot never runs two nodes. With radio bluez, a dongle that is quarantined, in maintenance
    /// or retired is never chosen; known good dongles come before unknown ones.
    func select(_ plan: Plan) throws -> Selection {
        let views = agentViews.filter { $0.state == .alive }
        let (active, inCheck) = withLock { s in (s.runs.values.filter { !$0.state.isFinal }, s.checking) }
        let busyNames = Set(active.flatMap { $0.nodes.map(\.agent) + ($0.spares ?? []).map(\.agent) }).union(inCheck)
        let busyURLs = Set(active.flatMap { $0.nodes.map(\.agentURL) + ($0.spares ?? []).map(\.agentURL) })
        func busy(_ i: LabWire.AgentInfo) -> Bool { busyNames.contains(i.name) || busyURLs.contains(i.url) }
        let bluez = plan.radio.kind == .bluez
        /// Why an agent's dongle may not be chosen, nil when it may.
        func unusable(_ i: LabWire.AgentInfo) -> String? {
            guard bluez, let r = dongleRecord(of: i), !r.health.selectable else { return nil }
            return "dongle \(r.info.name) (\(r.id)) is \(r.health.rawValue)\(r.healthReason.map { ": \($0)" } ?? "")"
        }
        let need = plan.nodes.count
        if let names = plan.agents.names {
            var out = [LabWire.AgentInfo]()
            for n in names {
                guard let v = views.first(where: { $0.info.name == n }) else { throw LabRefusal(.conflict, "plan \(plan.name) names agent \(n), which is not alive (alive: \(views.map(\.info.name).joined(separator: ", ")))") }
                // A named agent must have the plan's radio too: a bluez agent given a simulated
                // plan would run its whole duration for nothing.
                guard v.info.radio == plan.radio.kind else {
                    throw LabRefusal(.conflict, "plan \(plan.name) has radio \(plan.radio.kind.rawValue), but agent \(n) was installed with radio \(v.info.radio.rawValue) (agents/install.sh --radio \(plan.radio.kind.rawValue) installs it for this plan)")
                }
                guard !busy(v.info) else { throw LabRefusal(.conflict, "agent \(n) (\(v.info.url)) is busy with another run") }
                if let why = unusable(v.info) { throw LabRefusal(.conflict, "agent \(n): \(why); release it with herald-lab dongles release when it is fixed") }
                if let same = out.first(where: { $0.url == v.info.url }) {
                    throw LabRefusal(.conflict, "agents \(same.name) and \(n) are both registered at \(v.info.url): one agent cannot run two nodes")
                }
                out.append(v.info)
            }
            return Selection(chosen: out)
        }
        if let names = plan.agents.dongles {
            var out = [LabWire.AgentInfo]()
            for n in names {
                let driving = views.filter { $0.info.radio == .bluez && $0.info.dongle?.name == n }
                guard let v = driving.first else {
                    let known = views.compactMap { $0.info.dongle?.name }.sorted()
                    throw LabRefusal(.conflict, "plan \(plan.name) names dongle \(n), which no alive agent drives (dongles: \(known.isEmpty ? "none" : known.joined(separator: ", ")))")
                }
                guard driving.count == 1 else { throw LabRefusal(.conflict, "\(driving.count) agents drive a dongle named \(n) (\(driving.map(\.info.name).joined(separator: ", "))): name them apart") }
                guard !busy(v.info) else { throw LabRefusal(.conflict, "dongle \(n) (agent \(v.info.name)) is busy with another run") }
                if let why = unusable(v.info) { throw LabRefusal(.conflict, "\(why); release it with herald-lab dongles release \(n) when it is fixed") }
                if let same = out.first(where: { $0.url == v.info.url }) {
                    throw LabRefusal(.conflict, "agents \(same.name) and \(v.info.name) are both registered at \(v.info.url): one agent cannot run two nodes")
                }
                out.append(v.info)
            }
            return Selection(chosen: out)
        }
        // The radio, the tags and the dongle's make and firmware: the rule `plan check` and
        // `run STUDY` apply too (LabPlan's AgentNeeds).
        let needs = plan.needs
        var fit = [LabWire.AgentInfo]()
        var excluded = [String]()
        var fitURLs = Set<String>() // the URLs in `fit`: one look-up per agent, not a scan of `fit`
        for v in views where needs.admits(v.info) && !busy(v.info) {
            if bluez, let why = unusable(v.info) { excluded.append(why); continue }
            if !fitURLs.insert(v.info.url).inserted { continue }
            fit.append(v.info)
        }
        if bluez {
            // Known good dongles first, then unknown ones, each in name order.
            let good = fit.filter { dongleRecord(of: $0)?.health == .good }
            fit = good + fit.filter { dongleRecord(of: $0)?.health != .good }
        }
        guard fit.count >= need else {
            let excludedText = excluded.isEmpty ? "" : "; not selectable: \(excluded.joined(separator: "; "))"
            throw LabRefusal(.conflict, "plan \(plan.name) needs \(needs), but only \(fit.count) are alive and free\(fit.isEmpty ? "" : ": \(fit.map(\.name).joined(separator: ", "))")\(excludedText); start more agents or lower the node count")
        }
        let spares = min(plan.agents.spares ?? 0, fit.count - need)
        return Selection(chosen: Array(fit.prefix(need)), spares: Array(fit[need..<(need + spares)]))
    }

    func launch(_ id: String) {
        let task = Task { [weak self] in
            guard let self else { return }
            await self.drive(id)
        }
        withLock { s in s.tasks[id] = task }
    }

    func run(_ id: String) -> RunRecord? { withLock { s in s.runs[id] } }

    /// Records a run in memory and in SQLite; throws when SQLite cannot (callers that are about to
    /// let agents delete data must not go on).
    func save(_ r: RunRecord) throws {
        var r = r
        if r.state.isFinal && r.ended == nil { r.ended = now }
        withLock { s in s.runs[r.id] = r }
        try store.saveRun(r)
    }

    /// `save`, logging a failure (for progress that loses nothing if it is not recorded).
    func update(_ r: RunRecord) {
        do { try save(r) } catch { logger.error("cannot save run \(r.id): \(error)", metadata: ["run": .string(r.id)]) }
    }

    // MARK: Retention

    /// Deletes the bundles of ended runs older than `retainDays`; the run records stay.
    func applyRetention() {
        guard let days = config.retainDays else { return }
        let cutoff = now - days * 86_400
        let old = withLock { s in s.runs.values.filter { $0.state.isFinal && $0.created < cutoff && $0.bundle != nil } }
        for var r in old {
            let fm = FileManager.default
            for u in [config.results.appendingPathComponent(r.id), config.results.appendingPathComponent("\(r.id).tar.gz")] where fm.fileExists(atPath: u.path) {
                do { try fm.removeItem(at: u) } catch { logger.error("retention: cannot delete \(u.path): \(error)", metadata: ["run": .string(r.id)]); continue }
            }
            r.bundle = nil
            r.message = [r.message, "bundle deleted after \(String(format: "%g", days)) days (retention)"].compactMap { $0 }.joined(separator: "; ")
            update(r)
            logger.info("retention: deleted the bundle of run \(r.id)", metadata: ["run": .string(r.id)])
        }
    }
}
