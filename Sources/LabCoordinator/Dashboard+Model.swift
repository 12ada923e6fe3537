import Foundation
import HeraldCore
import LabPlan
import Logging

/// The dashboard's pages, live views, studies and summary (Dashboard+Pages, +Live, +Studies,
/// +Summary): read-models over the services, each read when a page or a live view asks. What
/// the dashboard keeps itself (sessions, live strips and series, run log lines, study
/// comparisons, refusals) is `DashboardState`; the runs, agents and dongles are the run
/// controller's, the agent registry's and the dongle service's. Its routes (Dashboard.swift)
/// are the coordinator's HTTP edge, which calls these.
final class Dashboard: Sendable {
    let config: Coordinator.Config
    /// What the dashboard keeps (sessions, strips, series, run log lines, studies, refusals).
    let dashboard: DashboardState
    let runs: RunController
    let registry: AgentRegistry
    let logger: Logger

    init(config: Coordinator.Config, state: DashboardState, runs: RunController, registry: AgentRegistry, logger: Logger) {
        self.config = config
        dashboard = state
        self.runs = runs
        self.registry = registry
        self.logger = logger
    }

    /// The dashboard's time: `Config.clock`'s.
    var now: Double { config.clock.now() }

    /// Runs `body` with the runs, under their lock (`RunController.withLock`).
    func withLock<T>(_ body: (inout RunController.State) throws -> T) rethrows -> T { try runs.withLock(body) }

    func run(_ id: String) -> RunRecord? { runs.run(id) }

    var agentViews: [Coordinator.AgentView] { registry.views }

    func dongleViews(history: Int) -> [LabWire.DongleView] { runs.dongleViews(history: history) }

    var sessionSecure: Bool { config.tls != nil }

    static func dashboardPath(run id: String) -> String { Coordinator.dashboardPath(run: id) }

    /// The files of `DashboardRoutes.runFileNames` this run has now, in that order.
    func runFiles(_ r: RunRecord) -> [String] {
        let report = config.results.appendingPathComponent(r.id).appendingPathComponent("report")
        return Self.runFileNames.map(\.name).filter { name in
            if name == "bundle.tar.gz" { return r.bundle != nil && [.complete, .aborted].contains(r.state) }
            return FileManager.default.fileExists(atPath: report.appendingPathComponent(name).path)
        }
    }

    static var runFileNames: [(name: String, type: String, label: String)] { DashboardRoutes.runFileNames }
    static var runStates: [RunRecord.State] { CoordinatorMetrics.runStates }
    static var infraWindow: Int { CoordinatorMetrics.infraWindow }
}
