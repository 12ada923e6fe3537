import Foundation
import HeraldCore
import LabHTTP
import LabPlan

/// `AgentLink` over the agent's HTTP API (docs/API.md): JSON calls through `LabClient`, clock
/// probes through `ClockProbe` (one kept-alive connection, TCP_NODELAY), files through
/// `FileDownload` (streamed to disk, hashed as written). Paths, bodies, headers and timeouts are
/// the wire's; the credential is the one the coordinator calls this agent with.
public struct HTTPAgentLink: AgentLink {
    let client: LabClient
    public var base: URL { client.base }

    public init(_ address: AgentAddress) {
        client = LabClient(base: address.url, token: address.token, timeout: address.timeout)
    }

    /// The link factory the coordinator uses unless it is given another.
    public static let factory: AgentLinkFactory = { HTTPAgentLink($0) }

    public func status() async throws(LinkError) -> LabWire.AgentStatus { try await client.link(AgentAPI.status.method, AgentAPI.status.path()) }

    public func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] {
        do {
            return try await ClockProbe.measure(client.base, path: AgentAPI.clock.path(), token: client.token, count: count, settle: settle)
                .map { LabWire.ClockSample(offset: $0.offset, roundTrip: $0.roundTrip) }
        } catch { throw LinkError(error) }
    }

    public func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { try await client.link(AgentAPI.arm.method, AgentAPI.arm.path(), request) }
    public func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { try await client.link(AgentAPI.start.method, AgentAPI.start.path(), request) }
    public func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { try await client.link(AgentAPI.startPreflight.method, AgentAPI.startPreflight.path(), request) }
    public func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { try await client.link(AgentAPI.preflightStatus.method, AgentAPI.preflightStatus.path()) }
    public func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { try await client.link(AgentAPI.stopPreflight.method, AgentAPI.stopPreflight.path()) }
    public func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { try await client.link(AgentAPI.stopRun.method, AgentAPI.stopRun.path(run)) }
    public func files(of run: String) async throws(LinkError) -> LabWire.FileList { try await client.link(AgentAPI.files.method, AgentAPI.files.path(run)) }

    public func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
        guard let url = URL(string: AgentAPI.file.path(run, name), relativeTo: client.base)?.absoluteURL else { throw LinkError(status: nil, message: "bad agent URL") }
        var headers = ["Authorization": "Bearer \(client.token ?? "")"]
        if offset > 0 { headers["Range"] = "bytes=\(offset)-" }
        do {
            let result = try await FileDownload.get(url, headers: headers, appendingTo: destination, hasher: &hasher, timeout: 60)
            return result.status == 200 && offset > 0 ? .whole : .rest
        } catch { throw LinkError(error) }
    }

    /// A refusal carries the answer's first 200 bytes as its message.
    public func release(_ run: String) async throws(LinkError) {
        let answer: (Int, Data, [String: String])
        do { answer = try await client.request(AgentAPI.release.method, AgentAPI.release.path(run)) } catch { throw LinkError(error) }
        guard answer.0 < 300 else { throw LinkError(status: answer.0, message: String(decoding: answer.1.prefix(200), as: UTF8.self)) }
    }
}

/// `CoordinatorLink` over the coordinator's HTTP API, with the agent's credential.
public struct HTTPCoordinatorLink: CoordinatorLink {
    let client: LabClient
    public var address: String { client.base.absoluteString }

    public init(base: URL, token: String?, timeout: TimeInterval = 5) {
        client = LabClient(base: base, token: token, timeout: timeout)
    }

    public func register(_ info: LabWire.AgentInfo) async throws(LinkError) {
        let _: Empty = try await client.link(CoordinatorAPI.register.method, CoordinatorAPI.register.path(), info)
    }

    /// Stamped just before the request is handed to the client (after the status is encoded) and
    /// as soon as the whole answer is in.
    public func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer {
        // A coordinator from before heartbeat clocks answers {}: no stamps, no sample.
        struct Stamps: Decodable { var received: Double?; var sent: Double? }
        let answer: (answer: Stamps, sent: Double, answered: Double)
        do { answer = try await client.timedCall(CoordinatorAPI.heartbeat.method, CoordinatorAPI.heartbeat.path(name), status, as: Stamps.self) } catch { throw LinkError(error) }
        let reply = answer.answer.received.flatMap { r in answer.answer.sent.map { LabWire.ClockReply(received: r, sent: $0) } }
        return HeartbeatAnswer(sent: answer.sent, answered: answer.answered, reply: reply)
    }
}

extension LinkError {
    /// A LabClient failure keeps its status and message; anything else is its description.
    public init(_ error: any Error) {
        if let e = error as? LinkError { self = e } else if let f = error as? LabClient.Failure { self.init(status: f.status, message: f.message) } else { self.init(status: nil, message: "\(error)") }
    }

    /// What an HTTP route would have answered for `error` thrown by a handler: its status and
    /// message for a `LabRefusal` (its kind's status) or an `HTTPError` (`HTTPService.refusal`), 500 and its description for anything else (HTTPService).
    public init(answering error: any Error) {
        if let e = error as? LinkError { self = e } else if let (status, message) = HTTPService.refusal(error) { self.init(status: status.code, message: message) } else { self.init(status: 500, message: "\(error)") }
    }
}

extension LabClient {
    /// `call` with its failures as `LinkError`.
    func link<T: Decodable>(_ method: String, _ path: String, _ body: (some Encodable)? = Optional<Int>.none) async throws(LinkError) -> T {
        do { return try await call(method, path, body) } catch { throw LinkError(error) }
    }
}
