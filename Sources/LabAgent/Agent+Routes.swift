import Foundation
import HeraldCore
import LabHTTP
import LabNode
import LabPlan

/// The agent's HTTP API (docs/API.md): each route validates what it is given and hands the work
/// to the run's lifecycle on the scheduler's queue.
extension Agent {
    func routes() {
        http.route("GET", "/v1/status") { [unowned self] _ in .json(self.status) }
        http.route("POST", "/v1/clock") { [unowned self] _ in
            let received = self.now
            return .json(LabWire.ClockReply(received: received, sent: self.now))
        }
        http.route("POST", "/v1/arm") { [unowned self] req in
            let arm = try req.decode(LabWire.ArmRequest.self)
            try await self.preflight(arm)
            try self.scheduler.sync { try self.arm(arm) }
            return .json(self.status)
        }
        http.route("POST", "/v1/start") { [unowned self] req in
            let start = try req.decode(LabWire.StartRequest.self)
            guard start.startAt.isFinite, abs(start.startAt - self.now) < 86_400 else {
                throw HTTPError(.badRequest, "startAt \(start.startAt) is not within a day of this agent's clock")
            }
            try self.scheduler.sync { try self.schedule(start) }
            return .json(self.status)
        }
        http.route("POST", "/v1/preflight") { [unowned self] req in
            .json(try await self.startPreflight(try req.decode(LabWire.PreflightRequest.self)))
        }
        http.route("GET", "/v1/preflight") { [unowned self] _ in .json(try self.preflightStatus()) }
        http.route("POST", "/v1/preflight/stop") { [unowned self] _ in
            guard let r = await self.stopPreflight() else { throw HTTPError(.notFound, "agent \(self.config.name) has no dongle check") }
            return .json(r)
        }
        http.route("GET", "/v1/runs") { [unowned self] _ in .json(self.scheduler.sync { self.heldRuns() }) }
        http.route("GET", "/v1/runs/:run/files") { [unowned self] req in
            let id = try Self.runId(req)
            return .json(try self.scheduler.sync { try self.fileList(id) })
        }
        http.route("GET", "/v1/runs/:run/files/:file") { [unowned self] req in
            let id = try Self.runId(req), file = req.parameters["file"] ?? ""
            guard NodeRunner.heraldFiles.contains(file) else { throw HTTPError(.notFound, "no such file") }
            let url = self.runsDirectory.appendingPathComponent(id).appendingPathComponent("node").appendingPathComponent(file)
            return try .file(url, range: req.headers["range"], missing: "run \(id) has no \(file) here")
        }
        http.route("POST", "/v1/runs/:run/stop") { [unowned self] req in
            let id = try Self.runId(req)
            try self.scheduler.sync { try self.abort(id) }
            return .json(self.status)
        }
        http.route("POST", "/v1/runs/:run/release") { [unowned self] req in
            let id = try Self.runId(req)
            try self.scheduler.sync { try self.release(id) }
            return .json(["released": id])
        }
    }

    static func runId(_ req: HTTPService.Request) throws -> String {
        let id = req.parameters["run"] ?? ""
        guard SafeName.isValid(id) else { throw HTTPError(.badRequest, "run id \(SafeName.problem(with: id) ?? "is invalid")") }
        return id
    }
}
