import Foundation
import XCTest
import LabHTTP
#if canImport(Glibc)
import Glibc
#endif

/// GET /metrics as a lab's Prometheus reads it: a real Prometheus server (Debian's `prometheus`)
/// scrapes the coordinator and both agents with the scrape credential during a run, and PromQL
/// through its HTTP API gives the run's figures; `promtool check metrics` accepts both outputs;
/// the scrape credential opens /metrics and nothing else.
final class MetricsScrapeTests: XCTestCase {
    var lab: LabProcesses?
    var prometheus: Process?
    override func tearDown() {
        if let p = prometheus, p.isRunning { p.terminate(); p.waitUntilExit() }
        lab?.stopAll(); lab = nil
    }

    static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        return UInt16(bigEndian: a.sin_port)
    }

    func get(_ url: String, token: String?) -> (Int, String) {
        let sem = DispatchSemaphore(value: 0)
        let box = ResultBox<(Int, String)>()
        let u = URL(string: url)!
        let c = LabClient(base: URL(string: "\(u.scheme!)://\(u.host!):\(u.port!)")!, token: token, timeout: 10)
        Task {
            defer { sem.signal() }
            if let (s, d, _) = try? await c.request("GET", u.path + (u.query.map { "?\($0)" } ?? "")) { box.value = (s, String(decoding: d, as: UTF8.self)) }
        }
        sem.wait()
        return box.value ?? (0, "")
    }

    /// A PromQL instant query's single value, if it has one.
    func query(_ port: UInt16, _ promql: String) -> Double? {
        let q = promql.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        let (status, body) = get("http://127.0.0.1:\(port)/api/v1/query?query=\(q)", token: nil)
        guard status == 200, let obj = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
              let data = obj["data"] as? [String: Any], let result = data["result"] as? [[String: Any]], result.count == 1,
              let value = result[0]["value"] as? [Any], value.count == 2, let text = value[1] as? String else { return nil }
        return Double(text)
    }

    /// An instant query's result: how many series, or nil when Prometheus refused the query
    /// (bad PromQL) or did not answer.
    func seriesCount(_ port: UInt16, _ promql: String) -> Int? {
        let q = promql.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        let (status, body) = get("http://127.0.0.1:\(port)/api/v1/query?query=\(q)", token: nil)
        guard status == 200, let obj = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any], obj["status"] as? String == "success",
              let data = obj["data"] as? [String: Any], let result = data["result"] as? [Any] else { return nil }
        return result.count
    }

    func promtoolAccepts(_ text: String) throws -> (Bool, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/promtool")
        p.arguments = ["check", "metrics"]
        let input = Pipe(), output = Pipe()
        p.standardInput = input
        p.standardOutput = output
        p.standardError = output
        try p.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        return (p.terminationStatus == 0, said)
    }

    /// The lab token from $HERALDLAB_TOKEN stays the operator's: the scrape credential comes only
    /// from --scrape-token-file or scrape.token, and one equal to another credential is refused.
    func testTheScrapeCredentialNeverShadowsTheOperators() throws {
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        setenv("HERALDLAB_TOKEN", lab.token, 1)
        defer { unsetenv("HERALDLAB_TOKEN") }
        try lab.start("coordinator", ["coordinator", "--results", lab.results.path])
        XCTAssertEqual(get("\(lab.coordinatorURL)/v1/runs", token: lab.token).0, 200, "the lab token is the operator's")
        XCTAssertEqual(get("\(lab.coordinatorURL)/metrics", token: lab.token).0, 200)
        let (code, said) = try lab.cli(["coordinator", "--token-file", lab.tokenFile.path, "--scrape-token-file", lab.tokenFile.path, "--results", lab.results.path])
        XCTAssertEqual(code, 2, said)
        XCTAssertTrue(said.contains("the scrape credential is the same as the operator's or the lab's token"), said)
    }

    func testPrometheusScrapesTheLabDuringARunAndPromQLGivesItsFigures() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/prometheus"), FileManager.default.isExecutableFile(atPath: "/usr/bin/promtool") else {
            return XCTFail("Debian's prometheus package is needed (make deps installs it)")
        }
        guard FileManager.default.isExecutableFile(atPath: LabProcesses.binary.path) else { throw XCTSkip("build herald-lab first") }
        let lab = try LabProcesses()
        self.lab = lab
        let scrape = lab.dir.appendingPathComponent("scrape.token")
        let scrapeToken = LabToken.generate()
        try scrapeToken.write(to: scrape, atomically: true, encoding: .utf8)
        try lab.startAir()
        try lab.start("coordinator", ["coordinator", "--token-file", lab.tokenFile.path, "--scrape-token-file", scrape.path, "--results", lab.results.path, "--air", lab.airAddress])
        for i in 1...2 {
            try lab.start("agent\(i)", ["agent", "--name", "agent\(i)", "--token-file", lab.tokenFile.path, "--scrape-token-file", scrape.path,
                                        "--data", lab.dir.appendingPathComponent("agent\(i)").path, "--coordinator", lab.coordinatorURL, "--air", lab.airAddress])
        }
        try lab.waitUntil(timeout: 20, "agents registered") { (try? lab.aliveAgents()) == 2 }
        let coordinator = lab.coordinatorURL
        let agents = (1...2).map { "127.0.0.1:\(lab.ports["agent\($0)"]!)" }

        // The scrape credential reads /metrics and nothing else; no credential reads nothing.
        XCTAssertEqual(get("\(coordinator)/metrics", token: scrapeToken).0, 200)
        XCTAssertEqual(get("\(coordinator)/v1/runs", token: scrapeToken).0, 403)
        XCTAssertEqual(get("\(coordinator)/v1/agents", token: scrapeToken).0, 403)
        XCTAssertEqual(get("\(coordinator)/metrics", token: nil).0, 401)
        XCTAssertEqual(get("http://\(agents[0])/metrics", token: scrapeToken).0, 200)
        XCTAssertEqual(get("http://\(agents[0])/v1/status", token: scrapeToken).0, 403)
        XCTAssertEqual(get("http://\(agents[0])/metrics", token: "wrong").0, 401)

        // A real Prometheus, scraping every second with the scrape credential.
        let port = try Self.freePort()
        let config = lab.dir.appendingPathComponent("prometheus.yml")
        try """
        global: {scrape_interval: 1s, evaluation_interval: 1s}
        scrape_configs:
          - job_name: coordinator
            authorization: {credentials_file: \(scrape.path)}
            static_configs: [{targets: ["127.0.0.1:\(lab.ports["coordinator"]!)"]}]
          - job_name: agents
            authorization: {credentials_file: \(scrape.path)}
            static_configs: [{targets: ["\(agents[0])", "\(agents[1])"]}]
        """.write(to: config, atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/prometheus")
        p.arguments = ["--config.file=\(config.path)", "--storage.tsdb.path=\(lab.dir.appendingPathComponent("tsdb").path)",
                       "--web.listen-address=127.0.0.1:\(port)"]
        let log = lab.dir.appendingPathComponent("prometheus.log")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        p.standardOutput = try FileHandle(forWritingTo: log)
        p.standardError = p.standardOutput
        try p.run()
        prometheus = p
        func promLog() -> String { String((try? String(contentsOf: log, encoding: .utf8))?.suffix(2000) ?? "") }
        try lab.waitUntil(timeout: 60, "Prometheus scraping all three targets") { query(port, "count(up == 1)") == 3 }
        XCTAssertEqual(query(port, "heraldlab_agents{state=\"alive\"}"), 2, promLog())
        XCTAssertEqual(query(port, "count(heraldlab_build_info)"), 3)

        // A run: its nodes counted on the agents while it runs, its figures on the coordinator after.
        let id = try lab.submit(LabProcesses.plan("scraped", nodes: 2, duration: "16s"))
        try lab.waitUntil(timeout: 60, "both nodes running, seen by Prometheus") { query(port, "sum(heraldlab_node_running)") == 2 }
        // While it runs (issue 40): the agents' node series name the run, its plan and node; the
        // coordinator's clock offsets name them too; the plan's counters exist, at 0.
        XCTAssertEqual(query(port, "count(heraldlab_node_running{run=\"\(id)\", plan=\"scraped\", node=~\"n.+\", agent=~\"agent.\"} == 1)"), 2, promLog())
        XCTAssertEqual(query(port, "count(heraldlab_node_clock_offset_seconds{run=\"\(id)\", plan=\"scraped\"})"), 2)
        XCTAssertEqual(query(port, "heraldlab_windows_total{plan=\"scraped\"}"), 0, "the plan's series exist from its submission")
        let exposedWhileRunning = [coordinator, "http://\(agents[0])"].map { get("\($0)/metrics", token: scrapeToken).1 }.joined(separator: "\n")
        try lab.waitUntil(timeout: 90, "run \(id) complete") { lab.runRecord(id)?["state"] as? String == "complete" }
        try lab.waitUntil(timeout: 30, "the ended run in Prometheus") { query(port, "heraldlab_run_verdicts_total{verdict=\"pass\"}") == 1 }
        XCTAssertEqual(query(port, "heraldlab_runs_ended_total{result=\"complete\"}"), 1)
        XCTAssertEqual(query(port, "heraldlab_pairs_total{plan=\"scraped\"}"), 2)
        XCTAssertEqual(query(port, "heraldlab_pairs_detected_total{plan=\"scraped\"}"), 2)
        let windows = try XCTUnwrap(query(port, "heraldlab_windows_total{plan=\"scraped\"}"))
        XCTAssertEqual(query(port, "heraldlab_windows_hit_total{plan=\"scraped\"} / heraldlab_windows_total{plan=\"scraped\"}"), 1, "continuity from counts: \(windows) windows")
        XCTAssertGreaterThan(try XCTUnwrap(query(port, "heraldlab_rssi_rows_total{plan=\"scraped\"}")), 0)
        XCTAssertGreaterThan(try XCTUnwrap(query(port, "max_over_time(sum(heraldlab_node_rssi_rows_total)[5m:1s])")), 0, "the agents counted rows while the run was on")
        XCTAssertGreaterThan(try XCTUnwrap(query(port, "heraldlab_gather_bytes_total")), 0)
        XCTAssertEqual(query(port, "heraldlab_run_start_delay_seconds_count"), 1)
        let success = try XCTUnwrap(query(port, "heraldlab_last_nightly_success_timestamp_seconds{plan=\"scraped\"}"))
        XCTAssertEqual(success, Date().timeIntervalSince1970, accuracy: 120)
        // After it (issue 40): the plan's last run as gauges, the actual duration, and the
        // run's own series gone from both sides.
        XCTAssertEqual(query(port, "heraldlab_plan_last_run_passed{plan=\"scraped\"}"), 1)
        XCTAssertEqual(query(port, "heraldlab_plan_last_run_detection_ratio{plan=\"scraped\"}"), 1)
        XCTAssertEqual(query(port, "heraldlab_run_duration_seconds_count"), 1)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(query(port, "heraldlab_run_duration_seconds_sum")), 16, "from the common start to the end, at least the planned 16 s")
        try lab.waitUntil(timeout: 30, "the ended run's series gone") {
            seriesCount(port, "heraldlab_node_clock_offset_seconds") == 0 && seriesCount(port, "heraldlab_node_running{run!=\"\"}") == 0
        }
        XCTAssertEqual(query(port, "sum(heraldlab_node_running)"), 0)
        // The shipped Grafana dashboard: every panel's query is one Prometheus accepts, over
        // series the services export (a renamed family would leave a panel empty).
        let dashboard = LabProcesses.root.appendingPathComponent("packaging/grafana/heraldlab.json")
        let json = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(contentsOf: dashboard)) as? [String: Any])
        let panels = try XCTUnwrap(json["panels"] as? [[String: Any]])
        XCTAssertGreaterThanOrEqual(panels.count, 15)
        // What either service exported during the run or after it.
        let exposed = exposedWhileRunning + [coordinator, "http://\(agents[0])"].map { get("\($0)/metrics", token: scrapeToken).1 }.joined(separator: "\n")
        for panel in panels {
            let title = panel["title"] as? String ?? "?"
            XCTAssertNotNil(panel["gridPos"] as? [String: Any], title)
            for target in try XCTUnwrap(panel["targets"] as? [[String: Any]], title) {
                let expr = try XCTUnwrap(target["expr"] as? String, title)
                XCTAssertNotNil(seriesCount(port, expr), "Prometheus refuses the query of \(title): \(expr)")
                let names = expr.matches(of: /heraldlab_[a-z_]+/).map { String($0.output) }
                    .map { $0.replacingOccurrences(of: "_bucket", with: "") }
                for name in names { XCTAssertTrue(exposed.contains("# TYPE \(name) "), "\(title): \(name) is not exported") }
            }
        }

        // promtool accepts both services' output.
        for target in [coordinator, "http://\(agents[0])"] {
            let (status, text) = get("\(target)/metrics", token: scrapeToken)
            XCTAssertEqual(status, 200)
            let (ok, said) = try promtoolAccepts(text)
            XCTAssertTrue(ok, "promtool check metrics on \(target): \(said)")
        }
    }
}
