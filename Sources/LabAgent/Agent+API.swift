import Foundation
import HeraldCore
import Hummingbird
import LabHTTP
import LabNode
import LabPlan

/// The agent's API methods (docs/API.md; routed by `AgentRoutes`), which validate what they are given and hand the work to the service it is for
/// (the runs' `RunLifecycle` on the executor, the `DongleService`). `LocalAgentLink` calls the
/// same methods without HTTP.
extension Agent {
    // MARK: The agent's API as methods (what its routes and LocalAgentLink call)

    /// A clock probe's answer: when the request arrived and when the answer leaves, in this agent's clock.
    func clockReply() -> LabWire.ClockReply {
        let received = now
        return LabWire.ClockReply(received: received, sent: now)
    }

    /// Arms a node: its radio is checked first; a refusal is a `LabRefusal`.
    func armRun(_ arm: LabWire.ArmRequest) async throws -> LabWire.AgentStatus {
        let lifecycle = self.lifecycle
        try await lifecycle.preflight(arm)
        try scheduler.sync { try lifecycle.arm(arm) }
        return status
    }

    /// The armed run's start instant, in this agent's clock (within a day of it).
    func startRun(_ start: LabWire.StartRequest) throws -> LabWire.AgentStatus {
        guard start.startAt.isFinite, abs(start.startAt - now) < 86_400 else {
            throw LabRefusal(.invalid, "startAt \(start.startAt) is not within a day of this agent's clock")
        }
        let lifecycle = self.lifecycle
        try scheduler.sync { try lifecycle.schedule(start) }
        return status
    }

    /// Starts a dongle check (or answers for the one with this id); refused while a run is armed or running.
    func startPreflight(_ request: LabWire.PreflightRequest) async throws -> LabWire.PreflightReport {
        let lifecycle = self.lifecycle
        return try await dongle.startPreflight(request) { lifecycle.active?.id }
    }

    /// The dongle check's findings so far.
    func preflightStatus() throws -> LabWire.PreflightReport { try dongle.preflightStatus() }

    /// On the executor: the runs held, oldest start first.
    func heldRuns() -> [LabWire.HeldRun] { lifecycle.heldRuns() }

    /// Ends the dongle check and returns its final findings; 404 when there is none.
    func endPreflight() async throws -> LabWire.PreflightReport {
        guard let r = await dongle.stopPreflight() else { throw LabRefusal(.notFound, "agent \(config.name) has no dongle check") }
        return r
    }

    func files(of run: String) throws -> LabWire.FileList {
        let id = try Self.runId(run)
        let lifecycle = self.lifecycle
        return try scheduler.sync { try lifecycle.fileList(id) }
    }

    /// Where file `name` of `run` is (a Herald file name only, never a path), with the run id and
    /// name checked.
    func fileURL(run: String, name: String) throws -> (URL, String, String) {
        let id = try Self.runId(run)
        guard NodeRunner.heraldFiles.contains(name) else { throw LabRefusal(.notFound, "no such file") }
        return (runsDirectory.appendingPathComponent(id).appendingPathComponent("node").appendingPathComponent(name), id, name)
    }

    func stopRun(_ run: String) throws -> LabWire.AgentStatus {
        let id = try Self.runId(run)
        let lifecycle = self.lifecycle
        try scheduler.sync { try lifecycle.abort(id) }
        return status
    }

    /// Returns the run id released.
    func releaseRun(_ run: String) throws -> String {
        let id = try Self.runId(run)
        let lifecycle = self.lifecycle
        try scheduler.sync { try lifecycle.release(id) }
        return id
    }

    static func runId(_ id: String) throws -> String {
        guard SafeName.isValid(id) else { throw LabRefusal(.invalid, "run id \(SafeName.problem(with: id) ?? "is invalid")") }
        return id
    }
}
