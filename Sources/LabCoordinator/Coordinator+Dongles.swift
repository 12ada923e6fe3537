import Foundation
import HeraldCore
import LabHTTP
import LabLink
import LabPlan
import Logging

/// The lab's dongles: every dongle an agent reports is kept by its address (SQLite), with its
/// health (LAVA's good, bad, maintenance, retired, and unknown) and its history. Pre-flight
/// checks before a run and health checks (on demand, or every `healthCheckEvery`) check
/// dongles together (DongleRules.judge); a dongle that fails `quarantineAfter` checks in a row,
/// or is the outlier of that many runs, is quarantined with the evidence and never selected
/// until the operator releases it.
extension Coordinator {
    /// Every dongle with its agent's liveness, the run it is busy with, and its newest history.
    func dongleViews(history: Int) -> [LabWire.DongleView] {
        let agentStates = Dictionary(agentViews.map { ($0.info.name, $0.state.rawValue) }, uniquingKeysWith: { a, _ in a })
        let busy = withLock { s -> [String: String] in
            var busy = [String: String]()
            for r in s.runs.values where !r.state.isFinal { for n in r.nodes { busy[n.agent] = r.id } }
            return busy
        }
        return dongles.views(history: history, agentStates: agentStates, busy: busy)
    }

    /// The operator sets a dongle's health (`DongleService.setHealth`); its view is returned.
    func setHealth(_ ref: String, _ request: LabWire.HealthRequest) throws -> LabWire.DongleView {
        let r = try dongles.setHealth(ref, request)
        return dongleViews(history: 20).first { $0.id == r.id }!
    }

    /// An agent reports its dongle (`DongleService.note`).
    func noteDongle(_ reported: LabWire.DongleInfo, agent: String) { dongles.note(reported, agent: agent) }

    /// A dongle's history, newest first (`DongleService.history`).
    func dongleHistory(_ key: String, limit: Int) -> [LabWire.DongleEvent] { dongles.history(key, limit: limit) }
}
