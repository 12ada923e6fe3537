import Foundation
import HeraldCore
import Hummingbird
import LabHTTP
import LabMetrics
import LabPlan
import Logging

/// The coordinator's HTTP API (docs/API.md): its edge, registering the routes of `CoordinatorAPI`
/// on the routes the coordinator hands its HTTP service; each handler calls the coordinator's services. The handlers
/// hold the coordinator unowned (it owns the HTTP service whose router holds them).
enum CoordinatorRoutes {
    static func register(on coordinator: Coordinator, _ http: HTTPService.Routes) {
        // Agents call these two about themselves (their own credential, their own name only).
        let agents = http.routes(allow: [.agent, .operator])
        agents.on(CoordinatorAPI.register) { [unowned coordinator] info, _, context in
            try coordinator.register(info, principal: context.principal, peerHost: context.peerHost)
            return Empty()
        }
        agents.on(CoordinatorAPI.heartbeat) { [unowned coordinator] status, _, context in
            let received = coordinator.now
            return try coordinator.heartbeat(context.parameter("name"), status, principal: context.principal, received: received)
        }
        // Everything else is the operator's.
        let op = http.routes(allow: [.operator])
        op.on(CoordinatorAPI.agents) { [unowned coordinator] _, _, _ in coordinator.agentViews }
        op.on(CoordinatorAPI.enrol, bodyLimit: 16 * 1024, status: .created) { [unowned coordinator] enrol, _, _ in try coordinator.enrol(enrol) }
        op.on(CoordinatorAPI.revoke) { [unowned coordinator] _, _, context in
            try coordinator.revoke(context.parameter("name"))
            return Empty()
        }
        op.on(CoordinatorAPI.dongles) { [unowned coordinator] _, _, context in
            coordinator.dongleViews(history: min(max(Int(context.query["history"] ?? "") ?? 20, 0), 1000))
        }
        // An empty body checks every dongle.
        op.on(RouterPath(CoordinatorAPI.checkDongles.template), method: .post) { [unowned coordinator] request, _ in
            let body = try await request.collectData(upTo: 64 * 1024)
            let check = body.isEmpty ? LabWire.CheckRequest(dongles: nil, bound: nil) : try LabJSON.decode(LabWire.CheckRequest.self, from: body)
            return Response.json(try await coordinator.checkDongles(check))
        }
        op.on(CoordinatorAPI.dongleHealth, bodyLimit: 16 * 1024) { [unowned coordinator] health, _, context in try coordinator.setHealth(context.parameter("dongle"), health) }
        op.on(CoordinatorAPI.submit, bodyLimit: 256 * 1024, status: .created) { [unowned coordinator] body, _, context in
            let text = String(decoding: body, as: UTF8.self)
            let source = context.query["name"] ?? "plan"
            do {
                return try coordinator.submit(planText: text, source: source)
            } catch {
                // Kept a day with its reason for the dashboard (issue 40), then refused as before.
                coordinator.dashboard.refusals.note(source: source, reason: (error as? LabRefusal)?.message ?? "\(error)", at: coordinator.now)
                throw error
            }
        }
        op.on(CoordinatorAPI.runs) { [unowned coordinator] _, _, _ in coordinator.withLock { s in s.runs.values.sorted { $0.created < $1.created } } }
        op.on(CoordinatorAPI.run) { [unowned coordinator] _, _, context in
            let id = try runId(context)
            guard let r = coordinator.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            return r
        }
        op.on(CoordinatorAPI.cancel) { [unowned coordinator] _, _, context in
            let id = try runId(context)
            guard let r = coordinator.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state == .arming, r.startAt == nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only a run that has not started can be cancelled (abort stops a running one)")
            }
            coordinator.runs.stopWork(id)
            return await coordinator.endBeforeStart(r, state: .cancelled, message: "cancelled before the start")
        }
        op.on(CoordinatorAPI.abort) { [unowned coordinator] _, _, context in try await coordinator.abort(try runId(context)) }
        op.on(CoordinatorAPI.gather) { [unowned coordinator] _, _, context in
            let id = try runId(context)
            guard var r = coordinator.run(id) else { throw LabRefusal(.notFound, "no run \(id)") }
            guard r.state.isFinal, r.state != .cancelled, r.startAt != nil else {
                throw LabRefusal(.conflict, "run \(id) is \(r.state.rawValue): only an ended run that started can be gathered again")
            }
            r.state = .gathering
            r.message = nil
            try coordinator.save(r)
            coordinator.launch(id)
            return r
        }
        op.on(CoordinatorAPI.bundle) { [unowned coordinator] _, request, context -> Response in
            let id = try runId(context)
            guard let r = coordinator.run(id), r.bundle != nil, [.complete, .aborted].contains(r.state) else { throw LabRefusal(.conflict, "run \(id) has no bundle") }
            let tar = coordinator.config.results.appendingPathComponent("\(id).tar.gz")
            return try .file(tar, contentType: "application/gzip", range: request.headers[.range], missing: "bundle archive missing")
        }
    }

    static func runId(_ context: LabRequestContext) throws -> String {
        let id = context.parameter("id")
        guard SafeName.isValid(id) else { throw LabRefusal(.invalid, "run id \(SafeName.problem(with: id) ?? "is invalid")") }
        return id
    }

    /// `GET /metrics` (`CoordinatorMetrics`), for the operator's credential or the scrape credential.
    static func registerMetrics(on coordinator: Coordinator, _ http: HTTPService.Routes) {
        http.routes(allow: [.operator, .scraper]).on(CoordinatorAPI.metrics) { [unowned coordinator] _, _, _ -> Response in
            coordinator.collectMetrics()
            return Response(.ok, headers: ["Content-Type": LabMetrics.contentType], body: Data(coordinator.metrics.metrics.exposition()))
        }
    }
}
