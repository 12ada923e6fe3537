import Foundation

/// One HTTP endpoint of the lab's wire: its method, its path template (`:name` segments) and,
/// as type parameters, what it takes and answers. The one table both sides use (issue 39): the
/// coordinator and the agent route these, LabLink and the CLI call them, so no path is written
/// twice and a renamed route cannot leave a client calling the old one (EndpointTableTests).
public struct Endpoint<Request, Response>: Sendable, CustomStringConvertible {
    public let method: String
    public let template: String

    public init(_ method: String, _ template: String) { self.method = method; self.template = template }

    /// The template's parameter names, in order (`/v1/runs/:id/abort` → ["id"]).
    public var parameters: [String] { template.split(separator: "/").filter { $0.hasPrefix(":") }.map { String($0.dropFirst()) } }

    /// The path with `values` in the template's parameters, in order, each percent-encoded as
    /// one segment (a value can never add a segment or a query), and `query` appended as given.
    public func path(_ values: String..., query: String? = nil) -> String {
        precondition(values.count == parameters.count, "\(template) takes \(parameters.count) parameter(s), given \(values.count)")
        var next = values.makeIterator()
        let segments = template.split(separator: "/", omittingEmptySubsequences: false).map { s -> String in
            guard s.hasPrefix(":"), let v = next.next() else { return String(s) }
            return v.addingPercentEncoding(withAllowedCharacters: Self.segment) ?? ""
        }
        return segments.joined(separator: "/") + (query.map { "?\($0)" } ?? "")
    }

    public var description: String { "\(method) \(template)" }

    /// What a path segment may carry unescaped: unreserved characters only.
    static var segment: CharacterSet { CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~") }
}

/// Bodies and answers that carry nothing.
public struct NoBody: Codable, Sendable { public init() {} }

/// What an agent serves (the coordinator and the operator call it; docs/API.md).
public enum AgentAPI {
    public static let status = Endpoint<NoBody, LabWire.AgentStatus>("GET", "/v1/status")
    public static let clock = Endpoint<NoBody, LabWire.ClockReply>("POST", "/v1/clock")
    public static let arm = Endpoint<LabWire.ArmRequest, LabWire.AgentStatus>("POST", "/v1/arm")
    public static let start = Endpoint<LabWire.StartRequest, LabWire.AgentStatus>("POST", "/v1/start")
    public static let startPreflight = Endpoint<LabWire.PreflightRequest, LabWire.PreflightReport>("POST", "/v1/preflight")
    public static let preflightStatus = Endpoint<NoBody, LabWire.PreflightReport>("GET", "/v1/preflight")
    public static let stopPreflight = Endpoint<NoBody, LabWire.PreflightReport>("POST", "/v1/preflight/stop")
    public static let heldRuns = Endpoint<NoBody, [LabWire.HeldRun]>("GET", "/v1/runs")
    public static let files = Endpoint<NoBody, LabWire.FileList>("GET", "/v1/runs/:run/files")
    public static let file = Endpoint<NoBody, Data>("GET", "/v1/runs/:run/files/:file")
    public static let stopRun = Endpoint<NoBody, LabWire.AgentStatus>("POST", "/v1/runs/:run/stop")
    public static let release = Endpoint<NoBody, NoBody>("POST", "/v1/runs/:run/release")
    public static let metrics = Endpoint<NoBody, Data>("GET", "/metrics")

    /// Every endpoint, as method and template (the route tests compare it with what is routed).
    public static let all: [(String, String)] = [status.pair, clock.pair, arm.pair, start.pair, startPreflight.pair, preflightStatus.pair, stopPreflight.pair,
                                                 heldRuns.pair, files.pair, file.pair, stopRun.pair, release.pair, metrics.pair]
}

/// What the coordinator serves to agents and to the operator's CLI (the dashboard's pages are
/// the coordinator's own and called by browsers only).
public enum CoordinatorAPI {
    public static let register = Endpoint<LabWire.AgentInfo, NoBody>("POST", "/v1/agents/register")
    public static let heartbeat = Endpoint<LabWire.AgentStatus, LabWire.ClockReply>("POST", "/v1/agents/:name/heartbeat")
    public static let agents = Endpoint<NoBody, Data>("GET", "/v1/agents")
    public static let enrol = Endpoint<LabWire.EnrolRequest, Data>("POST", "/v1/agents/enrol")
    public static let revoke = Endpoint<NoBody, NoBody>("POST", "/v1/agents/:name/revoke")
    public static let dongles = Endpoint<NoBody, Data>("GET", "/v1/dongles")
    public static let checkDongles = Endpoint<LabWire.CheckRequest, Data>("POST", "/v1/dongles/check")
    public static let dongleHealth = Endpoint<LabWire.HealthRequest, Data>("POST", "/v1/dongles/:dongle/health")
    /// The plan's YAML as the body, `?name=SOURCE` as the query.
    public static let submit = Endpoint<Data, Data>("POST", "/v1/runs")
    public static let runs = Endpoint<NoBody, Data>("GET", "/v1/runs")
    public static let run = Endpoint<NoBody, Data>("GET", "/v1/runs/:id")
    public static let cancel = Endpoint<NoBody, Data>("POST", "/v1/runs/:id/cancel")
    public static let abort = Endpoint<NoBody, Data>("POST", "/v1/runs/:id/abort")
    public static let gather = Endpoint<NoBody, Data>("POST", "/v1/runs/:id/gather")
    public static let bundle = Endpoint<NoBody, Data>("GET", "/v1/runs/:id/bundle")
    public static let metrics = Endpoint<NoBody, Data>("GET", "/metrics")

    public static let all: [(String, String)] = [register.pair, heartbeat.pair, agents.pair, enrol.pair, revoke.pair, dongles.pair, checkDongles.pair,
                                                 dongleHealth.pair, submit.pair, runs.pair, run.pair, cancel.pair, abort.pair, gather.pair, bundle.pair, metrics.pair]
}

extension Endpoint {
    /// Method and template, for tables of routes.
    public var pair: (String, String) { (method, template) }
}
