import Foundation
import Synchronization
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
import Logging
import Yams

/// The agents the coordinator knows: what they say about themselves (registration and
/// heartbeats), the inventory, and the rules that make their messages fresh and bound. Each
/// message carries the agent's per-boot id and a counter that grows with every message of that
/// boot: a message whose counter is not above the last one seen for its boot is a replay and is
/// refused, so a captured heartbeat does not keep a stopped agent alive. A name alive at one
/// host is not taken over from another host until it stops heartbeating.
///
/// Owns its state (`Mutex<State>`, never held across an await); the identities it asks
/// (`IdentityService`), the dongles it tells (`DongleService` via `noteDongle`), SQLite
/// (`CoordinatorStore`) and the clock are given at `init`. Heartbeat times reach SQLite in
/// batches, written by `SeenFlusher`.
final class AgentRegistry: Sendable {
    /// What the registry's rules are told by the coordinator's configuration.
    struct Rules: Sendable {
        var missingAfter: Double
        var lostAfter: Double
        /// A TLS lab: a URL is one agent's.
        var tlsLab: Bool
        var heartbeatClockWindow: Double
        var heartbeatClockSamples: Int
        var heartbeatClockRoundTrip: Double
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
        /// agent's own in its next heartbeat, and the clock samples so made (AgentRegistry+Clock).
        var clockPending: PendingClock?
        var clocks: [TimedClockSample] = []
    }

    struct State {
        var agents: [String: AgentRecord] = [:]
        var inventory: [LabWire.AgentInfo] = []
        /// Heartbeat times due for SQLite, written together by `flushSeen`.
        var pendingSeen: [String: Double] = [:]
        /// Each agent's boots and message counters: replays are refused.
        var freshness: [String: Freshness] = [:]
    }

    let rules: Rules
    private let state: Mutex<State>
    private let store: CoordinatorStore
    private let identities: IdentityService
    let clock: any LabClock
    private let logger: Logger
    /// Told of each dongle an agent reports (`DongleService.note`).
    private let noteDongle: @Sendable (LabWire.DongleInfo, String) -> Void
    /// Woken when heartbeat times are due for SQLite (`SeenFlusher`).
    let seenDue = SeenFlusher.Signal()

    init(rules: Rules, store: CoordinatorStore, identities: IdentityService, inventory: [LabWire.AgentInfo], clock: any LabClock, logger: Logger,
         noteDongle: @escaping @Sendable (LabWire.DongleInfo, String) -> Void) throws {
        self.rules = rules
        self.store = store
        self.identities = identities
        self.clock = clock
        self.logger = logger
        self.noteDongle = noteDongle
        var initial = State()
        for a in try store.agents() {
            initial.agents[a.info.name] = AgentRecord(info: a.info, lastSeen: a.lastSeen, persistedSeen: a.lastSeen, status: nil, lastError: a.lastError, lastErrorAt: a.lastErrorAt)
        }
        initial.inventory = inventory
        state = Mutex(initial)
    }

    /// Runs `body` with the registry's state, under its lock (never across an await).
    func withState<T>(_ body: (inout State) throws -> T) rethrows -> T { try state.withLock { s in try body(&s) } }

    /// Runs `body` with the agents' records, under the lock (tests, and read-models).
    func withRecords<T>(_ body: (inout [String: AgentRecord]) throws -> T) rethrows -> T { try state.withLock { s in try body(&s.agents) } }

    // MARK: Liveness and views

    func liveness(_ lastSeen: Double, now: Double) -> Coordinator.Liveness {
        let age = now - lastSeen
        return age < rules.missingAfter ? .alive : (age < rules.lostAfter ? .missing : .lost)
    }

    var views: [Coordinator.AgentView] {
        let t = clock.now()
        return state.withLock { s in
            let inventoryNames = Set(s.inventory.map(\.name))
            var out = s.agents.values.sorted { $0.info.name < $1.info.name }.map { a in
                Coordinator.AgentView(info: a.info, state: liveness(a.lastSeen, now: t), lastSeen: a.lastSeen, status: a.status, inInventory: inventoryNames.contains(a.info.name),
                                      lastError: a.lastError, lastErrorAt: a.lastErrorAt)
            }
            for i in s.inventory where s.agents[i.name] == nil { out.append(Coordinator.AgentView(info: i, state: .unknown, lastSeen: nil, status: nil, inInventory: true)) }
            return out
        }
    }

    /// Latest heartbeat status per agent.
    var statuses: [String: LabWire.AgentStatus] {
        state.withLock { s in
            var out = [String: LabWire.AgentStatus]()
            for (name, a) in s.agents { if let st = a.status { out[name] = st } }
            return out
        }
    }

    /// Each agent's last heartbeat time and status (the dashboard's live view).
    var seen: [String: (Double, LabWire.AgentStatus?)] {
        state.withLock { s in Dictionary(s.agents.map { ($0.key, ($0.value.lastSeen, $0.value.status)) }, uniquingKeysWith: { a, _ in a }) }
    }

    /// Remembers what went wrong with an agent (shown by `herald-lab agents`, kept in SQLite).
    func agentError(_ name: String, _ message: String) {
        let t = clock.now()
        state.withLock { s in s.agents[name]?.lastError = message; s.agents[name]?.lastErrorAt = t }
        do { try store.saveError(name, message, at: t) } catch { logger.error("cannot save agent \(name)'s error: \(error)", metadata: ["agent": .string(name)]) }
    }

    /// Forgets a revoked agent (SQLite and memory).
    func forget(_ name: String) throws {
        try store.forgetAgent(name)
        state.withLock { s in s.agents[name] = nil }
    }

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

    // MARK: Freshness

    /// The boots seen per agent name, each with the last counter taken (at most `keptBoots`, the
    /// newest last); `current` is the boot of the last registration.
    struct Freshness {
        var boots: [(id: String, last: UInt64)] = []
        var current: String?
        static let keptBoots = 16

        /// Takes message `sequence` of boot `boot`, or says why it is refused.
        mutating func take(boot: String, sequence: UInt64, registering: Bool) -> String? {
            if let i = boots.firstIndex(where: { $0.id == boot }) {
                guard sequence > boots[i].last else { return "a replayed message (boot \(OutsideText.escaped(boot, limit: 64)), counter \(sequence), already at \(boots[i].last))" }
                boots[i].last = sequence
            } else {
                // A boot never seen: a registration, or (after a coordinator restart, when no
                // boot is known) the first heartbeat.
                guard registering || current == nil else { return "a boot that never registered" }
                boots.append((boot, sequence))
                if boots.count > Self.keptBoots { boots.removeFirst(boots.count - Self.keptBoots) }
            }
            if registering || current == nil { current = boot }
            return nil
        }
    }

    /// The boot id and counter every registration and heartbeat carries, checked for shape.
    static func freshnessFields(_ boot: String?, _ sequence: UInt64?) throws -> (String, UInt64) {
        guard let boot, let sequence else { throw LabRefusal(.invalid, "boot and sequence are required: every registration and heartbeat carries the agent's boot id and its message counter") }
        guard (8...64).contains(boot.utf8.count), SafeName.isValid(boot) else { throw LabRefusal(.invalid, "boot: 8 to 64 letters, digits, '-', '_' or '.'") }
        return (boot, sequence)
    }

    // MARK: Registration

    /// Bounds on what a registration may say (issue 36: a 600-character version, 100 tags and
    /// URLs holding `"><`, spaces or U+202E were stored and shown): the field and its problem.
    static func registrationProblem(_ info: LabWire.AgentInfo) -> String? {
        let esc = { (s: String) in OutsideText.escaped(s, limit: 80, quotes: true) }
        if info.url.utf8.count > 200 { return "url: longer than 200 characters" }
        if let c = info.url.unicodeScalars.first(where: { !($0.value > 0x20 && $0.value < 0x7f) || "\"<>\\^`{|}".unicodeScalars.contains($0) }) {
            return "url: \(esc(info.url)) holds \(esc(String(c))), which a URL may not (printable ASCII without spaces, quotes or <>)"
        }
        if info.version.count > 64 { return "version: longer than 64 characters" }
        if let c = info.version.unicodeScalars.first(where: { !($0.value > 0x20 && $0.value < 0x7f) }) {
            return "version: \(esc(info.version)) holds \(esc(String(c))); printable ASCII without spaces only"
        }
        if info.tags.count > PlanLimits.maximumTags { return "tags: \(info.tags.count) tags, at most \(PlanLimits.maximumTags)" }
        if let (i, t) = info.tags.enumerated().first(where: { !SafeName.isValid($0.element) }) { return "tags[\(i)]: \(esc(t)) \(OutsideText.line(SafeName.problem(with: t)!))" }
        if let a = info.adapter, a.count > 64 || SafeName.problem(with: a.replacingOccurrences(of: ":", with: "-")) != nil {
            return "adapter: \(esc(a)) is not an adapter name (hci0) or address"
        }
        if let b = info.boot, b.count > 64 { return "boot: longer than 64 characters" }
        if let c = info.controller, c.count > 32 || c.contains(where: { $0.key.count > 64 || $0.value.count > 500 }) { return "controller: more than 32 fields, or a name over 64 or a value over 500 characters" }
        return nil
    }

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

    /// An agent registers (POST /v1/agents/register).
    func register(_ given: LabWire.AgentInfo, principal: HTTPService.Principal?, peerHost: String?) throws {
        var info = given
        guard SafeName.isValid(info.name) else { throw LabRefusal(.invalid, "agent name \"\(HTTPService.escaped(info.name))\" \(SafeName.problem(with: info.name)!)") }
        if let problem = Self.registrationProblem(info) { throw LabRefusal(.invalid, problem) }
        try identities.mayActAs(info.name, principal)
        let (boot, sequence) = try Self.freshnessFields(info.boot, info.sequence)
        info.dongle = info.radio == .bluez ? info.dongle?.sanitised(agent: info.name) : nil
        let announced = info.url
        info.url = try Self.reachableURL(info, peerHost: peerHost)
        try identities.checkCallable(info.name, at: info.url)
        let t = clock.now()
        let esc = HTTPService.escaped
        let from = peerHost.map { " from \($0)" } ?? ""
        let refusal: String? = state.withLock { s in
            // The same name alive at another host: the first keeps it until it goes quiet.
            if let old = s.agents[info.name], liveness(old.lastSeen, now: t) == .alive, s.freshness[info.name]?.current != boot,
               let oldHost = Self.host(of: old.info.url), let newHost = Self.host(of: info.url), oldHost != newHost {
                return "agent \(info.name) is alive at \(esc(old.info.url)); a second agent presenting this name\(from) at \(esc(info.url)) is refused while the first heartbeats"
            }
            // In a TLS lab a URL is one agent's: another name alive there keeps it.
            if rules.tlsLab, let holder = s.agents.values.first(where: { $0.info.name != info.name && $0.info.url == info.url && liveness($0.lastSeen, now: t) == .alive }) {
                return "agent \(info.name) registers \(esc(info.url)), where agent \(holder.info.name) is alive; refused"
            }
            var f = s.freshness[info.name] ?? Freshness()
            let sameBoot = f.current == boot
            if let why = f.take(boot: boot, sequence: sequence, registering: true) { return "registration of agent \(info.name) refused: \(why)" }
            s.freshness[info.name] = f
            let old = s.agents[info.name]
            var record = AgentRecord(info: info, lastSeen: t, persistedSeen: t, status: old?.status, lastError: old?.lastError, lastErrorAt: old?.lastErrorAt)
            // The same agent process registering again at the same URL (a heartbeat of it failed)
            // keeps its clock samples; a new boot starts afresh.
            if sameBoot, let old, old.info.url == info.url { record.clocks = old.clocks }
            s.agents[info.name] = record
            return nil
        }
        if let refusal {
            logger.warning("\(refusal)", metadata: ["agent": .string(info.name)])
            agentError(info.name, refusal)
            throw LabRefusal(.conflict, refusal)
        }
        try store.saveAgent(info, lastSeen: t)
        if let d = info.dongle, info.radio == .bluez { noteDongle(d, info.name) }
        var ids: Logger.Metadata = ["agent": .string(info.name)]
        if let d = info.dongle { ids["dongle"] = .string(d.name) }
        logger.info("agent \(info.name) registered\(from) at \(esc(info.url))\(announced != info.url ? " (it announced \(esc(announced)))" : "") (radio \(info.radio.rawValue), tags \(esc(info.tags.joined(separator: ","))))",
                    metadata: ids)
    }

    // MARK: Heartbeats

    /// An agent's heartbeat (POST /v1/agents/NAME/heartbeat), `received` when it arrived;
    /// `taken` is told of each heartbeat taken (the dashboard's live view). The answer is when it
    /// arrived and when it was answered: the agent's next heartbeat reports its own stamps of
    /// this one (`LabWire.HeartbeatClock`), a clock sample (AgentRegistry+Clock).
    @discardableResult
    func heartbeat(_ name: String, _ given: LabWire.AgentStatus, principal: HTTPService.Principal?, received: Double? = nil,
                   taken: (String, LabWire.AgentStatus, Double) -> Void = { _, _, _ in }) throws -> LabWire.ClockReply {
        let received = received ?? clock.now()
        guard SafeName.isValid(name) else { throw LabRefusal(.invalid, "agent name \(SafeName.problem(with: name) ?? "is invalid")") }
        try identities.mayActAs(name, principal)
        let (boot, sequence) = try Self.freshnessFields(given.boot, given.sequence)
        try Self.checkClock(given.clock)
        if let problem = given.problem {
            // Said once per kind of refusal (logged, and the agent's last error on the
            // dashboard), not once per heartbeat.
            let why = "heartbeat refused: \(problem)"
            if state.withLock({ s in s.agents[name] != nil && s.agents[name]?.lastError != why }) {
                logger.warning("agent \(name): \(why)", metadata: ["agent": .string(name)])
                agentError(name, why)
            }
            throw LabRefusal(.invalid, "heartbeat of agent \(name) refused: \(problem)")
        }
        var status = given
        status.dongle = status.dongle?.sanitised(agent: name)
        let stamps = status.clock
        status.clock = nil
        let t = clock.now()
        enum Outcome { case taken(persist: Bool), unregistered, refused(String) }
        let outcome = state.withLock { s -> Outcome in
            guard var a = s.agents[name] else { return .unregistered }
            var f = s.freshness[name] ?? Freshness()
            // A boot other than the registered one registers first (the agent does on a 404).
            if let current = f.current, current != boot { return .unregistered }
            if let why = f.take(boot: boot, sequence: sequence, registering: false) { return .refused(why) }
            s.freshness[name] = f
            a.lastSeen = t
            a.status = status
            if let stamps { a.takeClock(stamps, boot: boot) }
            let due = t - a.persistedSeen >= 5
            if due { a.persistedSeen = t }
            s.agents[name] = a
            return .taken(persist: due)
        }
        switch outcome {
        case .unregistered: throw LabRefusal(.notFound, "agent \(name) is not registered (or registered from another boot); register first")
        case .refused(let why): throw LabRefusal(.conflict, "heartbeat of agent \(name) refused: \(why)")
        case .taken(let persist):
            if persist { persistSeen(name, at: t) }
            if let d = status.dongle { noteDongle(d, name) }
            taken(name, status, t)
        }
        return state.withLock { s in
            let sent = clock.now()
            s.agents[name]?.clockPending = PendingClock(boot: boot, sequence: sequence, received: received, sent: sent)
            return LabWire.ClockReply(received: received, sent: sent)
        }
    }

    /// The host of an agent URL, as certificates compare it.
    static func host(of url: String) -> String? {
        URLComponents(string: url)?.host.map { IdentityService.canonicalHost($0.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))) }
    }

    // MARK: Heartbeat times in SQLite

    /// Heartbeat times reach SQLite in batches: the first due time wakes `SeenFlusher`, which
    /// writes all those due within the next second in one transaction. One commit per agent
    /// and heartbeat (hundreds a second with a thousand agents, each several fsyncs) blocked the
    /// threads that answer HTTP; a restarted coordinator still knows each agent's last heartbeat
    /// to within about 6 s (5 s between saves, 1 s batching).
    func persistSeen(_ name: String, at t: Double) {
        let first = state.withLock { s -> Bool in
            let first = s.pendingSeen.isEmpty
            s.pendingSeen[name] = t
            return first
        }
        if first { seenDue.wake() }
    }

    /// Writes the pending heartbeat times.
    func flushSeen() {
        let batch = state.withLock { s -> [String: Double] in
            defer { s.pendingSeen = [:] }
            return s.pendingSeen
        }
        guard !batch.isEmpty else { return }
        do { try store.saveSeen(batch) } catch { logger.error("cannot save the heartbeats of \(batch.count) agents: \(error)") }
    }
}
