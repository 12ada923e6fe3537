import Foundation
import HeraldCore
import LabHTTP
import LabPlan
import Logging

/// The coordinator's HTTP API (docs/API.md).
extension Coordinator {
    func routes() {
        // Agents call these two about themselves (their own credential, their own name only).
        http.route(CoordinatorAPI.register.method, CoordinatorAPI.register.template, allow: [.agent, .operator]) { [unowned self] req in
            try self.register(try req.decode(LabWire.AgentInfo.self), principal: req.principal, peerHost: req.peerHost)
            return .json(Empty())
        }
        http.route(CoordinatorAPI.heartbeat.method, CoordinatorAPI.heartbeat.template, allow: [.agent, .operator]) { [unowned self] req in
            let received = self.now
            return .json(try self.heartbeat(req.parameters["name"] ?? "", try req.decode(LabWire.AgentStatus.self), principal: req.principal, received: received))
        }
        // Everything else is the operator's.
        http.route(CoordinatorAPI.agents.method, CoordinatorAPI.agents.template, allow: [.operator]) { [unowned self] _ in .json(self.agentViews) }
        http.route(CoordinatorAPI.enrol.method, CoordinatorAPI.enrol.template, bodyLimit: 16 * 1024, allow: [.operator]) { [unowned self] req in
            .json(try self.enrol(try req.decode(LabWire.EnrolRequest.self)), status: .created)
        }
        http.route(CoordinatorAPI.revoke.method, CoordinatorAPI.revoke.template, allow: [.operator]) { [unowned self] req in
            try self.revoke(req.parameters["name"] ?? "")
            return .json(Empty())
        }
        http.route(CoordinatorAPI.dongles.method, CoordinatorAPI.dongles.template, allow: [.operator]) { [unowned self] req in
            let history = min(max(Int(req.query["history"] ?? "") ?? 20, 0), 1000)
            return .json(self.dongleViews(history: history))
        }
        http.route(CoordinatorAPI.checkDongles.method, CoordinatorAPI.checkDongles.template, bodyLimit: 64 * 1024, allow: [.operator]) { [unowned self] req in
            .json(try await self.checkDongles(req.body.isEmpty ? LabWire.CheckRequest(dongles: nil, bound: nil) : try req.decode(LabWire.CheckRequest.self)))
        }
        http.route(CoordinatorAPI.dongleHealth.method, CoordinatorAPI.dongleHealth.template, bodyLimit: 16 * 1024, allow: [.operator]) { [unowned self] req in
            .json(try self.setHealth(req.parameters["dongle"] ?? "", try req.decode(LabWire.HealthRequest.self)))
        }
        http.route(CoordinatorAPI.submit.method, CoordinatorAPI.submit.template, bodyLimit: 256 * 1024, allow: [.operator]) { [unowned self] req in
            let text = String(decoding: req.body, as: UTF8.self)
            let source = req.query["name"] ?? "plan"
            do {
                return .json(try self.submit(planText: text, source: source), status: .created)
            } catch {
                // Kept a day with its reason for the dashboard (issue 40), then refused as before.
                self.dashboard.refusals.note(source: source, reason: (error as? LabRefusal)?.message ?? "\(error)", at: self.now)
                throw error
            }
        }
        http.route(CoordinatorAPI.runs.method, CoordinatorAPI.runs.template, allow: [.operator]) { [unowned self] _ in
            .json(self.withLock { s in s.runs.values.sorted { $0.created < $1.created } })
        }
        http.route(CoordinatorAPI.run.method, CoordinatorAPI.run.template, allow: [.operator]) { [unowned self] req in
            let id = try Self.runId(req)
            guard let r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            return .json(r)
        }
        http.route(CoordinatorAPI.cancel.method, CoordinatorAPI.cancel.template, allow: [.operator]) { [unowned self] req in
            let id = try Self.runId(req)
            guard let r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state == .arming, r.startAt == nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only a run that has not started can be cancelled (abort stops a running one)")
            }
            self.withLock { s in s.tasks[id]?.cancel() }
            let cancelled = await self.endBeforeStart(r, state: .cancelled, message: "cancelled before the start")
            return .json(cancelled)
        }
        http.route(CoordinatorAPI.abort.method, CoordinatorAPI.abort.template, allow: [.operator]) { [unowned self] req in
            .json(try await self.abort(try Self.runId(req)))
        }
        http.route(CoordinatorAPI.gather.method, CoordinatorAPI.gather.template, allow: [.operator]) { [unowned self] req in
            let id = try Self.runId(req)
            guard var r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state.isFinal, r.state != .cancelled, r.startAt != nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only an ended run that started can be gathered again")
            }
            r.state = .gathering
            r.message = nil
            try self.save(r)
            self.launch(id)
            return .json(r)
        }
        http.route(CoordinatorAPI.bundle.method, CoordinatorAPI.bundle.template, allow: [.operator]) { [unowned self] req in
            let id = try Self.runId(req)
            guard let r = self.run(id), r.bundle != nil, [.complete, .aborted].contains(r.state) else { throw LabRefusal(.conflict, "run \(id) has no bundle") }
            let tar = self.config.results.appendingPathComponent("\(id).tar.gz")
            return try .file(tar, contentType: "application/gzip", range: req.headers["range"], missing: "bundle archive missing")
        }
    }

    /// Stops a run: one not yet started is cancelled; a running one stops its nodes and what
    /// exists is gathered (POST /v1/runs/:id/abort, the dashboard's abort button).
    func abort(_ id: String) async throws -> RunRecord {
        guard var r = run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
        switch r.state {
        case .arming where r.startAt == nil:
            withLock { s in s.tasks[id]?.cancel() }
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

    static func runId(_ req: HTTPService.Request) throws -> String {
        let id = req.parameters["id"] ?? ""
        guard SafeName.isValid(id) else { throw LabRefusal(.invalid, "run id \(SafeName.problem(with: id) ?? "is invalid")") }
        return id
    }
}
