import Foundation
import HeraldCore
import LabPlan

/// The lab's ports, like the radio's `BLETransport`: what the coordinator asks of one agent
/// (`AgentLink`) and what an agent asks of its coordinator (`CoordinatorLink`). The coordinator's
/// and the agent's rules see only these; HTTP is one adapter behind them (HTTPLinks.swift), a
/// real `Agent` or `Coordinator` called in the same process is another (LocalAgentLink in
/// LabAgent, LocalCoordinatorLink in LabCoordinator), which is how those rules are tested
/// without sockets.

/// Why a call over a link failed: `status` is the HTTP-like status when the other side answered
/// and refused (400 bad request, 401/403 credential, 404 unknown, 409 conflict, 5xx its own
/// failure), nil when it was not reached or its answer was not one (connection, timeout, a body
/// that does not decode). Printed as LabClient's failures always were: "HTTP 409: message", or
/// the message alone.
public struct LinkError: Error, CustomStringConvertible, Sendable {
    public var status: Int?
    public var message: String
    public init(status: Int?, message: String) { self.status = status; self.message = message }
    public var description: String { status.map { "HTTP \($0): \(message)" } ?? message }
    /// The other side answered and refused: asking again does not help.
    public var isRefusal: Bool { status.map { (400..<500).contains($0) } ?? false }
}

/// How much of a file a fetch wrote: the rest from the offset asked for, or the whole file
/// again (the agent ignored the range; the destination was rewritten from its start).
public enum FetchedPart: Sendable, Equatable { case rest, whole }

/// What the coordinator asks of one agent (docs/API.md, the agent's API).
public protocol AgentLink: Sendable {
    /// The agent's status: its active run, or the newest it holds.
    func status() async throws(LinkError) -> LabWire.AgentStatus
    /// Clock probes: up to `count` samples of the agent's clock against ours (offset: agent − us),
    /// fewer once a round trip under 1 ms was seen after `settle`.
    func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample]
    /// Arms the agent for a node of a run (its radio is checked first); a refusal is a 4xx.
    func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus
    /// The start instant of an armed run, in the agent's clock.
    func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus
    /// A dongle check: start, poll, stop (radio bluez).
    func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport
    func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport
    func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport
    /// Stops a run now; the agent keeps what it logged.
    func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus
    /// The files the agent holds for a run, with their sizes and SHA-256.
    func files(of run: String) async throws(LinkError) -> LabWire.FileList
    /// Appends file `name` of `run` from byte `offset` to `destination`, feeding every byte
    /// written to `hasher` in order. Whether the bytes are the ones listed is the caller's check.
    func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart
    /// The agent may delete its copy of the run.
    func release(_ run: String) async throws(LinkError)
}

/// What an agent asks of its coordinator.
public protocol CoordinatorLink: Sendable {
    /// The coordinator as log lines name it (its URL).
    var address: String { get }
    func register(_ info: LabWire.AgentInfo) async throws(LinkError)
    /// A heartbeat, with when it was sent and when its answer came back (this host's clock,
    /// taken as close to the exchange as the link can) and the coordinator's stamps from the
    /// answer (nil from a coordinator that gives none).
    func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer
}

/// What a heartbeat's answer says about the clocks: `sent` and `answered` in the agent's clock,
/// `reply` the coordinator's receipt and answer in its own.
public struct HeartbeatAnswer: Sendable, Equatable {
    public var sent: Double
    public var answered: Double
    public var reply: LabWire.ClockReply?
    public init(sent: Double, answered: Double, reply: LabWire.ClockReply?) { self.sent = sent; self.answered = answered; self.reply = reply }
}

/// Where and how the coordinator calls one agent: its URL, the credential it calls that agent
/// with, and how long a call may wait.
public struct AgentAddress: Sendable {
    public var url: URL
    public var token: String?
    public var timeout: TimeInterval
    public init(url: URL, token: String?, timeout: TimeInterval) { self.url = url; self.token = token; self.timeout = timeout }
}

/// Makes the coordinator's link to an agent (default: `HTTPAgentLink`).
public typealias AgentLinkFactory = @Sendable (AgentAddress) -> any AgentLink
