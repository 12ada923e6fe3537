import Foundation
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabHTTP
import LabPlan
import Yams

/// `herald-lab coordinator`: hands each agent its slice of a plan, starts them together, watches
/// them and gathers their logs into one bundle. Agents and runs are kept in SQLite, so a
/// restarted coordinator goes on watching and gathering where it was.
public final class Coordinator: @unchecked Sendable {
    public struct Config: Sendable {
        public var host = "127.0.0.1"
        public var port: UInt16 = 0
        public var results: URL
        public var token: String?
        public var inventory: URL?
        /// The air agents with a simulated radio attach to.
        public var air: LabWire.AirAddress?
        /// Seconds between the last agent armed and the common start.
        public var startMargin: Double = 1.0
        /// An agent is missing after this long without a heartbeat, lost after `lostAfter`.
        public var missingAfter: Double = 5
        public var lostAfter: Double = 60
        /// How long gathering keeps retrying an agent.
        public var gatherPatience: Double = 60
        public init(results: URL) { self.results = results }
    }

    public let config: Config
    private let http: HTTPService
    private let store: CoordinatorStore
    private let lock = NSLock()
    var agents: [String: (info: LabWire.AgentInfo, lastSeen: Double, status: LabWire.AgentStatus?)] = [:]
    private var inventory: [LabWire.AgentInfo] = []
    var runs: [String: RunRecord] = [:]
    var tasks: [String: Task<Void, Never>] = [:]
    public let log: @Sendable (String) -> Void
    public private(set) var url = ""

    public init(config: Config, log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(($0 + "\n").utf8)) }) throws {
        self.config = config
        self.log = log
        store = try CoordinatorStore(url: config.results.appendingPathComponent("coordinator.sqlite"))
        http = HTTPService(name: "coordinator", token: config.token, log: log)
        for (info, seen) in try store.agents() { agents[info.name] = (info, seen, nil) }
        for r in try store.runs() { runs[r.id] = r }
        if let inv = config.inventory { inventory = try Self.loadInventory(inv) }
        routes()
    }

    var now: Double { Date().timeIntervalSince1970 }

    public func start() async throws -> UInt16 {
        let port = try await http.start(host: config.host, port: config.port)
        url = "http://\(config.host):\(port)"
        log("coordinator listening on \(url) (results \(config.results.path))")
        // Pick up runs a previous coordinator left unfinished.
        let unfinished = withLock { runs.values.filter { [.arming, .running, .gathering].contains($0.state) } }
        for r in unfinished {
            log("coordinator: resuming run \(r.id) (\(r.state.rawValue))")
            launch(r.id)
        }
        return port
    }

    public func stop() async {
        withLock { for t in tasks.values { t.cancel() } }
        await http.stop()
    }

    func withLock<T>(_ body: () throws -> T) rethrows -> T { lock.lock(); defer { lock.unlock() }; return try body() }

    // MARK: Inventory

    static func loadInventory(_ url: URL) throws -> [LabWire.AgentInfo] {
        let text = try String(contentsOf: url, encoding: .utf8)
        guard let root = try Yams.load(yaml: text) as? [String: Any], let list = root["agents"] as? [[String: Any]] else {
            throw HTTPError(.badRequest, "\(url.path): expected `agents:` with a list of {name, url, tags}")
        }
        return try list.enumerated().map { i, a in
            guard let name = a["name"] as? String, SafeName.isValid(name) else { throw HTTPError(.badRequest, "\(url.path): agents[\(i)].name missing or invalid") }
            return LabWire.AgentInfo(name: name, url: a["url"] as? String ?? "", tags: a["tags"] as? [String] ?? [], radio: a["radio"] as? String ?? "sim",
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
    }

    func liveness(_ lastSeen: Double) -> Liveness {
        let age = now - lastSeen
        return age < config.missingAfter ? .alive : (age < config.lostAfter ? .missing : .lost)
    }

    public var agentViews: [AgentView] {
        withLock {
            let inventoryNames = Set(inventory.map(\.name))
            var out = agents.values.sorted { $0.info.name < $1.info.name }.map { a in
                AgentView(info: a.info, state: liveness(a.lastSeen), lastSeen: a.lastSeen, status: a.status, inInventory: inventoryNames.contains(a.info.name))
            }
            for i in inventory where agents[i.name] == nil { out.append(AgentView(info: i, state: .unknown, lastSeen: nil, status: nil, inInventory: true)) }
            return out
        }
    }

    // MARK: HTTP API (docs/API.md)

    private func routes() {
        http.route("POST", "/v1/agents/register") { [unowned self] req in
            let info = try req.decode(LabWire.AgentInfo.self)
            guard SafeName.isValid(info.name) else { throw HTTPError(.badRequest, "agent name \"\(info.name)\" \(SafeName.problem(with: info.name)!)") }
            let t = self.now
            self.withLock { self.agents[info.name] = (info, t, self.agents[info.name]?.status) }
            try self.store.saveAgent(info, lastSeen: t)
            self.log("coordinator: agent \(info.name) registered from \(info.url) (radio \(info.radio), tags \(info.tags.joined(separator: ",")))")
            return .json(Empty())
        }
        http.route("POST", "/v1/agents/:name/heartbeat") { [unowned self] req in
            let name = req.parameters["name"] ?? ""
            let status = try req.decode(LabWire.AgentStatus.self)
            let known = self.withLock { () -> Bool in
                guard let a = self.agents[name] else { return false }
                self.agents[name] = (a.info, self.now, status)
                return true
            }
            guard known else { throw HTTPError(.notFound, "agent \(name) is not registered; register first") }
            return .json(Empty())
        }
        http.route("GET", "/v1/agents") { [unowned self] _ in .json(self.agentViews) }
        http.route("POST", "/v1/runs", bodyLimit: 256 * 1024) { [unowned self] req in
            let text = String(decoding: req.body, as: UTF8.self)
            let run = try self.submit(planText: text, source: req.query["name"] ?? "plan")
            return .json(run, status: .created)
        }
        http.route("GET", "/v1/runs") { [unowned self] _ in
            .json(self.withLock { self.runs.values.sorted { $0.created < $1.created } })
        }
        http.route("GET", "/v1/runs/:id") { [unowned self] req in
            guard let r = self.run(req.parameters["id"] ?? "") else { throw HTTPError(.notFound, "no run \(req.parameters["id"] ?? "")") }
            return .json(r)
        }
        http.route("POST", "/v1/runs/:id/cancel") { [unowned self] req in
            let id = req.parameters["id"] ?? ""
            guard var r = self.run(id) else { throw HTTPError(.notFound, "no run \(id)") }
            guard r.state == .arming else {
                throw HTTPError(.conflict, "run \(id) is \(r.state.rawValue): only a run that has not started can be cancelled (a started run ends on its own and is gathered)")
            }
            self.withLock { self.tasks[id]?.cancel() }
            r.state = .cancelled
            r.message = "cancelled before the start"
            self.update(r)
            return .json(r)
        }
        http.route("GET", "/v1/runs/:id/bundle") { [unowned self] req in
            let id = req.parameters["id"] ?? ""
            guard let r = self.run(id), r.state == .complete else { throw HTTPError(.conflict, "run \(id) has no bundle yet") }
            let tar = self.config.results.appendingPathComponent("\(id).tar.gz")
            return try .file(tar, contentType: "application/gzip", range: req.headers["range"], missing: "bundle archive missing")
        }
    }

    func run(_ id: String) -> RunRecord? { withLock { runs[id] } }

    func update(_ r: RunRecord) {
        withLock { runs[r.id] = r }
        do { try store.saveRun(r) } catch { log("coordinator: cannot save run \(r.id): \(error)") }
    }

    // MARK: Submitting

    /// Validates the plan, selects agents, records the run and starts it.
    public func submit(planText: String, source: String) throws -> RunRecord {
        let plan: Plan
        do { plan = try Plan.parse(yaml: planText, source: source) } catch {
            throw HTTPError(.badRequest, error.description)
        }
        let selected = try select(plan)
        var rng = SystemRandomNumberGenerator()
        let stamp = Self.stamp(now)
        let id = "\(plan.name)-\(stamp)-\(String(format: "%04x", UInt16.random(in: 0...UInt16.max, using: &rng)))"
        let nodes = zip(plan.nodes, selected).map { spec, agent in
            RunRecord.Node(name: spec.name, agent: agent.name, agentURL: agent.url, state: "selected", files: [])
        }
        let record = RunRecord(id: id, plan: plan.name, planText: planText, state: .arming, created: now, duration: plan.duration,
                               warmup: plan.warmup, air: config.air, nodes: nodes)
        update(record)
        log("coordinator: run \(id) submitted: \(plan.nodes.count) nodes on agents \(selected.map(\.name).joined(separator: ", "))")
        launch(id)
        return record
    }

    static func stamp(_ t: Double) -> String {
        let s = HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: t))
        return s.replacingOccurrences(of: "-", with: "").replacingOccurrences(of: ":", with: "").replacingOccurrences(of: " ", with: "-")
    }

    /// Picks one alive agent per node: by the plan's names, else by tags and radio; busy agents are skipped.
    func select(_ plan: Plan) throws -> [LabWire.AgentInfo] {
        let views = agentViews.filter { $0.state == .alive }
        let busy = withLock { Set(runs.values.filter { [.arming, .running, .gathering].contains($0.state) }.flatMap { $0.nodes.map(\.agent) }) }
        let radio = plan.radio.kind.rawValue
        let need = plan.nodes.count
        if let names = plan.agents.names {
            var out = [LabWire.AgentInfo]()
            for n in names {
                guard let v = views.first(where: { $0.info.name == n }) else { throw HTTPError(.conflict, "plan \(plan.name) names agent \(n), which is not alive (alive: \(views.map(\.info.name).joined(separator: ", ")))") }
                guard !busy.contains(n) else { throw HTTPError(.conflict, "agent \(n) is busy with another run") }
                out.append(v.info)
            }
            return out
        }
        let tags = Set(plan.agents.tags ?? [])
        let fit = views.filter { $0.info.radio == radio && tags.isSubset(of: Set($0.info.tags)) && !busy.contains($0.info.name) }
        guard fit.count >= need else {
            let tagText = tags.isEmpty ? "" : " with tags \(tags.sorted().joined(separator: ","))"
            throw HTTPError(.conflict, "plan \(plan.name) needs \(need) agents with radio \(radio)\(tagText), but only \(fit.count) are alive and free\(fit.isEmpty ? "" : ": \(fit.map(\.info.name).joined(separator: ", "))"); start more agents or lower the node count")
        }
        return Array(fit.prefix(need)).map(\.info)
    }

    func launch(_ id: String) {
        let task = Task { [weak self] in
            guard let self else { return }
            await self.drive(id)
        }
        withLock { tasks[id] = task }
    }
}
