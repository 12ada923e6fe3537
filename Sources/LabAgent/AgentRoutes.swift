import Foundation
import HeraldCore
import Hummingbird
import LabHTTP
import LabMetrics
import LabNode
import LabPlan

/// The agent's HTTP edge (docs/API.md): each route of `AgentAPI` maps a request to one of the
/// agent's API methods (Agent+API.swift), which `LocalAgentLink` calls without HTTP. The
/// handlers hold the agent unowned (it owns the HTTP service whose router holds them).
enum AgentRoutes {
    static func register(on agent: Agent, _ http: HTTPService.Routes) {
        let api = http.routes()
        api.on(AgentAPI.status) { [unowned agent] _, _, _ in agent.status }
        api.on(AgentAPI.clock) { [unowned agent] _, _, _ in agent.clockReply() }
        api.on(AgentAPI.arm) { [unowned agent] arm, _, _ in try await agent.armRun(arm) }
        api.on(AgentAPI.start) { [unowned agent] start, _, _ in try agent.startRun(start) }
        api.on(AgentAPI.startPreflight) { [unowned agent] request, _, _ in try await agent.startPreflight(request) }
        api.on(AgentAPI.preflightStatus) { [unowned agent] _, _, _ in try agent.preflightStatus() }
        api.on(AgentAPI.stopPreflight) { [unowned agent] _, _, _ in try await agent.endPreflight() }
        api.on(AgentAPI.heldRuns) { [unowned agent] _, _, _ in agent.scheduler.sync { agent.heldRuns() } }
        api.on(AgentAPI.files) { [unowned agent] _, _, context in try agent.files(of: context.parameter("run")) }
        api.on(AgentAPI.file) { [unowned agent] _, request, context -> Response in
            let (url, id, file) = try agent.fileURL(run: context.parameter("run"), name: context.parameter("file"))
            return try .file(url, range: request.headers[.range], missing: "run \(id) has no \(file) here")
        }
        api.on(AgentAPI.stopRun) { [unowned agent] _, _, context in try agent.stopRun(context.parameter("run")) }
        api.on(AgentAPI.release) { [unowned agent] _, _, context in ["released": try agent.releaseRun(context.parameter("run"))] }
    }

    /// The agent's `GET /metrics` (`Agent.collectMetrics`): for the coordinator's credential, the
    /// lab token, or the scrape credential.
    static func registerMetrics(on agent: Agent, _ http: HTTPService.Routes) {
        http.routes(allow: [.coordinator, .operator, .scraper]).on(AgentAPI.metrics) { [unowned agent] _, _, _ -> Response in
            agent.collectMetrics()
            return Response(.ok, headers: ["Content-Type": LabMetrics.contentType], body: Data(agent.metrics.exposition()))
        }
    }
}
