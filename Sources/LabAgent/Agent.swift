import Foundation
import HeraldCore
import HeraldRadio
import LabHTTP
import LabNode
import LabPlan
import RadioAir
import RadioSim
import BlueZRadio
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab agent`: runs one node of a plan on this machine. It registers with a coordinator
/// and heartbeats, accepts an assignment, starts at the instant it is given (in its own clock),
/// runs to the end on its own even if the coordinator goes away, keeps the assignment and logs on
/// disk (resuming after a restart), and serves the files with SHA-256 and byte ranges until the
/// coordinator says they were gathered.
public final class Agent: @unchecked Sendable {
    public struct Config: Sendable {
        public var name: String
        public var host = "127.0.0.1"
        public var port: UInt16 = 0
        public var dataDirectory: URL
        public var coordinator: URL?
        public var token: String?
        public var tags: [String] = []
        /// `sim` (attach to the air) or `bluez`.
        public var radio = "sim"
        public var adapter: String?
        /// The air to attach to when an assignment names none.
        public var air: LabWire.AirAddress?
        public var heartbeatInterval: TimeInterval = 1
        public init(name: String, dataDirectory: URL) { self.name = name; self.dataDirectory = dataDirectory }
    }

    public let config: Config
    let scheduler = DispatchScheduler(label: "heraldlab.agent.node")
    private let http: HTTPService
    private var client: LabClient?
    private var heartbeat: Task<Void, Never>?
    public private(set) var url: String = ""
    // Run state, confined to the scheduler's queue.
    private var run: ActiveRun?
    public let log: @Sendable (String) -> Void

    final class ActiveRun {
        let assignment: NodeAssignment
        let directory: URL
        var air: LabWire.AirAddress?
        var state: LabWire.AgentState = .armed
        var startAt: Double?
        var startedAt: Double?
        var resumed = false
        var runner: NodeRunner?
        /// Closes the run's radio (the air connection or the BlueZ client).
        var closeRadio: (() -> Void)?
        var tasks: [ScheduledTask] = []
        var files: [LabWire.FileInfo] = []
        var message: String?
        var lastStatus: NodeStatus?
        init(assignment: NodeAssignment, directory: URL) { self.assignment = assignment; self.directory = directory }
        var nodeDirectory: URL { directory.appendingPathComponent("node") }
        var endsAt: Double? { startAt.map { $0 + assignment.duration } }
    }

    struct PersistedState: Codable {
        var state: LabWire.AgentState
        var startAt: Double?
        var startedAt: Double?
        var resumed: Bool
        var air: LabWire.AirAddress?
        var files: [LabWire.FileInfo]?
    }

    public init(config: Config, log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) {
        self.config = config
        self.log = log
        http = HTTPService(name: "agent \(config.name)", token: config.token, log: log)
        controller = config.radio == "bluez" ? Self.describe(ControllerIdentity.read(adapter: config.adapter ?? "hci0")) : nil
        routes()
    }

    /// Starts serving; recovers a run left on disk; starts heartbeats. Returns the bound port.
    public func start() async throws -> UInt16 {
        try FileManager.default.createDirectory(at: runsDirectory, withIntermediateDirectories: true)
        let port = try await http.start(host: config.host, port: config.port)
        url = "http://\(config.host):\(port)"
        scheduler.sync { recover() }
        if let c = config.coordinator {
            client = LabClient(base: c, token: config.token, timeout: 5)
            heartbeat = Task { [weak self] in await self?.heartbeatLoop() }
        }
        log("agent \(config.name) listening on \(url) (data \(config.dataDirectory.path))")
        return port
    }

    public func stop() async {
        heartbeat?.cancel()
        scheduler.sync {
            guard let r = run else { return }
            for t in r.tasks { t.cancel() }
            if r.state == .running { finish(r, interrupted: true) }
        }
        await http.stop()
    }

    var runsDirectory: URL { config.dataDirectory.appendingPathComponent("runs") }
    var now: Double { Date().timeIntervalSince1970 }

    public var info: LabWire.AgentInfo {
        LabWire.AgentInfo(name: config.name, url: url, tags: config.tags, radio: config.radio, adapter: config.adapter, controller: controller)
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

    public var status: LabWire.AgentStatus { scheduler.sync { statusOnQueue() } }

    private func statusOnQueue() -> LabWire.AgentStatus {
        var s = LabWire.AgentStatus(name: config.name, state: run?.state ?? .idle)
        guard let r = run else { return s }
        s.runId = r.assignment.runId
        s.node = r.assignment.node.name
        s.startAt = r.startAt
        s.startedAt = r.startedAt
        s.endsAt = r.endsAt
        s.resumed = r.resumed
        s.message = r.message
        if let st = r.runner?.status ?? r.lastStatus {
            s.peersDetected = st.peersDetected
            s.payloadsRead = st.payloadsRead
            s.rssiLastMinute = st.rssiLastMinute
            s.rssiTotal = st.rssiTotal
        }
        return s
    }

    // MARK: HTTP

    private func routes() {
        http.route("GET", "/v1/status") { [unowned self] _ in .json(self.status) }
        http.route("POST", "/v1/clock") { [unowned self] _ in
            let received = self.now
            return .json(LabWire.ClockReply(received: received, sent: self.now))
        }
        http.route("POST", "/v1/arm") { [unowned self] req in
            let arm = try req.decode(LabWire.ArmRequest.self)
            try self.scheduler.sync { try self.arm(arm) }
            return .json(self.status)
        }
        http.route("POST", "/v1/start") { [unowned self] req in
            let start = try req.decode(LabWire.StartRequest.self)
            try self.scheduler.sync { try self.schedule(start) }
            return .json(self.status)
        }
        http.route("GET", "/v1/runs/:run/files") { [unowned self] req in
            let id = req.parameters["run"] ?? ""
            return .json(try self.scheduler.sync { try self.fileList(id) })
        }
        http.route("GET", "/v1/runs/:run/files/:file") { [unowned self] req in
            let id = req.parameters["run"] ?? "", file = req.parameters["file"] ?? ""
            guard SafeName.isValid(id), NodeRunner.heraldFiles.contains(file) else { throw HTTPError(.notFound, "no such file") }
            let url = self.runsDirectory.appendingPathComponent(id).appendingPathComponent("node").appendingPathComponent(file)
            return try .file(url, range: req.headers["range"], missing: "run \(id) has no \(file) here")
        }
        http.route("POST", "/v1/runs/:run/release") { [unowned self] req in
            let id = req.parameters["run"] ?? ""
            try self.scheduler.sync { try self.release(id) }
            return .json(["released": id])
        }
    }

    // MARK: Run lifecycle (on the scheduler's queue)

    private func arm(_ request: LabWire.ArmRequest) throws {
        let a = request.assignment
        guard SafeName.isValid(a.runId), SafeName.isValid(a.node.name) else { throw HTTPError(.badRequest, "run and node names may hold only letters, digits, '-', '_' and '.'") }
        if let r = run {
            if r.assignment.runId == a.runId { return } // armed already: idempotent
            if r.state == .armed || r.state == .running { throw HTTPError(.conflict, "agent \(config.name) is busy with run \(r.assignment.runId)") }
        }
        let dir = runsDirectory.appendingPathComponent(a.runId)
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("node"), withIntermediateDirectories: true)
        try LabJSON.encoder.encode(a).write(to: dir.appendingPathComponent("assignment.json"), options: .atomic)
        let r = ActiveRun(assignment: a, directory: dir)
        r.air = request.air ?? config.air
        run = r
        persist(r)
        log("agent \(config.name): armed for run \(a.runId) as node \(a.node.name)")
    }

    private func schedule(_ start: LabWire.StartRequest) throws {
        guard let r = run, r.assignment.runId == start.runId else { throw HTTPError(.conflict, "agent \(config.name) is not armed for run \(start.runId)") }
        guard r.state == .armed else { return }
        r.startAt = start.startAt
        persist(r)
        arrange(r)
    }

    /// Schedules start and stop of an armed run by its start instant.
    private func arrange(_ r: ActiveRun) {
        guard let startAt = r.startAt else { return }
        for t in r.tasks { t.cancel() }
        // Wake a little early, attach the radio, then start at the instant itself.
        r.tasks = [
            scheduler.schedule(after: startAt - now - 0.3) { [weak self] in self?.begin(r) },
            scheduler.schedule(after: startAt + r.assignment.duration - now) { [weak self] in self?.finish(r, interrupted: false) },
        ]
    }

    private func begin(_ r: ActiveRun) {
        guard run === r, r.state == .armed || (r.state == .running && r.runner == nil) else { return }
        do {
            let transport: any BLETransport
            if config.radio == "bluez" {
                let bluez = BlueZTransport(options: .init(adapter: config.adapter ?? "hci0"), scheduler: scheduler)
                transport = bluez
                r.closeRadio = { bluez.close() }
            } else {
                guard let air = r.air else { throw AirError.socket("no air to attach to: give the agent --air HOST:PORT") }
                let spec = r.assignment.node
                let params = Simulation.parameters(r.assignment.radio)
                let onAir = try AirTransport(host: air.host, port: air.port, node: spec.name, x: spec.position.x, y: spec.position.y, parameters: params, scheduler: scheduler)
                transport = onAir
                r.closeRadio = { onAir.close() }
            }
            let runner = NodeRunner(assignment: r.assignment, transport: transport, directory: r.nodeDirectory)
            (transport as? BlueZTransport)?.log = runner.radioLog
            r.runner = runner
            if let startAt = r.startAt { Self.wait(until: startAt) }
            let actual = now
            runner.start()
            if r.startedAt == nil { r.startedAt = actual }
            r.state = .running
            persist(r)
            log("agent \(config.name): run \(r.assignment.runId) started\(r.resumed ? " (resumed after a restart)" : "") at \(String(format: "%.3f", now)), planned \(String(format: "%.3f", r.startAt ?? 0))")
        } catch {
            r.state = .failed
            r.message = "\(error)"
            persist(r)
            log("agent \(config.name): run \(r.assignment.runId) failed to start: \(error)")
        }
    }

    private func finish(_ r: ActiveRun, interrupted: Bool) {
        guard run === r, r.state == .running || r.state == .armed else { return }
        if let st = r.runner?.status ?? r.lastStatus { r.lastStatus = st }
        r.runner?.stop()
        r.closeRadio?()
        r.runner = nil
        r.closeRadio = nil
        if interrupted { r.state = .running; r.resumed = true; persist(r); return } // the agent is going down: resume later
        r.files = checksums(r)
        r.state = .finished
        persist(r)
        log("agent \(config.name): run \(r.assignment.runId) finished; \(r.files.count) files ready to gather")
    }

    private func checksums(_ r: ActiveRun) -> [LabWire.FileInfo] {
        NodeRunner.heraldFiles.compactMap { name in
            let url = r.nodeDirectory.appendingPathComponent(name)
            guard let (sha, bytes) = try? SHA256.hash(fileAt: url) else { return nil }
            return LabWire.FileInfo(name: name, bytes: bytes, sha256: sha)
        }
    }

    private func fileList(_ id: String) throws -> LabWire.FileList {
        guard let r = run, r.assignment.runId == id else {
            throw HTTPError(.notFound, "agent \(config.name) has no run \(id) (released already, or never armed)")
        }
        guard r.state == .finished else { throw HTTPError(.conflict, "run \(id) is \(r.state.rawValue) on agent \(config.name); files are served once it has finished") }
        return LabWire.FileList(runId: id, node: r.assignment.node.name, resumed: r.resumed, startedAt: r.startedAt, files: r.files)
    }

    private func release(_ id: String) throws {
        guard let r = run, r.assignment.runId == id else { return }
        guard r.state == .finished || r.state == .failed || (r.state == .armed && r.startAt == nil) else { throw HTTPError(.conflict, "run \(id) is still \(r.state.rawValue); nothing is deleted before it is gathered") }
        try? FileManager.default.removeItem(at: r.directory)
        run = nil
        log("agent \(config.name): run \(id) gathered by the coordinator; local copy deleted")
    }

    private func persist(_ r: ActiveRun) {
        let s = PersistedState(state: r.state, startAt: r.startAt, startedAt: r.startedAt, resumed: r.resumed, air: r.air, files: r.files)
        try? LabJSON.encoder.encode(s).write(to: r.directory.appendingPathComponent("state.json"), options: .atomic)
    }

    /// After a restart: re-arm a run that has not started, resume one that was running, finish
    /// one whose end has passed. The newest run on disk wins.
    private func recover() {
        let fm = FileManager.default
        guard let ids = try? fm.contentsOfDirectory(atPath: runsDirectory.path) else { return }
        var candidates = [(ActiveRun, PersistedState)]()
        for id in ids.sorted() {
            let dir = runsDirectory.appendingPathComponent(id)
            guard let a = try? LabJSON.decoder.decode(NodeAssignment.self, from: Data(contentsOf: dir.appendingPathComponent("assignment.json"))),
                  let s = try? LabJSON.decoder.decode(PersistedState.self, from: Data(contentsOf: dir.appendingPathComponent("state.json"))) else { continue }
            let r = ActiveRun(assignment: a, directory: dir)
            r.state = s.state; r.startAt = s.startAt; r.startedAt = s.startedAt; r.resumed = s.resumed; r.air = s.air; r.files = s.files ?? []
            candidates.append((r, s))
        }
        guard let (r, _) = candidates.max(by: { ($0.0.startAt ?? 0) < ($1.0.startAt ?? 0) }) else { return }
        run = r
        switch r.state {
        case .finished, .failed, .idle:
            log("agent \(config.name): run \(r.assignment.runId) (\(r.state.rawValue)) kept on disk until it is gathered")
        case .armed, .running:
            guard let startAt = r.startAt else { log("agent \(config.name): re-armed for run \(r.assignment.runId), waiting for the start"); return }
            let end = startAt + r.assignment.duration
            if now >= end {
                r.state = .running
                finish(r, interrupted: false)
            } else if now >= startAt {
                r.resumed = true
                r.state = .running
                persist(r)
                arrange(r) // begins at once (start instant passed) and stops at the planned end
            } else {
                arrange(r)
                log("agent \(config.name): re-armed for run \(r.assignment.runId), starting in \(Int(startAt - now)) s")
            }
        }
    }

    /// Sleeps, then spins for the last millisecond, until the wall clock reaches `instant`.
    static func wait(until instant: Double) {
        while true {
            let left = instant - Date().timeIntervalSince1970
            if left <= 0 { return }
            if left > 0.002 { usleep(useconds_t((left - 0.0015) * 1e6)) }
        }
    }

    // MARK: Coordinator

    private func heartbeatLoop() async {
        var registered = false
        var complained = false
        while !Task.isCancelled {
            do {
                if !registered {
                    let _: Empty = try await client!.call("POST", "/v1/agents/register", info)
                    registered = true
                    complained = false
                    log("agent \(config.name): registered with \(config.coordinator!.absoluteString)")
                }
                let _: Empty = try await client!.call("POST", "/v1/agents/\(config.name)/heartbeat", status)
            } catch {
                if let f = error as? LabClient.Failure, f.status == 404 { registered = false }
                if !complained { log("agent \(config.name): coordinator unreachable (\(error)); the run goes on, retrying"); complained = true }
                registered = registered && (error as? LabClient.Failure)?.status != nil
            }
            try? await Task.sleep(nanoseconds: UInt64(config.heartbeatInterval * 1e9))
        }
    }
}
