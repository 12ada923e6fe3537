import Foundation
import LabHTTP
import LabMetrics
import LabPlan

/// The agent's `GET /metrics`: its node's counters, for the coordinator's credential, the lab
/// token, or the scrape credential (which opens this route only). Brought up to date from the
/// node's status at each scrape; counters run over the agent's life, across runs.
extension Agent {
    func metricsRoute() {
        http.route("GET", "/metrics", allow: [.coordinator, .operator, .scraper]) { [unowned self] _ in
            self.collectMetrics()
            return HTTPResponse(.ok, headers: ["Content-Type": LabMetrics.contentType], body: Data(self.metrics.exposition()))
        }
    }

    func collectMetrics() {
        let s = status
        let m = metrics
        m.gauge("heraldlab_node_running", "1 while this agent's node runs.").record(s.state == .running ? 1 : 0)
        m.gauge("heraldlab_node_peers_detected", "Peers the current (or last) run's node has detected.").record(s.peersDetected)
        m.gauge("heraldlab_node_rssi_rows_last_minute", "RSSI rows the node logged in the last minute.").record(s.rssiLastMinute)
        m.mirror("heraldlab_node_rssi_rows_total", "RSSI rows the agent's nodes logged.", to: Int64(max(0, s.rssiTotal)))
        m.mirror("heraldlab_node_payload_reads_total", "Payloads the agent's nodes read from peers.", to: Int64(max(0, s.payloadsRead)))
        m.mirror("heraldlab_node_radio_recoveries_total", "Times the node's radio recovered its dongle (power-cycle, USB reset).", to: Int64(s.recoveries?.count ?? 0))
        m.gauge("heraldlab_node_log_write_error", "1 while the node's last write to its log files failed (disk full, ...).").record(s.writeError == nil ? 0 : 1)
        m.gauge("heraldlab_agent_runs_held", "Runs this agent holds on disk, not yet released by the coordinator.").record(s.held?.count ?? 0)
    }
}
