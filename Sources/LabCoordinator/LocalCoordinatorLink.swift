import Foundation
import LabHTTP
import LabLink
import LabPlan

/// `CoordinatorLink` to a `Coordinator` in this process: registration and heartbeats handed to
/// the methods its routes map to, as agent `agent` calling with its own credential from
/// `peerHost`; refusals come back with the status the HTTP API would have answered. What lets
/// the coordinator's rules be tested in memory with real agents (LocalAgentLink).
public struct LocalCoordinatorLink: CoordinatorLink {
    public let coordinator: Coordinator
    let principal: HTTPService.Principal
    let peerHost: String?
    public let address: String

    public init(_ coordinator: Coordinator, agent: String, peerHost: String? = "127.0.0.1", address: String = "in-memory coordinator") {
        self.coordinator = coordinator
        principal = HTTPService.Principal(role: .agent, name: agent)
        self.peerHost = peerHost
        self.address = address
    }

    public func register(_ info: LabWire.AgentInfo) async throws(LinkError) {
        do { try coordinator.register(info, principal: principal, peerHost: peerHost) } catch { throw LinkError(answering: error) }
    }

    public func heartbeat(agent name: String, _ status: LabWire.AgentStatus) async throws(LinkError) -> HeartbeatAnswer {
        let sent = coordinator.config.clock.now()
        let reply: LabWire.ClockReply
        do { reply = try coordinator.heartbeat(name, status, principal: principal) } catch { throw LinkError(answering: error) }
        return HeartbeatAnswer(sent: sent, answered: coordinator.config.clock.now(), reply: reply)
    }
}
