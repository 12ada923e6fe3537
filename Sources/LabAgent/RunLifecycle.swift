import Foundation
import HeraldCore
import HeraldRadio
import LabHTTP
import LabNet
import LabNode
import LabPlan
import RadioAir
import RadioSim
import BlueZRadio
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The agent's runs, as a service of their own (issue 39 item 3): armed, started at their instant
/// in the agent's clock, stopped at their end (or aborted), their files checksummed, kept on disk
/// (RunLifecycle+Persistence) and resumed after a restart, released once gathered. Its rules are
/// functions of this type, testable without HTTP: an in-memory agent (`LocalAgentLink`) or a
/// test calls them on the executor (`scheduler.sync`).
///
/// Concurrency: the runs are the executor's (`scheduler`, the node's `SerialScheduler`: the
/// node, its radio and its loggers run there too); `runs` checks that on every access.
final class RunLifecycle: Sendable {
    let config: Agent.Config
    let scheduler: any SerialScheduler
    let logger: Logger
    /// The dongle: a check in progress refuses arming; arming reads bluetoothd's version into it.
    let dongle: DongleService

    init(config: Agent.Config, scheduler: any SerialScheduler, logger: Logger, dongle: DongleService) {
        self.config = config
        self.scheduler = scheduler
        self.logger = logger
        self.dongle = dongle
    }

    /// What only the executor touches.
    final class OnExecutor {
        var runs: [String: ActiveRun] = [:]
    }
    /// Invariant: only used on the scheduler's executor; `runs` checks that (`assertOnExecutor`)
    /// on every access, so this box (HeraldRadio's carrier for the seam) is never read elsewhere.
    private let confined = UncheckedBox(OnExecutor())
    /// Runs, confined to the executor: at most one armed or running (`active`), any number
    /// finished and waiting to be gathered.
    var runs: [String: ActiveRun] {
        get { scheduler.assertOnExecutor(); return confined.value.runs }
        set { scheduler.assertOnExecutor(); confined.value.runs = newValue }
    }
    var active: ActiveRun? { runs.values.first { $0.state == .armed || $0.state == .running } }

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


    var now: Double { config.clock.now() }
    var runsDirectory: URL { config.dataDirectory.appendingPathComponent("runs") }

    /// A run's ids as log metadata.
    func metadata(_ r: ActiveRun) -> Logger.Metadata {
        ["run": .string(r.id), "node": .string(r.assignment.node.name)]
    }

    /// The node's scheduler as the BlueZ and air radios take it: a dispatch queue.
    func dispatchScheduler() throws -> DispatchScheduler {
        guard let d = scheduler as? DispatchScheduler else {
            throw LabRefusal(.unprocessable, "agent \(config.name): radio \(config.radio.rawValue) runs on a dispatch queue, not on the scheduler the agent was given")
        }
        return d
    }

    /// The agent is going down: running nodes stop, to resume when it starts again.
    func interrupt() {
        for r in runs.values {
            for t in r.tasks { t.cancel() }
            if r.state == .running { finish(r, interrupted: true) }
        }
    }

    /// On the executor: the status of the active run if there is one, else of the newest run held
    /// on disk, over `s` (the agent's own part).
    func status(over base: LabWire.AgentStatus) -> LabWire.AgentStatus {
        let current = active ?? runs.values.max { ($0.startAt ?? 0, $0.id) < ($1.startAt ?? 0, $1.id) }
        var s = base
        s.state = current?.state ?? .idle
        s.held = runs.keys.sorted()
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

    /// Checks, before accepting an assignment, that the node's radio can be reached: a run whose
    /// radio cannot start fails at arming, with the reason, rather than after its whole duration.
    func preflight(_ request: LabWire.ArmRequest) async throws {
        // A radio the agent was given a maker for needs no air.
        if config.makeRadio != nil { return }
        if config.radio == .bluez {
            // What the node will run on, for the manifest: the bluetoothd that answers now.
            let version: String
            switch await BlueZVersion.read() {
            case .success(let v): version = v
            case .failure(let e): version = "unknown: \(e)"
            }
            dongle.stack.withLock { $0.bluezVersion = version }
            return
        }
        guard let air = request.air ?? config.air else {
            throw LabRefusal(.unprocessable, "agent \(config.name) has no air to attach its simulated radio to: give the coordinator or the agent --air HOST:PORT")
        }
        do { try AirTransport.probe(host: air.host, port: air.port, tls: LabTrust.client, timeout: 3) } catch {
            throw LabRefusal(.unprocessable, "agent \(config.name) cannot start its radio: \(error)")
        }
    }

    func arm(_ request: LabWire.ArmRequest) throws {
        let a = request.assignment
        guard SafeName.isValid(a.runId), SafeName.isValid(a.node.name) else { throw LabRefusal(.invalid, "run and node names may hold only letters, digits, '-', '_' and '.'") }
        guard a.duration.isFinite, a.duration > 0, a.duration <= 7 * 86_400 else { throw LabRefusal(.invalid, "assignment duration \(a.duration) s is out of range") }
        guard a.warmup.isFinite, a.warmup >= 0, a.warmup <= a.duration,
              [a.node.position.x, a.node.position.y].allSatisfy({ $0.isFinite && abs($0) <= 10_000 }) else {
            throw LabRefusal(.invalid, "assignment warmup or position out of range")
        }
        if let held = runs[a.runId] {
            // The same assignment again (a coordinator that restarted): idempotent. Another node
            // of the same run: refused, one agent runs one node.
            guard held.assignment.node.name == a.node.name else {
                throw LabRefusal(.conflict, "agent \(config.name) already runs node \(held.assignment.node.name) of run \(a.runId); it cannot also be \(a.node.name)")
            }
            return
        }
        if let r = active { throw LabRefusal(.conflict, "agent \(config.name) is busy with run \(r.id)") }
        if let c = dongle.checkInProgress { throw LabRefusal(.conflict, "agent \(config.name) is checking its dongle (\(c.request.id))") }
        let dir = runsDirectory.appendingPathComponent(a.runId)
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("node"), withIntermediateDirectories: true)
        try Durable.write(LabJSON.encoder.encode(a), to: dir.appendingPathComponent("assignment.json"))
        let r = ActiveRun(assignment: a, directory: dir)
        r.air = request.air ?? config.air
        try persist(r)
        runs[a.runId] = r
        logger.notice("armed for run \(a.runId) as node \(a.node.name)", metadata: metadata(r))
    }

    func schedule(_ start: LabWire.StartRequest) throws {
        guard let r = runs[start.runId], r.state == .armed || r.state == .running else { throw LabRefusal(.conflict, "agent \(config.name) is not armed for run \(start.runId)") }
        guard r.state == .armed, r.startAt == nil else { return }
        r.startAt = start.startAt
        let lead = start.startAt - now
        if lead < 0.35 {
            r.message = String(format: "start instant received %.0f ms before it (wanted at least 350 ms): the node may start late", lead * 1000)
            logger.warning("\(r.message!)", metadata: metadata(r))
        }
        try persist(r)
        arrange(r)
    }

    /// Schedules start and stop of an armed run by its start instant.
    func arrange(_ r: ActiveRun) {
        guard let startAt = r.startAt else { return }
        for t in r.tasks { t.cancel() }
        // Wake early enough to attach the radio even if a packet of the connection to the air is
        // lost and retransmitted (the first SYN retransmission comes after 1 s), then start at
        // the instant itself.
        r.tasks = [
            scheduler.schedule(after: startAt - now - 1.5) { [weak self] in self?.begin(r) },
            scheduler.schedule(after: startAt + r.assignment.duration - now) { [weak self] in self?.finish(r, interrupted: false) },
        ]
    }

    func begin(_ r: ActiveRun) {
        guard runs[r.id] === r, r.state == .armed || (r.state == .running && r.runner == nil) else { return }
        do {
            let transport: any BLETransport
            var air: AirTransport?
            if let makeRadio = config.makeRadio {
                let radio = try makeRadio(r.assignment)
                transport = radio.transport
                r.closeRadio = radio.close
            } else if config.radio == .bluez {
                var options = BlueZTransport.Options(adapter: config.adapter ?? "hci0")
                options.sysfsRoot = config.sysfsRoot
                options.usbReset = config.usbReset
                let bluez = BlueZTransport(options: options, scheduler: try dispatchScheduler())
                transport = bluez
                r.bluez = bluez
                r.closeRadio = { bluez.close() }
            } else {
                guard let address = r.air else { throw AirError.socket("no air to attach to: give the agent --air HOST:PORT") }
                let spec = r.assignment.node
                let onAir = try AirTransport(host: address.host, port: address.port, node: spec.name, x: spec.position.x, y: spec.position.y,
                                             parameters: Simulation.parameters(r.assignment.radio), token: config.token, ticket: address.ticket,
                                             tls: LabTrust.client, scheduler: try dispatchScheduler())
                transport = onAir
                air = onAir
                r.closeRadio = { onAir.close() }
            }
            let runner = NodeRunner(assignment: r.assignment, transport: transport, directory: r.nodeDirectory)
            let recordGap: (Double, Double, String) -> Void = { [weak self, weak r] from, to, reason in
                guard let self, let r else { return }
                self.addGap(r, from: from, to: to, reason: reason)
            }
            // The radio's lines go to the node's log.txt as before, and to the agent's log at
            // debug level (--log-level debug shows them live).
            let radioLog = runner.radioLog, logger = self.logger, ids = metadata(r)
            let forward: (String) -> Void = { line in
                radioLog(line)
                logger.debug("radio: \(line)", metadata: ids)
            }
            if let bluez = transport as? BlueZTransport {
                bluez.log = forward
                bluez.onGap = recordGap
                bluez.onRecovery = { [weak self, weak r] recovery in
                    guard let self, let r else { return }
                    self.recovered(r, recovery)
                }
            }
            if let air {
                air.log = forward
                air.onGap = recordGap
            }
            r.runner = runner
            // On the wall clock the instant is waited for here, precisely (sleep, then spin); a
            // clock that moves only when it is driven (an in-memory lab's) is waited for by the
            // scheduler, which runs on that clock.
            if let startAt = r.startAt, !(config.clock is WallClock), startAt > now {
                r.tasks.append(scheduler.schedule(after: startAt - now) { [weak self] in self?.go(r, runner) })
                return
            }
            if let startAt = r.startAt { Self.wait(until: startAt) }
            go(r, runner)
        } catch {
            failedToStart(r, error)
        }
    }

    /// Starts the node whose radio `begin` attached, at its instant.
    func go(_ r: ActiveRun, _ runner: NodeRunner) {
        guard runs[r.id] === r, r.runner === runner else { return }
        do {
            let actual = now
            runner.start()
            if r.startedAt == nil { r.startedAt = actual }
            r.state = .running
            r.aliveAt = actual
            try persist(r)
            let late = r.lateBy ?? 0
            if !r.resumed, late > 0.002 {
                let text = String(format: "started %.1f ms after the instant it was given", late * 1000)
                r.message = text
                runner.radioLog("node \(text)")
                logger.warning("run \(r.id) \(text)", metadata: metadata(r))
            }
            logger.notice("run \(r.id) started\(r.resumed ? " (resumed after a restart)" : "") at \(String(format: "%.3f", actual)), planned \(String(format: "%.3f", r.startAt ?? 0))",
                          metadata: metadata(r))
        } catch {
            failedToStart(r, error)
        }
    }

    func failedToStart(_ r: ActiveRun, _ error: any Error) {
        r.state = .failed
        r.message = "cannot start the radio: \(error)"
        persistOrReport(r)
        logger.error("run \(r.id) failed to start: \(error)", metadata: metadata(r))
    }

    /// Stops the node: at its planned end, on abort, or (interrupted) because the agent is going down.
    func finish(_ r: ActiveRun, interrupted: Bool) {
        guard runs[r.id] === r, r.state == .running || r.state == .armed else { return }
        if let st = r.runner?.status ?? r.lastStatus { r.lastStatus = st }
        r.writeError = r.runner?.writeError ?? r.writeError
        if !interrupted, r.state == .running, let bluez = r.bluez { radioAtTheEnd(r, bluez) }
        r.bluez = nil
        r.runner?.stop()
        r.closeRadio?()
        r.runner = nil
        r.closeRadio = nil
        for t in r.tasks { t.cancel() }
        r.tasks = []
        if interrupted { r.state = .running; r.resumed = true; persistOrReport(r); return } // resumed later; the gap comes from aliveAt
        do {
            r.files = try checksums(r)
            r.state = .finished
            try persist(r)
            logger.notice("run \(r.id) \(r.aborted ? "aborted" : "finished"); \(r.files.count) files ready to gather", metadata: metadata(r))
        } catch {
            r.state = .failed
            r.message = "cannot make the logs durable: \(error)"
            persistOrReport(r)
            logger.error("run \(r.id): \(r.message!)", metadata: metadata(r))
        }
    }

    /// The coordinator aborts the run: an armed run is dropped, a running one stops now and keeps
    /// what it logged for gathering.
    func abort(_ id: String) throws {
        guard let r = runs[id] else { throw LabRefusal(.notFound, "agent \(config.name) has no run \(id)") }
        switch r.state {
        case .armed where r.startedAt == nil:
            for t in r.tasks { t.cancel() }
            try FileManager.default.removeItem(at: r.directory)
            runs[id] = nil
            logger.notice("run \(id) aborted before its start; nothing was logged", metadata: metadata(r))
        case .armed, .running:
            r.aborted = true
            r.message = "aborted by the coordinator at \(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: now)))"
            r.runner?.radioLog("node stopped early: the run was aborted")
            finish(r, interrupted: false)
        case .finished, .failed, .idle:
            return
        }
    }

    /// Files of the Herald set, fsynced, with their sizes and SHA-256.
    func checksums(_ r: ActiveRun) throws -> [LabWire.FileInfo] {
        var out = [LabWire.FileInfo]()
        for name in NodeRunner.heraldFiles {
            let url = r.nodeDirectory.appendingPathComponent(name)
            guard FileManager.default.fileExists(atPath: url.path) else { continue }
            try Durable.syncFile(url)
            let (sha, bytes) = try SHA256.hash(fileAt: url)
            out.append(LabWire.FileInfo(name: name, bytes: bytes, sha256: sha))
        }
        try Durable.syncDirectory(r.nodeDirectory)
        return out
    }

    func fileList(_ id: String) throws -> LabWire.FileList {
        guard let r = runs[id] else {
            throw LabRefusal(.notFound, "agent \(config.name) has no run \(id) (released already, or never armed)")
        }
        guard r.state == .finished || r.state == .failed else { throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue) on agent \(config.name)\(r.message.map { ": \($0)" } ?? ""); files are served once it has finished") }
        if r.state == .failed && r.files.isEmpty {
            // Whatever a failed node logged is served too, so that it is not lost with the failure.
            do { r.files = try checksums(r) } catch {
                r.message = [r.message, "its logs could not be checksummed: \(error)"].compactMap { $0 }.joined(separator: "; ")
                logger.error("run \(id): \(error)", metadata: metadata(r))
            }
            try persist(r)
        }
        var list = LabWire.FileList(runId: id, node: r.assignment.node.name, resumed: r.resumed, startedAt: r.startedAt, files: r.files)
        list.startAt = r.startAt
        list.gaps = r.gaps.isEmpty ? nil : r.gaps
        list.aborted = r.aborted ? true : nil
        list.writeError = r.writeError
        list.failure = r.state == .failed ? (r.message ?? "failed") : nil
        list.recoveries = r.recoveries.isEmpty ? nil : r.recoveries
        return list
    }

    func heldRuns() -> [LabWire.HeldRun] {
        runs.values.sorted { ($0.startAt ?? 0, $0.id) < ($1.startAt ?? 0, $1.id) }.map { r in
            LabWire.HeldRun(runId: r.id, node: r.assignment.node.name, state: r.state, startAt: r.startAt, bytes: r.files.reduce(0) { $0 + $1.bytes })
        }
    }

    /// The coordinator has the files (verified and durable on its side): the copy goes. A run that
    /// never started goes too (cancelled); a failed run is released once the coordinator knows.
    func release(_ id: String) throws {
        guard let r = runs[id] else { return }
        guard r.state == .finished || r.state == .failed || (r.state == .armed && r.startedAt == nil) else {
            throw LabRefusal(.conflict, "run \(id) is still \(r.state.rawValue); nothing is deleted before it is gathered")
        }
        for t in r.tasks { t.cancel() }
        runs[id] = nil
        do { try FileManager.default.removeItem(at: r.directory) } catch {
            logger.error("run \(id) released but its folder could not be deleted: \(error)", metadata: metadata(r))
            return
        }
        logger.info("run \(id) released by the coordinator; local copy deleted", metadata: metadata(r))
    }

    // MARK: Gaps

    /// The whole process was paused (SIGSTOP, a suspended VM): nothing was logged from `from` to
    /// `to`, and whatever the radio queued meanwhile is stale (the air transport drops it by age).
    func stalled(from: Double, to: Double) {
        guard let r = active, r.state == .running, let startAt = r.startAt, to > startAt else { return }
        let reason = String(format: "agent process paused for %.1f s", to - from)
        addGap(r, from: max(from, startAt), to: to, reason: reason)
    }

    func addGap(_ r: ActiveRun, from: Double, to: Double, reason: String) {
        guard to > from else { return }
        r.gaps.append(LabWire.Gap(from: from, to: to, reason: reason))
        r.runner?.radioLog("gap in the logs from \(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: from))) to \(HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: to))): \(reason)")
        persistOrReport(r)
        logger.warning("run \(r.id): gap of \(String(format: "%.1f", to - from)) s (\(reason))", metadata: metadata(r))
    }

    /// Every few seconds while running: the instant the agent was last alive, so that a restart
    /// knows where its gap began; and log write failures surface in status.
    func keepAlive() {
        guard let r = active, r.state == .running, r.runner != nil else { return }
        r.aliveAt = now
        if let e = r.runner?.writeError, r.writeError != e {
            r.writeError = e
            r.runner?.radioLog("cannot write the logs: \(e)")
            logger.error("run \(r.id): cannot write the logs: \(e)", metadata: metadata(r))
        }
        persistOrReport(r)
    }

    /// Sleeps, then spins for the last millisecond, until the wall clock reaches `instant`. An
    /// instant that is not a time (NaN, infinite) is not waited for: NaN would spin for ever.
    static func wait(until instant: Double) {
        guard instant.isFinite else { return }
        while true {
            let left = instant - Date().timeIntervalSince1970
            if left <= 0 { return }
            if left > 0.002 { usleep(pause(left)) }
        }
    }

    /// One sleep of `wait(until:)` with `left` seconds to go, 1.5 ms short of it, in microseconds:
    /// at most useconds_t's largest (71 minutes), never a trap (issue 36).
    static func pause(_ left: Double) -> useconds_t {
        useconds_t(clamping: max(0, Saturating.int64((left - 0.0015) * 1e6)))
    }

    // MARK: The dongle during a run

    /// The node's radio recovered its dongle, or tried: kept with the run, reported to the
    /// coordinator (status, file list), already in log.txt.
    func recovered(_ r: ActiveRun, _ recovery: DongleRecovery) {
        r.recoveries.append(LabWire.Recovery(at: recovery.at, action: recovery.action, ok: recovery.ok, reason: recovery.reason, detail: recovery.detail))
        persistOrReport(r)
        let line: Logger.Message = "run \(r.id): dongle \(recovery.action) \(recovery.ok ? "worked" : "failed"): \(recovery.detail) (because \(recovery.reason))"
        logger.log(level: recovery.ok ? .warning : .error, line, metadata: metadata(r))
    }

    /// At the end of a run: a radio that is not working now, or never worked, leaves a gap to
    /// the end, so that a node without a working dongle is never `complete`.
    func radioAtTheEnd(_ r: ActiveRun, _ bluez: BlueZTransport) {
        guard let outage = bluez.outage else { return }
        let start = r.startedAt ?? outage.since
        let from = bluez.everReady ? max(outage.since, start) : start, to = now
        if bluez.everReady {
            addGap(r, from: from, to: to, reason: "radio lost: \(outage.reason); not back by the end of the run")
        } else {
            addGap(r, from: from, to: to, reason: "no working dongle: \(outage.reason)")
            r.message = "the node's dongle never worked during the run: \(outage.reason)"
            r.runner?.radioLog("node had no working dongle for the whole run: \(outage.reason)")
        }
    }
}
