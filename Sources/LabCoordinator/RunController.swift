import Foundation
import Synchronization
import HeraldAnalysis
import HeraldCore
import LabHTTP
import LabLink
import LabNet
import LabPlan
import RadioAir
import Logging

/// A run's course on the coordinator, from submission to its bundle: select agents, check their
/// dongles (radio bluez), arm every agent, start them together (`StartBarrier`), watch them,
/// gather their logs into one bundle, judge the dongles, keep or delete old bundles. Every step
/// can be resumed after a coordinator restart from the run's record (SQLite).
///
/// Owns the runs (`Mutex<State>`, never held across an await) and their work (`RunDriver`: each
/// run's course a child task of `driveRuns`, stopped by id with `stopWork`); asks the agent
/// registry (who is alive, their status and clocks), the dongle service, the identity service
/// (whom to call with what); the clock is injected. The course is in RunController+Course, the
/// gathering in RunController+Gather, the dongle checks in RunController+Checks.
final class RunController: Sendable {
    struct State {
        var runs: [String: RunRecord] = [:]
    }

    let config: Coordinator.Config
    let logger: Logger
    let store: CoordinatorStore
    let registry: AgentRegistry
    let dongles: DongleService
    let identities: IdentityService
    private let state: Mutex<State>
    /// Each run's work and each notice to the air, as child tasks of `driveRuns`.
    let driver: RunDriver
    /// Held from selecting a run's agents until the run is recorded: two submissions never
    /// both take one agent.
    private let submitting = Mutex(())
    /// Told of each run that ended with its bundle (the shared studies' record).
    private let endedHook = Mutex<(@Sendable (RunRecord) -> Void)?>(nil)

    init(config: Coordinator.Config, store: CoordinatorStore, registry: AgentRegistry, dongles: DongleService, identities: IdentityService, logger: Logger) throws {
        self.config = config
        self.store = store
        self.registry = registry
        self.dongles = dongles
        self.identities = identities
        self.logger = logger
        driver = RunDriver(logger: logger)
        var initial = State()
        for r in try store.runs() { initial.runs[r.id] = r }
        state = Mutex(initial)
    }

    /// The run controller's time: `Config.clock`'s.
    var now: Double { config.clock.now() }

    /// Runs `body` with the runs, under their lock (never across an await).
    func withLock<T>(_ body: (inout State) throws -> T) rethrows -> T { try state.withLock { s in try body(&s) } }

    /// Sets what is told of each run that ended with its bundle.
    func onEnded(_ hook: @escaping @Sendable (RunRecord) -> Void) { endedHook.withLock { $0 = hook } }

    func ended(_ r: RunRecord) { endedHook.withLock { $0 }?(r) }

    /// Remembers what went wrong with an agent (`AgentRegistry.agentError`).
    func agentError(_ name: String, _ message: String) { registry.agentError(name, message) }

    /// The credential to call `agent` with (`IdentityService.credentialForCalling`).
    func credentialForCalling(_ agent: String, chosenAt: Double? = nil) throws -> String? {
        try identities.credentialForCalling(agent, chosenAt: chosenAt)
    }

    /// Why `agent` is not called for a run that chose it at `chosenAt` (nil: it is).
    func notCalled(_ agent: String, chosenAt: Double) -> String? { identities.notCalled(agent, chosenAt: chosenAt) }

    /// Resumes every run a previous coordinator left unfinished (not one already launched in this
    /// one: submitted before the start, its work is queued already).
    func resumeUnfinished() {
        let launched = Set(driver.live)
        let unfinished = withLock { s in s.runs.values.filter { !$0.state.isFinal && !launched.contains($0.id) } }
        for r in unfinished {
            logger.notice("resuming run \(r.id) (\(r.state.rawValue))", metadata: ["run": .string(r.id)])
            launch(r.id)
        }
    }

    /// Stops every run's work (the coordinator stops; the runs resume at its next start).
    func cancelAll() { driver.stopAll() }

    /// Stops the work of run `id` (abort or cancel before its start): the other runs go on.
    func stopWork(_ id: String) { driver.stop(id) }

    /// Runs every launched run's course and every notice to the air as child tasks until
    /// cancelled, then waits for them to end (`RunDriver.run`): the coordinator's one service that
    /// always runs (`Coordinator.services`).
    func driveRuns() async {
        await driver.run(drive: { [weak self] id in await self?.drive(id) },
                         tell: { [weak self] notice in await self?.tellAir(notice) })
    }

    /// Sends `notice` to the air in a child task of `driveRuns` (`tellAir`).
    func notify(_ notice: NodeTicket.Notice) { driver.notify(notice) }
}

extension RunController {
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
                           dongle: agent.dongle, dongleHealth: dongles.record(of: agent)?.health ?? (agent.dongle == nil ? nil : .unknown))
        }
        var record = RunRecord(id: id, plan: plan.name, planText: planText, state: .arming, created: now, duration: plan.duration,
                               warmup: plan.warmup, air: config.air, nodes: nodes)
        if !selection.spares.isEmpty {
            record.spares = selection.spares.map { RunRecord.Spare(agent: $0.name, agentURL: $0.url, dongle: $0.dongle, dongleHealth: dongles.record(of: $0)?.health) }
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
        let views = registry.views.filter { $0.state == .alive }
        let active = withLock { s in s.runs.values.filter { !$0.state.isFinal } }
        let inCheck = dongles.checking
        let busyNames = Set(active.flatMap { $0.nodes.map(\.agent) + ($0.spares ?? []).map(\.agent) }).union(inCheck)
        let busyURLs = Set(active.flatMap { $0.nodes.map(\.agentURL) + ($0.spares ?? []).map(\.agentURL) })
        func busy(_ i: LabWire.AgentInfo) -> Bool { busyNames.contains(i.name) || busyURLs.contains(i.url) }
        let bluez = plan.radio.kind == .bluez
        /// Why an agent's dongle may not be chosen, nil when it may.
        func unusable(_ i: LabWire.AgentInfo) -> String? {
            guard bluez, let r = dongles.record(of: i), !r.health.selectable else { return nil }
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
            let good = fit.filter { dongles.record(of: $0)?.health == .good }
            fit = good + fit.filter { dongles.record(of: $0)?.health != .good }
        }
        guard fit.count >= need else {
            let excludedText = excluded.isEmpty ? "" : "; not selectable: \(excluded.joined(separator: "; "))"
            throw LabRefusal(.conflict, "plan \(plan.name) needs \(needs), but only \(fit.count) are alive and free\(fit.isEmpty ? "" : ": \(fit.map(\.name).joined(separator: ", "))")\(excludedText); start more agents or lower the node count")
        }
        let spares = min(plan.agents.spares ?? 0, fit.count - need)
        return Selection(chosen: Array(fit.prefix(need)), spares: Array(fit[need..<(need + spares)]))
    }

    /// Queues run `id`'s course (`drive`) for `driveRuns`.
    func launch(_ id: String) { driver.launch(id) }

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

    // MARK: The air

    /// The air address an armed node gets: with a ticket bound to the run, the node, the agent
    /// that runs it and the run's latest end, when the lab has an air key.
    func airAddress(_ base: LabWire.AirAddress?, run: String, node: String, agent: String, until end: Double) -> LabWire.AirAddress? {
        guard var air = base else { return nil }
        if let key = config.airKey { air.ticket = NodeTicket.issue(run: run, node: node, agent: agent, issued: now, expires: end, key: key) }
        return air
    }

    /// Tells the air what a ticket cannot know (a run ended, an agent was revoked), signed with
    /// the air key, over its own connection (TLS when this process trusts a lab CA). A failure
    /// is logged: the tickets still expire at their run's latest end.
    func tellAir(_ notice: NodeTicket.Notice) async {
        guard let key = config.airKey, let air = config.air else { return }
        let signed = notice.signed(key: key)
        let problem: String? = await withCheckedContinuation { done in
            // Connecting blocks (name lookup, handshake): off the cooperative pool.
            DispatchQueue.global().async { done.resume(returning: AirNotices.tell(signed, host: air.host, port: air.port, tls: LabTrust.client)) }
        }
        if let problem {
            logger.error("the air at \(air.host):\(air.port) did not take the notice \(notice): \(HTTPService.escaped(problem)); the tickets concerned still expire at their run's latest end")
        }
    }
}
