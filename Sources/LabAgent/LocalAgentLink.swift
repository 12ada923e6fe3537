import Foundation
import HeraldCore
import LabLink
import LabPlan

/// `AgentLink` to an `Agent` in this process: the agent's API methods (the ones its routes map
/// to) called directly, no sockets; the agent's refusals come back with the status its HTTP API
/// would have answered. What lets the coordinator's rules be tested in memory against the real
/// agent (with a simulated radio).
public struct LocalAgentLink: AgentLink {
    public let agent: Agent
    public init(_ agent: Agent) { self.agent = agent }

    func answer<T>(_ body: () async throws -> T) async throws(LinkError) -> T {
        do { return try await body() } catch { throw LinkError(answering: error) }
    }

    public func status() async throws(LinkError) -> LabWire.AgentStatus { agent.status }

    /// As `ClockProbe` takes them: stop once `settle` samples are in and one round trip was at most 1 ms.
    public func clockSamples(count: Int, settle: Int) async throws(LinkError) -> [LabWire.ClockSample] {
        var out = [LabWire.ClockSample]()
        for _ in 0..<count {
            let t0 = agent.config.clock.now()
            let reply = agent.clockReply()
            let t3 = agent.config.clock.now()
            out.append(LabWire.ClockSample(t0: t0, t1: reply.received, t2: reply.sent, t3: t3))
            if out.count >= settle, let best = out.map(\.roundTrip).min(), best <= 0.001 { break }
        }
        return out
    }

    public func arm(_ request: LabWire.ArmRequest) async throws(LinkError) -> LabWire.AgentStatus { try await answer { try await agent.armRun(request) } }
    public func start(_ request: LabWire.StartRequest) async throws(LinkError) -> LabWire.AgentStatus { try await answer { try agent.startRun(request) } }
    public func startPreflight(_ request: LabWire.PreflightRequest) async throws(LinkError) -> LabWire.PreflightReport { try await answer { try await agent.startPreflight(request) } }
    public func preflightStatus() async throws(LinkError) -> LabWire.PreflightReport { try await answer { try agent.preflightStatus() } }
    public func stopPreflight() async throws(LinkError) -> LabWire.PreflightReport { try await answer { try await agent.endPreflight() } }
    public func stopRun(_ run: String) async throws(LinkError) -> LabWire.AgentStatus { try await answer { try agent.stopRun(run) } }
    public func files(of run: String) async throws(LinkError) -> LabWire.FileList { try await answer { try agent.files(of: run) } }

    /// The file's bytes from `offset` appended (an offset past its end: the whole file again).
    public func fetchFile(run: String, name: String, from offset: Int64, appendingTo destination: URL, hasher: inout SHA256) async throws(LinkError) -> FetchedPart {
        let (url, id, file) = try await answer { try agent.fileURL(run: run, name: name) }
        guard let data = FileManager.default.contents(atPath: url.path) else { throw LinkError(status: 404, message: "run \(id) has no \(file) here") }
        let whole = offset > Int64(data.count)
        let part = whole ? data : data.subdata(in: Int(offset)..<data.count)
        // The destination is the caller's disk: its failures carry no status.
        do {
            let out = try FileHandle(forWritingTo: destination)
            do {
                if whole { try out.truncate(atOffset: 0) } else { try out.seekToEnd() }
                try out.write(contentsOf: part)
            } catch {
                try? out.close() // already failing with the write's error
                throw error
            }
            try out.close() // a close that fails may have lost what was written: the fetch fails
        } catch { throw LinkError(error) }
        hasher.update(part)
        return whole ? .whole : .rest
    }

    public func release(_ run: String) async throws(LinkError) { _ = try await answer { try agent.releaseRun(run) } }
}
