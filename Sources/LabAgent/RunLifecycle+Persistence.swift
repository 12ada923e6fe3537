import Foundation
import HeraldCore
import LabHTTP
import LabNode
import LabPlan
import Logging

/// What the agent keeps on disk, per run: `assignment.json` (written once when armed) and
/// `state.json` (every change), both written durably, so that a restarted agent knows each run
/// it holds and resumes the one that was running.
extension RunLifecycle {
    struct PersistedState: Codable {
        var state: LabWire.AgentState
        var startAt: Double?
        var startedAt: Double?
        var resumed: Bool
        var air: LabWire.AirAddress?
        var files: [LabWire.FileInfo]?
        var gaps: [LabWire.Gap]?
        var aliveAt: Double?
        var aborted: Bool?
        var message: String?
        var writeError: String?
        var recoveries: [LabWire.Recovery]?
    }

    /// `persist` where the caller cannot refuse anything: a failure goes into the run's status
    /// (`writeError`) and the agent's log, so the coordinator hears of it.
    func persistOrReport(_ r: ActiveRun) {
        do { try persist(r) } catch {
            r.writeError = "cannot record the run's state: \(error)"
            logger.error("run \(r.id): cannot record its state: \(error)", metadata: metadata(r))
        }
    }

    func persist(_ r: ActiveRun) throws {
        let s = PersistedState(state: r.state, startAt: r.startAt, startedAt: r.startedAt, resumed: r.resumed, air: r.air, files: r.files,
                               gaps: r.gaps, aliveAt: r.aliveAt, aborted: r.aborted, message: r.message, writeError: r.writeError,
                               recoveries: r.recoveries.isEmpty ? nil : r.recoveries)
        // 0600: it holds the node's air ticket.
        try Durable.write(LabJSON.encoder.encode(s), to: r.directory.appendingPathComponent("state.json"), mode: 0o600)
    }

    /// After a restart: every run on disk is held again. A run that has not started is re-armed,
    /// one that was running resumes (with a gap from when the agent was last alive), one whose
    /// end has passed is finished. Folders that are not runs are reported, not deleted.
    func recover() {
        let fm = FileManager.default
        let ids: [String]
        do { ids = try fm.contentsOfDirectory(atPath: runsDirectory.path) } catch {
            logger.error("cannot list the runs kept in \(runsDirectory.path): \(error); none resumed")
            return
        }
        var loaded = [ActiveRun]()
        for id in ids.sorted() where SafeName.isValid(id) {
            let dir = runsDirectory.appendingPathComponent(id)
            do {
                let a = try LabJSON.decoder.decode(NodeAssignment.self, from: Data(contentsOf: dir.appendingPathComponent("assignment.json")))
                let s = try LabJSON.decoder.decode(PersistedState.self, from: Data(contentsOf: dir.appendingPathComponent("state.json")))
                guard a.runId == id else { throw LabRefusal(.failed, "assignment.json names run \(a.runId)") }
                let r = ActiveRun(assignment: a, directory: dir)
                r.state = s.state; r.startAt = s.startAt; r.startedAt = s.startedAt; r.resumed = s.resumed; r.air = s.air
                r.files = s.files ?? []; r.gaps = s.gaps ?? []; r.aliveAt = s.aliveAt; r.aborted = s.aborted ?? false
                r.message = s.message; r.writeError = s.writeError; r.recoveries = s.recoveries ?? []
                loaded.append(r)
            } catch {
                logger.warning("\(dir.path) is not a run this agent can resume (\(error)); left as it is", metadata: ["run": .string(id)])
            }
        }
        // At most one run can be active: the newest; an older one left armed or running is finished now.
        let newest = loaded.filter { $0.state == .armed || $0.state == .running }.max { ($0.startAt ?? .infinity) < ($1.startAt ?? .infinity) }
        for r in loaded {
            runs[r.id] = r
            switch r.state {
            case .finished, .failed, .idle:
                logger.notice("run \(r.id) (\(r.state.rawValue)) kept on disk until it is gathered", metadata: metadata(r))
            case .armed, .running:
                guard r === newest, let startAt = r.startAt else {
                    if r.startAt == nil && r === newest { logger.notice("re-armed for run \(r.id), waiting for the start", metadata: metadata(r)) }
                    else { r.state = .running; finish(r, interrupted: false) }
                    continue
                }
                let end = startAt + r.assignment.duration
                if r.state == .running || now >= startAt {
                    let from = max(r.aliveAt ?? startAt, startAt)
                    let to = min(now, end)
                    if to > from { r.gaps.append(LabWire.Gap(from: from, to: to, reason: "agent restarted")) }
                }
                if now >= end {
                    r.state = .running
                    finish(r, interrupted: false)
                } else if now >= startAt {
                    r.resumed = true
                    r.state = .running
                    persistOrReport(r)
                    arrange(r) // begins at once (start instant passed) and stops at the planned end
                } else {
                    arrange(r)
                    logger.notice("re-armed for run \(r.id), starting in \(Saturating.int(startAt - now)) s", metadata: metadata(r))
                }
            }
        }
    }
}
