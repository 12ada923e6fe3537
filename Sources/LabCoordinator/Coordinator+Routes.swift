import Foundation
import HeraldCore
import Hummingbird
import LabHTTP
import LabPlan
import Logging

/// The coordinator's HTTP API (docs/API.md).
extension Coordinator {
    func routes() {
        // Agents call these two about themselves (their own credential, their own name only).
        let agents = http.routes(allow: [.agent, .operator])
        agents.on(CoordinatorAPI.register) { [unowned self] info, _, context in
            try self.register(info, principal: context.principal, peerHost: context.peerHost)
            return Empty()
        }
        agents.on(CoordinatorAPI.heartbeat) { [unowned self] status, _, context in
            let received = self.now
            return try self.heartbeat(context.parameter("name"), status, principal: context.principal, received: received)
        }
        // Everything else is the operator's.
        let op = http.routes(allow: [.operator])
        op.on(CoordinatorAPI.agents) { [unowned self] _, _, _ in self.agentViews }
        op.on(CoordinatorAPI.enrol, bodyLimit: 16 * 1024, status: .created) { [unowned self] enrol, _, _ in try self.enrol(enrol) }
        op.on(CoordinatorAPI.revoke) { [unowned self] _, _, context in
            try self.revoke(context.parameter("name"))
            return Empty()
        }
        op.on(CoordinatorAPI.dongles) { [unowned self] _, _, context in
            self.dongleViews(history: min(max(Int(context.query["history"] ?? "") ?? 20, 0), 1000))
        }
        // An empty body checks every dongle.
        op.on(RouterPath(CoordinatorAPI.checkDongles.template), method: .post) { [unowned self] request, _ in
            let body = try await request.collectData(upTo: 64 * 1024)
            let check = body.isEmpty ? LabWire.CheckRequest(dongles: nil, bound: nil) : try LabJSON.decode(LabWire.CheckRequest.self, from: body)
            return Response.json(try await self.checkDongles(check))
        }
        op.on(CoordinatorAPI.dongleHealth, bodyLimit: 16 * 1024) { [unowned self] health, _, context in try self.setHealth(context.parameter("dongle"), health) }
        op.on(CoordinatorAPI.submit, bodyLimit: 256 * 1024, status: .created) { [unowned self] body, _, context in
            let text = String(decoding: body, as: UTF8.self)
            let source = context.query["name"] ?? "plan"
            do {
                return try self.submit(planText: text, source: source)
            } catch {
                // Kept a day with its reason for the dashboard (issue 40), then refused as before.
                self.dashboard.refusals.note(source: source, reason: (error as? LabRefusal)?.message ?? "\(error)", at: self.now)
                throw error
            }
        }
        op.on(CoordinatorAPI.runs) { [unowned self] _, _, _ in self.withLock { s in s.runs.values.sorted { $0.created < $1.created } } }
        op.on(CoordinatorAPI.run) { [unowned self] _, _, context in
            let id = try Self.runId(context)
            guard let r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            return r
        }
        op.on(CoordinatorAPI.cancel) { [unowned self] _, _, context in
            let id = try Self.runId(context)
            guard let r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state == .arming, r.startAt == nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only a run that has not started can be cancelled (abort stops a running one)")
            }
            self.withLock { s in s.tasks[id]?.cancel() }
            return await self.endBeforeStart(r, state: .cancelled, message: "cancelled before the start")
        }
        op.on(CoordinatorAPI.abort) { [unowned self] _, _, context in try await self.abort(try Self.runId(context)) }
        op.on(CoordinatorAPI.gather) { [unowned self] _, _, context in
            let id = try Self.runId(context)
            guard var r = self.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state.isFinal, r.state != .cancelled, r.startAt != nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only an ended run that started can be gathered again")
            }
            r.state = .gathering
            r.message = nil
            try self.save(r)
            self.launch(id)
            return r
        }
        op.on(CoordinatorAPI.bundle) { [unowned self] _, request, context -> Response in
            let id = try Self.runId(context)
            guard let r = self.run(id), r.bundle != nil, [.complete, .aborted].contains(r.state) else { throw LabRefusal(.conflict, "run \(id) has no bundle") }
            let tar = self.config.results.appendingPathComponent("\(id).tar.gz")
            return try .file(tar, contentType: "application/gzip", range: request.headers[.range], missing: "bundle archive missing")
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

    static func runId(_ context: LabRequestContext) throws -> String {
        let id = context.parameter("id")
        guard SafeName.isValid(id) else { throw LabRefusal(.invalid, "run id \(SafeName.problem(with: id) ?? "is invalid")") }
        return id
    }
}
