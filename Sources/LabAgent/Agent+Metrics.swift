import Foundation
import Hummingbird
import LabHTTP
import LabMetrics
import LabPlan

/// The agent's `GET /metrics`: its node's counters, for the coordinator's credential, the lab
/// token, or the scrape credential (which opens this route only). Brought up to date from the
/// node's status at each scrape; counters run over the agent's life, across runs.
extension Agent {
    func collectMetrics() {
        let s = status
        let m = metrics
        // Every series names its agent; the node's gauges also name the node, run and plan
        // while it runs (the series of a run that ended are removed, not left at their last
        // value). Counters run over the agent's life, across runs: agent only.
        // One family keeps one set of label names (swift-prometheus traps otherwise): idle,
        // node, run and plan are empty, which Prometheus reads as absent.
        let agent = ["agent": config.name]
        var node = agent.merging(["node": "", "run": "", "plan": ""]) { a, _ in a }
        if s.state == .running, let run = s.runId, let name = s.node {
            node["run"] = run
            node["node"] = name
            let lifecycle = self.lifecycle
            node["plan"] = scheduler.sync { lifecycle.runs[run]?.assignment.planName } ?? ""
        }
        let nodeGauges: [(String, String, Double)] = [
            ("heraldlab_node_running", "1 while this agent's node runs.", s.state == .running ? 1 : 0),
            ("heraldlab_node_peers_detected", "Peers the current (or last) run's node has detected.", Double(s.peersDetected)),
            ("heraldlab_node_rssi_rows_last_minute", "RSSI rows the node logged in the last minute.", Double(s.rssiLastMinute)),
            ("heraldlab_node_log_write_error", "1 while the node's last write to its log files failed (disk full, ...).", s.writeError == nil ? 0 : 1),
        ]
        for (name, help, value) in nodeGauges {
            m.gauge(name, help, node).record(value)
            m.pruneGauges(name, keep: [node])
        }
        m.mirror("heraldlab_node_rssi_rows_total", "RSSI rows the agent's nodes logged.", agent, to: Int64(max(0, s.rssiTotal)))
        m.mirror("heraldlab_node_payload_reads_total", "Payloads the agent's nodes read from peers.", agent, to: Int64(max(0, s.payloadsRead)))
        m.mirror("heraldlab_node_radio_recoveries_total", "Times the node's radio recovered its dongle (power-cycle, USB reset).", agent, to: Int64(s.recoveries?.count ?? 0))
        m.gauge("heraldlab_agent_runs_held", "Runs this agent holds on disk, not yet released by the coordinator.", agent).record(s.held?.count ?? 0)
    }
}
